package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// Run runs the conformance suite; newStore must return an empty, migrated store.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"CreateRead", testCreateRead},
		{"UpdateKeepsHistory", testUpdateHistory},
		{"DeleteIsGone", testDelete},
		{"ProjectWall", testProjectWall},
		{"ReferencesStayInProject", testReferences},
		{"IfMatch", testIfMatch},
		{"TransactionRollsBack", testTxRollback},
		{"SearchToken", testSearchToken},
		{"SearchString", testSearchString},
		{"SearchDate", testSearchDate},
		{"SearchMembership", testSearchMembership},
		{"SearchPagingAndSort", testSearchPaging},
		{"KeyValueFirstWins", testKeyValue},
		{"ConcurrentUpdates", testConcurrentUpdates},
		{"LockSerialisesCheckThenCreate", testLock},
		{"CreateManyIsOneWrite", testCreateMany},
		{"AnyOfGroups", testAnyOf},
		{"ChangesAnnouncedAtCommit", testChanges},
		{"CountHitIsShared", testCountHit},
		{"HitValueIsKeptWithItsWindow", testHitValue},
		{"SearchReference", testSearchReference},
		{"SearchNumberQuantityURI", testSearchNumberQuantityURI},
		{"SearchSortByParameter", testSearchSortByParameter},
		{"SearchFilterExpressions", testSearchFilterExpressions},
		{"SearchShapesAgree", testSearchShapesAgree},
		{"SearchSingleValuedShapes", testSearchSingleValuedShapes},
		{"TotalsFollowWrites", testTotalsFollowWrites},
		{"SearchComposite", testSearchComposite},
		{"ReplicasAndReadyModules", testReplicas},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
}

func res(t testing.TB, js string) fhir.Resource {
	t.Helper()
	r, err := fhir.ParseResource([]byte(js))
	if err != nil {
		t.Fatalf("parse %s: %v", js, err)
	}
	return r
}

func mustCreate(t testing.TB, s store.Store, project, js string) *store.Record {
	t.Helper()
	rec, err := s.Create(context.Background(), res(t, js), store.Write{Project: project, Author: fhir.Reference{Reference: "ClientApplication/test"}})
	if err != nil {
		t.Fatalf("create %s: %v", js, err)
	}
	return rec
}

func search(t testing.TB, s store.Store, scope store.Scope, typ, query string) *store.SearchResult {
	t.Helper()
	req, err := fhir.ParseSearch(typ, query)
	if err != nil {
		t.Fatalf("parse search %s?%s: %v", typ, query, err)
	}
	out, err := s.Search(context.Background(), scope, req)
	if err != nil {
		t.Fatalf("search %s?%s: %v", typ, query, err)
	}
	return out
}

func ids(r *store.SearchResult) []string {
	var out []string
	for _, rec := range r.Records {
		out = append(out, rec.ID)
	}
	sort.Strings(out)
	return out
}

func expectIDs(t *testing.T, s store.Store, scope store.Scope, typ, query string, want ...string) {
	t.Helper()
	got := ids(search(t, s, scope, typ, query))
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s?%s = %v, want %v", typ, query, got, want)
	}
}

func testCreateRead(t *testing.T, s store.Store) {
	ctx := context.Background()
	rec := mustCreate(t, s, "p1", `{"resourceType":"Patient","name":[{"given":["Ada"],"family":"Lovelace"}],"extension":[{"url":"x","valueDecimal":1.50}]}`)
	if !fhir.ValidID(rec.ID) || rec.VersionID == "" || rec.Project != "p1" {
		t.Fatalf("record = %+v", rec)
	}
	got, err := s.Read(ctx, store.ProjectScope("p1"), "Patient", rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(got.JSON, &body); err != nil {
		t.Fatal(err)
	}
	meta := body["meta"].(map[string]any)
	if body["id"] != rec.ID || meta["versionId"] != rec.VersionID || meta["project"] != "p1" {
		t.Errorf("stored body = %s", got.JSON)
	}
	if a, _ := meta["author"].(map[string]any); a["reference"] != "ClientApplication/test" {
		t.Errorf("meta.author = %v", meta["author"])
	}
	if _, err := time.Parse(fhir.TimeFormat, meta["lastUpdated"].(string)); err != nil {
		t.Errorf("lastUpdated %v: %v", meta["lastUpdated"], err)
	}
	if !strings.Contains(string(got.JSON), `"valueDecimal":1.50`) {
		t.Errorf("numbers must survive as written: %s", got.JSON)
	}
	if _, err := s.Read(ctx, store.ProjectScope("p1"), "Observation", rec.ID); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("read with wrong type: %v, want not-found", err)
	}
	if _, err := s.Read(ctx, store.ProjectScope("p1"), "Patient", "no-such-id"); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("read unknown: %v, want not-found", err)
	}
	if _, err := s.Create(ctx, res(t, `{"resourceType":"Patient"}`), store.Write{Project: "p1", ID: rec.ID}); !fhir.IsCode(err, fhir.EConflict) {
		t.Errorf("create with existing id: %v, want conflict", err)
	}
}

func testUpdateHistory(t *testing.T, s store.Store) {
	ctx := context.Background()
	scope := store.ProjectScope("p1")
	rec := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"female"}`)
	up, err := s.Update(ctx, scope, "Patient", rec.ID, store.Write{}, func(cur fhir.Resource) (fhir.Resource, error) {
		if cur["gender"] != "female" {
			t.Errorf("update sees %v", cur)
		}
		cur["gender"] = "other"
		return cur, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if up.VersionID == rec.VersionID || up.ID != rec.ID {
		t.Fatalf("update record = %+v", up)
	}
	old, err := s.ReadVersion(ctx, scope, "Patient", rec.ID, rec.VersionID)
	if err != nil || !strings.Contains(string(old.JSON), `"female"`) {
		t.Fatalf("old version = %s, %v", old.JSON, err)
	}
	hist, err := s.History(ctx, scope, "Patient", rec.ID, 10, 0)
	if err != nil || len(hist) != 2 || hist[0].VersionID != up.VersionID {
		t.Fatalf("history = %+v, %v", hist, err)
	}
	expectIDs(t, s, scope, "Patient", "gender=other", rec.ID)
	expectIDs(t, s, scope, "Patient", "gender=female")
	wantErr := fhir.Invalid("nope")
	if _, err := s.Update(ctx, scope, "Patient", rec.ID, store.Write{}, func(fhir.Resource) (fhir.Resource, error) { return nil, wantErr }); !errors.Is(err, wantErr) {
		t.Errorf("update fn error = %v", err)
	}
}

func testDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	scope := store.ProjectScope("p1")
	rec := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"male"}`)
	if err := s.Delete(ctx, scope, "Patient", rec.ID, store.Write{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(ctx, scope, "Patient", rec.ID); !fhir.IsCode(err, fhir.EGone) {
		t.Errorf("read after delete: %v, want gone", err)
	}
	if err := s.Delete(ctx, scope, "Patient", rec.ID, store.Write{}); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if _, err := s.Update(ctx, scope, "Patient", rec.ID, store.Write{}, func(c fhir.Resource) (fhir.Resource, error) { return c, nil }); !fhir.IsCode(err, fhir.EGone) {
		t.Errorf("update after delete: %v, want gone", err)
	}
	expectIDs(t, s, scope, "Patient", "gender=male")
	expectIDs(t, s, scope, "Patient", "")
	hist, err := s.History(ctx, scope, "Patient", rec.ID, 10, 0)
	if err != nil || len(hist) != 2 || !hist[0].Deleted {
		t.Errorf("history after delete = %+v, %v", hist, err)
	}
	if _, err := s.ReadVersion(ctx, scope, "Patient", rec.ID, rec.VersionID); err != nil {
		t.Errorf("old version after delete: %v", err)
	}
}

func testProjectWall(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := mustCreate(t, s, "pa", `{"resourceType":"Patient","name":[{"family":"Wall"}]}`)
	b := mustCreate(t, s, "pb", `{"resourceType":"Patient","name":[{"family":"Wall"}]}`)
	if _, err := s.Read(ctx, store.ProjectScope("pb"), "Patient", a.ID); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("cross-project read: %v, want not-found", err)
	}
	if _, err := s.ReadVersion(ctx, store.ProjectScope("pb"), "Patient", a.ID, a.VersionID); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("cross-project vread: %v, want not-found", err)
	}
	if _, err := s.Update(ctx, store.ProjectScope("pb"), "Patient", a.ID, store.Write{}, func(c fhir.Resource) (fhir.Resource, error) { return c, nil }); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("cross-project update: %v, want not-found", err)
	}
	if err := s.Delete(ctx, store.ProjectScope("pb"), "Patient", a.ID, store.Write{}); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("cross-project delete: %v, want not-found", err)
	}
	if _, err := s.History(ctx, store.ProjectScope("pb"), "Patient", a.ID, 10, 0); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("cross-project history: %v, want not-found", err)
	}
	expectIDs(t, s, store.ProjectScope("pa"), "Patient", "name=wall", a.ID)
	expectIDs(t, s, store.ProjectScope("pb"), "Patient", "name=wall", b.ID)
	expectIDs(t, s, store.ProjectScope("pb"), "Patient", "_id="+a.ID)
	expectIDs(t, s, store.AllProjects, "Patient", "name=wall", a.ID, b.ID)
	expectIDs(t, s, store.Scope{}, "Patient", "")
}

func testReferences(t *testing.T, s store.Store) {
	ctx := context.Background()
	org := mustCreate(t, s, "pa", `{"resourceType":"Organization","name":"A"}`)
	foreign := mustCreate(t, s, "pb", `{"resourceType":"Organization","name":"B"}`)
	w := store.Write{Project: "pa", CheckReferences: true}
	if _, err := s.Create(ctx, res(t, `{"resourceType":"Patient","managingOrganization":{"reference":"Organization/`+org.ID+`"}}`), w); err != nil {
		t.Errorf("reference within project: %v", err)
	}
	for _, ref := range []string{"Organization/" + foreign.ID, "Organization/missing", "Patient/" + org.ID} {
		_, err := s.Create(ctx, res(t, `{"resourceType":"Patient","generalPractitioner":[{"reference":"`+ref+`"}]}`), w)
		if !fhir.IsCode(err, fhir.EInvalid) {
			t.Errorf("reference %s: %v, want invalid", ref, err)
		}
	}
	p := mustCreate(t, s, "pa", `{"resourceType":"Patient"}`)
	_, err := s.Update(ctx, store.ProjectScope("pa"), "Patient", p.ID, w, func(c fhir.Resource) (fhir.Resource, error) {
		c["managingOrganization"] = map[string]any{"reference": "Organization/" + foreign.ID}
		return c, nil
	})
	if !fhir.IsCode(err, fhir.EInvalid) {
		t.Errorf("update with foreign reference: %v, want invalid", err)
	}
	if _, err := s.Create(ctx, res(t, `{"resourceType":"Patient","link":[{"other":{"reference":"https://example.com/Patient/1"}},{"other":{"reference":"#contained"}}]}`), w); err != nil {
		t.Errorf("absolute and contained references are not checked: %v", err)
	}
}

func testIfMatch(t *testing.T, s store.Store) {
	ctx := context.Background()
	scope := store.ProjectScope("p1")
	rec := mustCreate(t, s, "p1", `{"resourceType":"Patient"}`)
	same := func(c fhir.Resource) (fhir.Resource, error) { return c, nil }
	if _, err := s.Update(ctx, scope, "Patient", rec.ID, store.Write{IfMatch: "stale"}, same); !fhir.IsCode(err, fhir.EPrecondition) {
		t.Errorf("stale If-Match: %v", err)
	}
	if _, err := s.Update(ctx, scope, "Patient", rec.ID, store.Write{IfMatch: rec.VersionID}, same); err != nil {
		t.Errorf("current If-Match: %v", err)
	}
}

func testTxRollback(t *testing.T, s store.Store) {
	ctx := context.Background()
	boom := errors.New("boom")
	var created string
	err := s.InTx(ctx, func(tx store.Store) error {
		rec, err := tx.Create(ctx, res(t, `{"resourceType":"Patient","gender":"unknown"}`), store.Write{Project: "p1"})
		if err != nil {
			return err
		}
		created = rec.ID
		if _, err := tx.Create(ctx, res(t, `{"resourceType":"Practitioner"}`), store.Write{Project: "p1"}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx = %v", err)
	}
	if _, err := s.Read(ctx, store.AllProjects, "Patient", created); !fhir.IsCode(err, fhir.ENotFound) {
		t.Errorf("rolled-back create is readable: %v", err)
	}
	expectIDs(t, s, store.AllProjects, "Patient", "gender=unknown")
	expectIDs(t, s, store.AllProjects, "Practitioner", "")
}

func testSearchToken(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	a := mustCreate(t, s, "p1", `{"resourceType":"Patient","identifier":[{"system":"http://mrn","value":"123"}],"telecom":[{"system":"email","value":"ada@example.com"}],"active":true}`)
	b := mustCreate(t, s, "p1", `{"resourceType":"Patient","identifier":[{"system":"http://other","value":"123"}],"active":false}`)
	c := mustCreate(t, s, "p1", `{"resourceType":"Patient"}`)
	expectIDs(t, s, sc, "Patient", "identifier=123", a.ID, b.ID)
	expectIDs(t, s, sc, "Patient", "identifier=http://mrn|123", a.ID)
	expectIDs(t, s, sc, "Patient", "identifier=http%3A%2F%2Fmrn%7C123", a.ID)
	expectIDs(t, s, sc, "Patient", "identifier=http://other|", b.ID)
	expectIDs(t, s, sc, "Patient", "identifier:not=http://mrn|123", b.ID, c.ID)
	expectIDs(t, s, sc, "Patient", "identifier:missing=true", c.ID)
	expectIDs(t, s, sc, "Patient", "email=ada@example.com", a.ID)
	expectIDs(t, s, sc, "Patient", "active=true", a.ID)
	expectIDs(t, s, sc, "Patient", "active=false", b.ID)
	expectIDs(t, s, sc, "Patient", "_id="+a.ID+","+c.ID, a.ID, c.ID)
	expectIDs(t, s, sc, "Patient", "_id:not="+a.ID, b.ID, c.ID)
	expectIDs(t, s, sc, "Patient", "identifier=123&active=false", b.ID)
}

func testSearchString(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	a := mustCreate(t, s, "p1", `{"resourceType":"Patient","name":[{"given":["Ada"],"family":"Lovelace"}]}`)
	b := mustCreate(t, s, "p1", `{"resourceType":"Patient","name":[{"given":["Adam"],"family":"Smith"}]}`)
	c := mustCreate(t, s, "p1", `{"resourceType":"Patient","name":[{"text":"Ölaf Ünter"}]}`)
	expectIDs(t, s, sc, "Patient", "name=ada", a.ID, b.ID)
	expectIDs(t, s, sc, "Patient", "name=ADA", a.ID, b.ID)
	expectIDs(t, s, sc, "Patient", "name:exact=Ada", a.ID)
	expectIDs(t, s, sc, "Patient", "name:exact=ada")
	expectIDs(t, s, sc, "Patient", "name=love", a.ID)
	expectIDs(t, s, sc, "Patient", "name:contains=ela", a.ID)
	expectIDs(t, s, sc, "Patient", "name=smith,lovelace", a.ID, b.ID)
	expectIDs(t, s, sc, "Patient", "family=smith", b.ID)
	expectIDs(t, s, sc, "Patient", "given=adam", b.ID)
	expectIDs(t, s, sc, "Patient", "name=%C3%B6laf", c.ID)
	expectIDs(t, s, sc, "Patient", "name=%25")
	bot := mustCreate(t, s, "p1", `{"resourceType":"Bot","name":"Echo bot","identifier":[{"system":"https://example.com/bots","value":"echo"}]}`)
	expectIDs(t, s, sc, "Bot", "name=echo", bot.ID)
	expectIDs(t, s, sc, "Bot", "identifier=https://example.com/bots|echo", bot.ID)
}

func testSearchDate(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	a := mustCreate(t, s, "p1", `{"resourceType":"Patient","birthDate":"1990-05-17"}`)
	b := mustCreate(t, s, "p1", `{"resourceType":"Patient","birthDate":"2001"}`)
	expectIDs(t, s, sc, "Patient", "birthdate=1990-05-17", a.ID)
	expectIDs(t, s, sc, "Patient", "birthdate=1990", a.ID)
	expectIDs(t, s, sc, "Patient", "birthdate=gt1995-01-01", b.ID)
	expectIDs(t, s, sc, "Patient", "birthdate=lt1995-01-01", a.ID)
	expectIDs(t, s, sc, "Patient", "birthdate=ge1990-05-17", a.ID, b.ID)
	expectIDs(t, s, sc, "Patient", "birthdate=le1990-05-17", a.ID)
	expectIDs(t, s, sc, "Patient", "birthdate=ne1990-05-17", b.ID)
	ev := mustCreate(t, s, "p1", `{"resourceType":"AuditEvent","recorded":"2024-03-01T10:00:00.000Z","outcome":"0","type":{"system":"https://medplum.com/CodeSystem/audit-event","code":"execute"},"entity":[{"what":{"reference":"Bot/b1"}}]}`)
	expectIDs(t, s, sc, "AuditEvent", "date=ge2024-03-01T09:00:00Z&date=lt2024-03-01T11:00:00Z", ev.ID)
	expectIDs(t, s, sc, "AuditEvent", "date=gt2024-03-01T10:00:00.000Z")
	expectIDs(t, s, sc, "AuditEvent", "entity=Bot/b1&outcome=0&type=execute", ev.ID)
	expectIDs(t, s, sc, "AuditEvent", "type=https://medplum.com/CodeSystem/audit-event|execute", ev.ID)
	// _lastUpdated compares with the server's own clock.
	expectIDs(t, s, sc, "Patient", "_lastUpdated=gt2000-01-01", a.ID, b.ID)
	expectIDs(t, s, sc, "Patient", "_lastUpdated=lt2000-01-01")
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	expectIDs(t, s, sc, "Patient", "_lastUpdated=le"+strings.ReplaceAll(future, "+", "%2B"), a.ID, b.ID)
}

func testSearchMembership(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	mk := func(profile string, extra string) string {
		return mustCreate(t, s, "p1", fmt.Sprintf(`{"resourceType":"ProjectMembership","project":{"reference":"Project/p1"},"user":{"reference":"User/u"},"profile":{"reference":"%s"}%s}`, profile, extra)).ID
	}
	pat := mk("Patient/1", `,"externalId":"ext-1","userName":"pat.one"`)
	prac := mk("Practitioner/2", `,"admin":true,"accessPolicy":{"reference":"AccessPolicy/ap1"}`)
	rel := mk("RelatedPerson/3", `,"active":false,"access":[{"policy":{"reference":"AccessPolicy/ap2"}}]`)
	client := mk("ClientApplication/4", "")
	bot := mk("Bot/5", "")
	expectIDs(t, s, sc, "ProjectMembership", "", pat, prac, rel, client, bot)
	expectIDs(t, s, sc, "ProjectMembership", "profile-type=Patient", pat)
	expectIDs(t, s, sc, "ProjectMembership", "profile-type=Practitioner", prac)
	expectIDs(t, s, sc, "ProjectMembership", "profile-type:not=ClientApplication,Bot", pat, prac, rel)
	expectIDs(t, s, sc, "ProjectMembership", "profile-type%3Anot=ClientApplication%2CBot", pat, prac, rel)
	expectIDs(t, s, sc, "ProjectMembership", "admin=true", prac)
	expectIDs(t, s, sc, "ProjectMembership", "active=false", rel)
	expectIDs(t, s, sc, "ProjectMembership", "external-id=ext-1", pat)
	expectIDs(t, s, sc, "ProjectMembership", "user-name=pat", pat)
	expectIDs(t, s, sc, "ProjectMembership", "access-policy=AccessPolicy/ap1,AccessPolicy/ap2", prac, rel)
	expectIDs(t, s, sc, "ProjectMembership", "profile=Practitioner/2", prac)
	expectIDs(t, s, sc, "ProjectMembership", "user=User/u&project=Project/p1&profile-type=Bot", bot)
}

func testSearchPaging(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	var all []string
	for i := 0; i < 7; i++ {
		all = append(all, mustCreate(t, s, "p1", `{"resourceType":"Practitioner","name":[{"family":"Page"}]}`).ID)
	}
	var seen []string
	for off := 0; off < 10; off += 3 {
		r := search(t, s, sc, "Practitioner", fmt.Sprintf("_count=3&_offset=%d&_sort=_lastUpdated", off))
		for _, rec := range r.Records {
			seen = append(seen, rec.ID)
		}
		if want := off+3 < 7; r.More != want {
			t.Errorf("offset %d: More = %v, want %v", off, r.More, want)
		}
	}
	if strings.Join(seen, ",") != strings.Join(all, ",") {
		t.Errorf("ascending pages = %v, want creation order %v", seen, all)
	}
	desc := search(t, s, sc, "Practitioner", "_sort=-_lastUpdated&_count=1")
	if len(desc.Records) != 1 || desc.Records[0].ID != all[6] {
		t.Errorf("-_lastUpdated first = %+v, want %s", desc.Records, all[6])
	}
	tot := search(t, s, sc, "Practitioner", "_total=accurate&_count=0")
	if tot.Total == nil || *tot.Total != 7 || len(tot.Records) != 0 {
		t.Errorf("_total=accurate&_count=0: total %v, %d records", tot.Total, len(tot.Records))
	}
	if r := search(t, s, sc, "Practitioner", ""); r.Total != nil {
		t.Errorf("total without _total = %d", *r.Total)
	}
}

func testKeyValue(t *testing.T, s store.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	got := make([]string, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := s.KeyValue(ctx, "signing-key", func() (string, error) { return fmt.Sprintf("v%d", i), nil })
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		}()
	}
	wg.Wait()
	for _, v := range got {
		if v != got[0] || v == "" {
			t.Fatalf("replicas disagree on the key: %v", got)
		}
	}
}

func testConcurrentUpdates(t *testing.T, s store.Store) {
	ctx := context.Background()
	rec := mustCreate(t, s, "p1", `{"resourceType":"Basic","extension":[]}`)
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Update(ctx, store.ProjectScope("p1"), "Basic", rec.ID, store.Write{}, func(c fhir.Resource) (fhir.Resource, error) {
				ext, _ := c["extension"].([]any)
				c["extension"] = append(ext, map[string]any{"url": "n", "valueInteger": i})
				return c, nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, err := s.Read(ctx, store.ProjectScope("p1"), "Basic", rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := got.Resource()
	if n := len(r["extension"].([]any)); n != 10 {
		t.Errorf("read-modify-write lost updates: %d of 10 survived", n)
	}
}

func testLock(t *testing.T, s store.Store) {
	ctx := context.Background()
	// Ten transactions each look for a User by e-mail and create it when
	// absent; under the lock exactly one creates it.
	createUnderLock(t, s, "same@example.com", func(int) []string { return []string{"user-email:same@example.com"} })
	if err := s.Lock(ctx, "x"); err == nil {
		t.Error("Lock outside a transaction must fail")
	}
	// Several keys at once, named in any order and repeated: transactions
	// whose keys overlap run one after the other, and never deadlock.
	createUnderLock(t, s, "multi@example.com", func(i int) []string {
		if i%2 == 1 {
			return []string{"email:m2@example.com", "email:m1@example.com"}
		}
		return []string{"email:m1@example.com", "email:m2@example.com", "email:m1@example.com"}
	})
}

// createUnderLock runs ten transactions at once that each take the locks
// keys(i) names, look for the User of email and create it when absent, and
// checks that exactly one was created.
func createUnderLock(t *testing.T, s store.Store, email string, keys func(i int) []string) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.InTx(ctx, func(tx store.Store) error {
				if err := tx.Lock(ctx, keys(i)...); err != nil {
					return err
				}
				req, _ := fhir.ParseSearch("User", "email="+email)
				found, err := tx.Search(ctx, store.AllProjects, req)
				if err != nil || len(found.Records) > 0 {
					return err
				}
				_, err = tx.Create(ctx, res(t, `{"resourceType":"User","email":"`+email+`","firstName":"A","lastName":"B"}`), store.Write{Project: "p1"})
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := len(search(t, s, store.AllProjects, "User", "email="+email).Records); n != 1 {
		t.Errorf("%d Users with e-mail %s created, want 1", n, email)
	}
}

func testCreateMany(t *testing.T, s store.Store) {
	ctx := context.Background()
	var list []fhir.Resource
	for i := 0; i < 1200; i++ { // more rows than one statement's parameter limit allows
		list = append(list, res(t, fmt.Sprintf(`{"resourceType":"AuditEvent","recorded":"2024-01-01T00:00:%02d.000Z","outcome":"0","entity":[{"what":{"reference":"Bot/many"}}],"type":{"code":"execute"}}`, i%60)))
	}
	if err := s.CreateMany(ctx, list, store.Write{Project: "p1", Author: fhir.Reference{Reference: "system"}}); err != nil {
		t.Fatal(err)
	}
	got := search(t, s, store.ProjectScope("p1"), "AuditEvent", "entity=Bot/many&_total=accurate&_count=1")
	if got.Total == nil || *got.Total != 1200 {
		t.Fatalf("searchable events: %v", got.Total)
	}
	rec, err := s.Read(ctx, store.ProjectScope("p1"), "AuditEvent", list[7].ID())
	if err != nil || !strings.Contains(string(rec.JSON), `"versionId"`) {
		t.Fatalf("read back: %v %s", err, rec.JSON)
	}
	if h, err := s.History(ctx, store.ProjectScope("p1"), "AuditEvent", list[7].ID(), 5, 0); err != nil || len(h) != 1 {
		t.Errorf("history: %d %v", len(h), err)
	}
	expectIDs(t, s, store.ProjectScope("p1"), "AuditEvent", "date=2024-01-01T00:00:07Z&entity=Bot/many&_count=100", idsOfSecond(list, 7)...)
	// All or nothing: a failing batch leaves no row.
	bad := []fhir.Resource{res(t, `{"resourceType":"Basic","code":{"text":"ok"}}`), res(t, `{"resourceType":"Basic","subject":{"reference":"Patient/missing"}}`)}
	if err := s.CreateMany(ctx, bad, store.Write{Project: "p2", CheckReferences: true}); !fhir.IsCode(err, fhir.EInvalid) {
		t.Errorf("bad batch: %v", err)
	}
	expectIDs(t, s, store.ProjectScope("p2"), "Basic", "")
	// A resource that carries an id keeps it; an id already taken fails the
	// batch (the audit journal's replay relies on both).
	kept := []fhir.Resource{res(t, `{"resourceType":"Basic","id":"0193a2b4-5c6d-7e8f-9a0b-c1d2e3f4a5b6","code":{"text":"kept"}}`)}
	if err := s.CreateMany(ctx, kept, store.Write{Project: "p3"}); err != nil {
		t.Fatal(err)
	}
	expectIDs(t, s, store.ProjectScope("p3"), "Basic", "", "0193a2b4-5c6d-7e8f-9a0b-c1d2e3f4a5b6")
	again := []fhir.Resource{res(t, `{"resourceType":"Basic","id":"0193a2b4-5c6d-7e8f-9a0b-c1d2e3f4a5b6","code":{"text":"again"}}`)}
	if err := s.CreateMany(ctx, again, store.Write{Project: "p3"}); !fhir.IsCode(err, fhir.EConflict) {
		t.Errorf("an id taken twice: %v", err)
	}
}

func idsOfSecond(list []fhir.Resource, second int) []string {
	var out []string
	for i, r := range list {
		if i%60 == second {
			out = append(out, r.ID())
		}
	}
	return out
}

func testAnyOf(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	a := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"female","active":true}`)
	b := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"male","active":true}`)
	c := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"male","active":false}`)
	group := func(q string) []fhir.Filter {
		req, err := fhir.ParseSearch("Patient", q)
		if err != nil {
			t.Fatal(err)
		}
		return req.Filters
	}
	run := func(query string, anyOf ...[]fhir.Filter) []string {
		req, _ := fhir.ParseSearch("Patient", query)
		req.AnyOf = anyOf
		res, err := s.Search(context.Background(), sc, req)
		if err != nil {
			t.Fatal(err)
		}
		return ids(res)
	}
	want := func(got []string, ids ...string) {
		t.Helper()
		sort.Strings(ids)
		if strings.Join(got, ",") != strings.Join(ids, ",") {
			t.Errorf("got %v, want %v", got, ids)
		}
	}
	// (female) OR (male AND inactive)
	want(run("", group("gender=female"), group("gender=male&active=false")), a.ID, c.ID)
	// ANDed with the query's own filters.
	want(run("active=true", group("gender=female"), group("gender=male&active=false")), a.ID)
	// A group without filters lets everything through.
	want(run("", group("gender=female"), nil), a.ID, b.ID, c.ID)
}

// changeLog collects what a subscription delivers.
type changeLog struct {
	mu  sync.Mutex
	got []store.Change
}

func (l *changeLog) add(cs []store.Change) {
	l.mu.Lock()
	l.got = append(l.got, cs...)
	l.mu.Unlock()
}

// has reports whether a change of typ/id was delivered.
func (l *changeLog) has(typ, id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.got {
		if c.ResourceType == typ && c.ID == id {
			return true
		}
	}
	return false
}

func testChanges(t *testing.T, s store.Store) {
	ctx := context.Background()
	var log changeLog
	stop := s.Subscribe(log.add)
	defer stop()
	bot := mustCreate(t, s, "p1", `{"resourceType":"Bot","name":"a"}`)
	pat := mustCreate(t, s, "p1", `{"resourceType":"Patient"}`)
	if log.has("Bot", bot.ID) {
		t.Error("a creation was announced")
	}
	rename := func(c fhir.Resource) (fhir.Resource, error) { c["name"] = "b"; return c, nil }
	if _, err := s.Update(ctx, store.AllProjects, "Bot", bot.ID, store.Write{}, rename); err != nil {
		t.Fatal(err)
	}
	// Delivered to this process before the write returned.
	if !log.has("Bot", bot.ID) {
		t.Fatalf("update of a Bot not announced by the time Update returned: %+v", log.got)
	}
	log.mu.Lock()
	c := log.got[0]
	log.mu.Unlock()
	if c.Project != "p1" || c.Seq <= 0 {
		t.Errorf("change = %+v", c)
	}
	if _, err := s.Update(ctx, store.AllProjects, "Patient", pat.ID, store.Write{}, func(c fhir.Resource) (fhir.Resource, error) { return c, nil }); err != nil {
		t.Fatal(err)
	}
	if log.has("Patient", pat.ID) {
		t.Error("a Patient update was announced (not a change type)")
	}
	// A rolled-back transaction announces nothing; a committed one all of
	// its changes, numbered in order.
	pol := mustCreate(t, s, "p1", `{"resourceType":"AccessPolicy","name":"x"}`)
	mem := mustCreate(t, s, "p1", `{"resourceType":"ProjectMembership","user":{"reference":"User/u"}}`)
	boom := errors.New("boom")
	err := s.InTx(ctx, func(tx store.Store) error {
		if err := tx.Delete(ctx, store.AllProjects, "AccessPolicy", pol.ID, store.Write{}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || log.has("AccessPolicy", pol.ID) {
		t.Fatalf("rolled back: err %v, announced %v", err, log.has("AccessPolicy", pol.ID))
	}
	if err := s.InTx(ctx, func(tx store.Store) error {
		if err := tx.Delete(ctx, store.AllProjects, "AccessPolicy", pol.ID, store.Write{}); err != nil {
			return err
		}
		return tx.Delete(ctx, store.AllProjects, "ProjectMembership", mem.ID, store.Write{})
	}); err != nil {
		t.Fatal(err)
	}
	if !log.has("AccessPolicy", pol.ID) || !log.has("ProjectMembership", mem.ID) {
		t.Fatalf("deletions not announced: %+v", log.got)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	seqs := map[int64]bool{}
	for _, c := range log.got {
		seqs[c.Seq] = true
	}
	for i := c.Seq; i < c.Seq+3; i++ {
		if !seqs[i] {
			t.Errorf("sequence numbers are not consecutive from %d: %+v", c.Seq, log.got)
		}
	}
}

// testHitValue: a value kept with a window is returned by the window's next
// hits, in the transaction that kept it and outside; it is replaced only
// if it is still the one expected; a window that ended takes no value and
// its successor begins with none.
func testHitValue(t *testing.T, s store.Store) {
	ctx := context.Background()
	if n, _, v, err := s.CountHitValue(ctx, "k", 80*time.Millisecond); err != nil || n != 1 || v != "" {
		t.Fatalf("first hit: %d %q %v", n, v, err)
	}
	err := s.InTx(ctx, func(tx store.Store) error {
		if ok, err := tx.SetHitValue(ctx, "k", "", "task 1"); err != nil || !ok {
			t.Errorf("set: %v %v", ok, err)
		}
		if n, _, v, err := tx.CountHitValue(ctx, "k", 80*time.Millisecond); err != nil || n != 2 || v != "task 1" {
			t.Errorf("in the transaction: %d %q %v", n, v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.SetHitValue(ctx, "k", "task 2", "answer 2"); err != nil || ok {
		t.Errorf("set over another value: %v %v", ok, err)
	}
	if ok, err := s.SetHitValue(ctx, "k", "task 1", "answer 1"); err != nil || !ok {
		t.Errorf("set over the value expected: %v %v", ok, err)
	}
	if n, _, v, err := s.CountHitValue(ctx, "k", 80*time.Millisecond); err != nil || n != 3 || v != "answer 1" {
		t.Errorf("third hit: %d %q %v", n, v, err)
	}
	if n, _, err := s.CountHit(ctx, "k", 80*time.Millisecond); err != nil || n != 4 {
		t.Errorf("CountHit of a key with a value: %d %v", n, err)
	}
	if ok, err := s.SetHitValue(ctx, "never counted", "", "x"); err != nil || ok {
		t.Errorf("set on no window: %v %v", ok, err)
	}
	time.Sleep(100 * time.Millisecond)
	if ok, err := s.SetHitValue(ctx, "k", "answer 1", "late"); err != nil || ok {
		t.Errorf("set on an ended window: %v %v", ok, err)
	}
	if n, _, v, err := s.CountHitValue(ctx, "k", 80*time.Millisecond); err != nil || n != 1 || v != "" {
		t.Errorf("first hit of the next window: %d %q %v", n, v, err)
	}
}

func testCountHit(t *testing.T, s store.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int64]bool{}
	before := time.Now()
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, ends, err := s.CountHit(ctx, "10.0.0.1", time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			if ends.Before(before.Add(time.Minute-time.Second)) || ends.After(time.Now().Add(time.Minute+time.Second)) {
				t.Errorf("window ends at %v", ends)
			}
			mu.Lock()
			seen[n] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i := int64(1); i <= 20; i++ {
		if !seen[i] {
			t.Fatalf("20 concurrent hits did not count 1..20: %v", seen)
		}
	}
	if n, _, err := s.CountHit(ctx, "10.0.0.2", time.Minute); err != nil || n != 1 {
		t.Errorf("another key: %d, %v", n, err)
	}
	// A window that ended starts again from one.
	if n, _, err := s.CountHit(ctx, "10.0.0.3", 50*time.Millisecond); err != nil || n != 1 {
		t.Fatalf("first hit: %d, %v", n, err)
	}
	if n, _, err := s.CountHit(ctx, "10.0.0.3", 50*time.Millisecond); err != nil || n != 2 {
		t.Fatalf("second hit in the window: %d, %v", n, err)
	}
	time.Sleep(60 * time.Millisecond)
	if n, _, err := s.CountHit(ctx, "10.0.0.3", 50*time.Millisecond); err != nil || n != 1 {
		t.Errorf("first hit of the next window: %d, %v", n, err)
	}
}

func testReplicas(t *testing.T, s store.Store) {
	r, ok := s.(store.Replicas)
	if !ok {
		t.Skip("the store keeps no replicas")
	}
	ctx := context.Background()
	now := time.Now()
	long := now.Add(-time.Hour)
	for _, id := range []string{"b", "a", "old"} {
		at := now
		if id == "old" {
			at = now.Add(-time.Minute)
		}
		if err := r.ReplicaAlive(ctx, id, at, long); err != nil {
			t.Fatal(err)
		}
	}
	// Seen again: one row, the newer time.
	if err := r.ReplicaAlive(ctx, "old", now.Add(-30*time.Second), long); err != nil {
		t.Fatal(err)
	}
	live, err := r.LiveReplicas(ctx, now.Add(-10*time.Second))
	if err != nil || strings.Join(live, ",") != "a,b" {
		t.Fatalf("live = %v, %v; want a,b", live, err)
	}
	if live, _ := r.LiveReplicas(ctx, now.Add(-40*time.Second)); strings.Join(live, ",") != "a,b,old" {
		t.Fatalf("live in the last 40 s = %v, want a,b,old", live)
	}
	for _, id := range []string{"a", "old", "a"} {
		if err := r.ModuleReady(ctx, id, "h1", now); err != nil {
			t.Fatal(err)
		}
	}
	if ready, err := r.ModuleReadyOn(ctx, "h1"); err != nil || strings.Join(ready, ",") != "a,old" {
		t.Fatalf("ready on = %v, %v; want a,old", ready, err)
	}
	if ready, _ := r.ModuleReadyOn(ctx, "h2"); len(ready) != 0 {
		t.Fatalf("h2 ready on %v, want none", ready)
	}
	// A beat forgets the replicas not seen for long, and their modules.
	if err := r.ReplicaAlive(ctx, "b", now, now.Add(-10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if live, _ := r.LiveReplicas(ctx, time.Time{}); strings.Join(live, ",") != "a,b" {
		t.Fatalf("after forgetting: live = %v, want a,b", live)
	}
	if ready, _ := r.ModuleReadyOn(ctx, "h1"); strings.Join(ready, ",") != "a" {
		t.Fatalf("after forgetting: h1 ready on %v, want a", ready)
	}
	if err := r.ReplicaGone(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if live, _ := r.LiveReplicas(ctx, time.Time{}); strings.Join(live, ",") != "b" {
		t.Fatalf("after a left: live = %v, want b", live)
	}
	if ready, _ := r.ModuleReadyOn(ctx, "h1"); len(ready) != 0 {
		t.Fatalf("after a left: h1 ready on %v, want none", ready)
	}
	// Changes seen: only forward; behind are the live others that have
	// not seen the change.
	for _, id := range []string{"c", "d", "stale"} {
		at := now
		if id == "stale" {
			at = now.Add(-time.Minute)
		}
		if err := r.ReplicaAlive(ctx, id, at, long); err != nil {
			t.Fatal(err)
		}
	}
	for _, seen := range []struct {
		id  string
		seq int64
	}{{"b", 7}, {"c", 9}, {"c", 3}, {"nobody", 50}} {
		if err := r.ReplicaSawChanges(ctx, seen.id, seen.seq); err != nil {
			t.Fatal(err)
		}
	}
	recent := now.Add(-10 * time.Second)
	for _, c := range []struct {
		except string
		seq    int64
		want   string
	}{{"", 7, "d"}, {"", 8, "b,d"}, {"d", 9, "b"}, {"b", 10, "c,d"}, {"", 1, "d"}} {
		if behind, err := r.ReplicasBehind(ctx, c.except, c.seq, recent); err != nil || strings.Join(behind, ",") != c.want {
			t.Fatalf("behind change %d (but %q) = %v, %v; want %s", c.seq, c.except, behind, err, c.want)
		}
	}
}
