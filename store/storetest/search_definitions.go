package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// The contract of the search parameters generated from the FHIR
// definitions: every parameter type, modifiers, chains, _sort on any
// parameter, _filter, and the search shapes the store picks (one token
// value streamed in _lastUpdated order, a rare value collected, a walk)
// giving the same answers.

// expectOrder checks the ids a search returns, in order.
func expectOrder(t *testing.T, s store.Store, scope store.Scope, typ, query string, want ...string) {
	t.Helper()
	var got []string
	for _, rec := range search(t, s, scope, typ, query).Records {
		got = append(got, rec.ID)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s?%s = %v, want %v (in order)", typ, query, got, want)
	}
}

func expectTotal(t *testing.T, s store.Store, scope store.Scope, typ, query string, want int) {
	t.Helper()
	r := search(t, s, scope, typ, query+"&_total=accurate")
	if r.Total == nil || *r.Total != want {
		t.Errorf("%s?%s: total %v, want %d", typ, query, r.Total, want)
	}
}

func testSearchReference(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	ada := mustCreate(t, s, "p1", `{"resourceType":"Patient","name":[{"family":"Lovelace","given":["Ada"]}]}`)
	bob := mustCreate(t, s, "p1", `{"resourceType":"Patient","name":[{"family":"Babbage"}]}`)
	grp := mustCreate(t, s, "p1", `{"resourceType":"Group","type":"person","actual":true}`)
	o1 := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"text":"x"},"subject":{"reference":"Patient/`+ada.ID+`"}}`)
	o2 := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"text":"x"},"subject":{"reference":"Group/`+grp.ID+`"}}`)
	o3 := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"text":"x"},"subject":{"reference":"Patient/`+bob.ID+`"}}`)
	o4 := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"text":"x"}}`)
	expectIDs(t, s, sc, "Observation", "subject=Patient/"+ada.ID, o1.ID)
	expectIDs(t, s, sc, "Observation", "subject="+ada.ID, o1.ID)
	expectIDs(t, s, sc, "Observation", "subject:Patient="+ada.ID, o1.ID)
	expectIDs(t, s, sc, "Observation", "subject:Group="+ada.ID)
	expectIDs(t, s, sc, "Observation", "subject:Patient=Group/"+grp.ID)
	expectIDs(t, s, sc, "Observation", "patient=Patient/"+ada.ID+",Patient/"+bob.ID, o1.ID, o3.ID)
	expectIDs(t, s, sc, "Observation", "patient=Group/"+grp.ID) // patient only holds Patient subjects
	expectIDs(t, s, sc, "Observation", "subject=Group/"+grp.ID, o2.ID)
	expectIDs(t, s, sc, "Observation", "subject:missing=true", o4.ID)
	expectIDs(t, s, sc, "Observation", "subject:not=Patient/"+ada.ID, o2.ID, o3.ID, o4.ID)
	expectIDs(t, s, sc, "Observation", "subject:Patient.name=love", o1.ID)
	expectIDs(t, s, sc, "Observation", "patient.name=babb,love", o1.ID, o3.ID)
	expectIDs(t, s, sc, "Observation", "patient.family:exact=Babbage", o3.ID)
	expectIDs(t, s, sc, "Observation", "subject:Group.actual=true", o2.ID)
	// A chain stays within the caller's projects.
	other := mustCreate(t, s, "p2", `{"resourceType":"Patient","name":[{"family":"Lovelace"}]}`)
	mustCreate(t, s, "p2", `{"resourceType":"Observation","status":"final","code":{"text":"x"},"subject":{"reference":"Patient/`+other.ID+`"}}`)
	expectIDs(t, s, sc, "Observation", "patient.name=love", o1.ID)

	// The subject/patient parameters the web app uses on other types.
	for _, typ := range []string{"ServiceRequest", "DiagnosticReport", "Media", "DeviceRequest"} {
		extra := map[string]string{
			"ServiceRequest":   `"status":"active","intent":"order"`,
			"DiagnosticReport": `"status":"final","code":{"text":"x"}`,
			"Media":            `"status":"completed","content":{"url":"x"}`,
			"DeviceRequest":    `"status":"active","intent":"order","codeCodeableConcept":{"text":"x"}`,
		}[typ]
		r := mustCreate(t, s, "p1", `{"resourceType":"`+typ+`",`+extra+`,"subject":{"reference":"Patient/`+ada.ID+`"}}`)
		expectIDs(t, s, sc, typ, "subject=Patient/"+ada.ID, r.ID)
		expectIDs(t, s, sc, typ, "patient=Patient/"+ada.ID, r.ID)
		expectIDs(t, s, sc, typ, "patient="+bob.ID)
	}
	dev := mustCreate(t, s, "p1", `{"resourceType":"Device","patient":{"reference":"Patient/`+ada.ID+`"}}`)
	expectIDs(t, s, sc, "Device", "patient=Patient/"+ada.ID, dev.ID)
}

func testSearchNumberQuantityURI(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	q := func(v, unit string) *store.Record {
		return mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"text":"x"},"valueQuantity":{"value":`+v+`,"system":"http://unitsofmeasure.org","code":"`+unit+`","unit":"`+unit+`"}}`)
	}
	a, b, c := q("5.4", "mg"), q("100", "mg"), q("100", "kg")
	expectIDs(t, s, sc, "Observation", "value-quantity=5.4", a.ID)
	expectIDs(t, s, sc, "Observation", "value-quantity=5", a.ID) // 5 is [4.5, 5.5)
	expectIDs(t, s, sc, "Observation", "value-quantity=5.41")    // [5.405, 5.415)
	expectIDs(t, s, sc, "Observation", "value-quantity=gt50", b.ID, c.ID)
	expectIDs(t, s, sc, "Observation", "value-quantity=lt100", a.ID)
	expectIDs(t, s, sc, "Observation", "value-quantity=le100", a.ID, b.ID, c.ID)
	expectIDs(t, s, sc, "Observation", "value-quantity=100|http://unitsofmeasure.org|mg", b.ID)
	expectIDs(t, s, sc, "Observation", "value-quantity=100||kg", c.ID)
	expectIDs(t, s, sc, "Observation", "value-quantity=ap95", b.ID, c.ID)
	expectIDs(t, s, sc, "Observation", "value-quantity=ne100", a.ID)
	ra := mustCreate(t, s, "p1", `{"resourceType":"RiskAssessment","status":"final","subject":{"reference":"Group/g"},"prediction":[{"probabilityDecimal":0.8}]}`)
	mustCreate(t, s, "p1", `{"resourceType":"RiskAssessment","status":"final","subject":{"reference":"Group/g"},"prediction":[{"probabilityDecimal":0.2}]}`)
	expectIDs(t, s, sc, "RiskAssessment", "probability=gt0.5", ra.ID)
	sub := mustCreate(t, s, "p1", `{"resourceType":"Subscription","status":"active","reason":"r","criteria":"Patient","channel":{"type":"rest-hook","endpoint":"https://example.com/hooks/a"}}`)
	mustCreate(t, s, "p1", `{"resourceType":"Subscription","status":"active","reason":"r","criteria":"Patient","channel":{"type":"rest-hook","endpoint":"https://example.org/b"}}`)
	expectIDs(t, s, sc, "Subscription", "url=https://example.com/hooks/a", sub.ID)
	expectIDs(t, s, sc, "Subscription", "url=https://example.com/hooks")
	expectIDs(t, s, sc, "Subscription", "url:below=https://example.com/", sub.ID)
	expectIDs(t, s, sc, "Subscription", "status=active&criteria=Patient&type=rest-hook", sub.ID, search(t, s, sc, "Subscription", "url=https://example.org/b").Records[0].ID)
}

func testSearchSortByParameter(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	obs := func(date string) string {
		eff := ""
		if date != "" {
			eff = `,"effectiveDateTime":"` + date + `"`
		}
		return mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]}`+eff+`}`).ID
	}
	a, b, c, none := obs("2021-05-01"), obs("2019-01-01"), obs("2023-12-31T10:00:00Z"), obs("")
	other := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"other"}]},"effectiveDateTime":"2030-01-01"}`).ID
	expectOrder(t, s, sc, "Observation", "code=http://loinc.org|8867-4&_sort=-date", c, a, b, none)
	expectOrder(t, s, sc, "Observation", "code=8867-4&_sort=date", b, a, c, none)
	expectOrder(t, s, sc, "Observation", "code=8867-4&_sort=-date&_count=2&_offset=1", a, b)
	p := func(family, given string) string {
		return mustCreate(t, s, "p1", `{"resourceType":"Patient","name":[{"family":"`+family+`","given":["`+given+`"]}]}`).ID
	}
	z, y, x := p("Zed", "amy"), p("young", "bea"), p("Xu", "cid")
	expectOrder(t, s, sc, "Patient", "_sort=family", x, y, z)
	expectOrder(t, s, sc, "Patient", "_sort=-family", z, y, x)
	expectOrder(t, s, sc, "Patient", "_sort=given,-_lastUpdated", z, y, x)
	expectOrder(t, s, sc, "Patient", "_sort=-_id", maxOf(x, y, z), midOf(x, y, z), minOf(x, y, z))

	// Without a filter the search walks the sort parameter's index: one row
	// per resource whatever its number of values, then the resources
	// without one; page by page it gives the same order.
	w := p("Wu", "zoe")
	if _, err := s.Update(context.Background(), sc, "Patient", w, store.Write{}, func(cur fhir.Resource) (fhir.Resource, error) {
		cur["name"] = []any{map[string]any{"family": "Wu", "given": []any{"zoe", "aaron"}}}
		return cur, nil
	}); err != nil {
		t.Fatal(err)
	}
	none2 := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"other"}`).ID
	asc := []string{w, z, y, x, none2} // given: aaron (w), amy, bea, cid; none last
	expectOrder(t, s, sc, "Patient", "_sort=given", asc...)
	expectOrder(t, s, sc, "Patient", "_sort=-given", w, x, y, z, none2) // zoe, cid, bea, amy
	for off := range asc {
		expectOrder(t, s, sc, "Patient", fmt.Sprintf("_sort=given&_count=1&_offset=%d", off), asc[off])
	}
	expectOrder(t, s, sc, "Patient", "_sort=given&_count=2&_offset=5")
	// A negation drives nothing: the walk of the date index tests it.
	expectOrder(t, s, sc, "Observation", "_sort=-date&code:not=http://loinc.org|other", c, a, b, none)
	expectOrder(t, s, sc, "Observation", "_sort=date&status:not=cancelled", b, a, c, other, none)
}

func minOf(ids ...string) string   { return sorted(ids)[0] }
func midOf(ids ...string) string   { return sorted(ids)[1] }
func maxOf(ids ...string) string   { return sorted(ids)[2] }
func sorted(ids []string) []string { return slices.Sorted(slices.Values(ids)) }

func testSearchFilterExpressions(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	bot := mustCreate(t, s, "p1", `{"resourceType":"Bot","name":"b"}`)
	ref := "Bot/" + bot.ID
	t1 := mustCreate(t, s, "p1", `{"resourceType":"Task","status":"ready","intent":"order","focus":{"reference":"`+ref+`"}}`)
	t2 := mustCreate(t, s, "p1", `{"resourceType":"Task","status":"ready","intent":"order","basedOn":[{"reference":"`+ref+`"}]}`)
	mustCreate(t, s, "p1", `{"resourceType":"Task","status":"ready","intent":"order"}`)
	// The query the reference's web app sends for a resource's timeline.
	f := "_filter=" + strings.NewReplacer(" ", "%20", "/", "%2F").Replace(fmt.Sprintf("based-on eq %s or focus eq %s or subject eq %s", ref, ref, ref))
	expectIDs(t, s, sc, "Task", f+"&_count=100", t1.ID, t2.ID)
	expectIDs(t, s, sc, "Task", f+"&focus:missing=true", t2.ID)

	a := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"female","birthDate":"1990-01-01","name":[{"family":"Ada"}],"telecom":[{"system":"email","value":"a@x"}]}`)
	b := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"male","birthDate":"2005-06-07","name":[{"family":"Adams"}]}`)
	c := mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"male","birthDate":"1970","name":[{"family":"Cleo"}]}`)
	for q, want := range map[string][]string{
		`name eq ada`:                           {a.ID},
		`name eq "ADA"`:                         {a.ID},
		`name sw ada`:                           {a.ID, b.ID},
		`name co dam`:                           {b.ID},
		`name ew ams`:                           {b.ID},
		`name ne ada`:                           {b.ID, c.ID},
		`gender eq male and birthdate ge 2000`:  {b.ID},
		`gender eq female or birthdate lt 1980`: {a.ID, c.ID},
		`not (gender eq male)`:                  {a.ID},
		`(gender eq male or name eq ada) and birthdate gt 1980`: {a.ID, b.ID},
		`email pr true`:  {a.ID},
		`email pr false`: {b.ID, c.ID},
		`gender ne male`: {a.ID},
	} {
		esc := strings.NewReplacer(" ", "%20", `"`, "%22", "(", "%28", ")", "%29").Replace(q)
		expectIDs(t, s, sc, "Patient", "_filter="+esc, want...)
	}
}

func testSearchShapesAgree(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	var pats, all []string
	for i := 0; i < 30; i++ {
		typ := []string{"Patient", "Practitioner", "ClientApplication"}[i%3]
		id := mustCreate(t, s, "p1", fmt.Sprintf(`{"resourceType":"ProjectMembership","project":{"reference":"Project/p1"},"user":{"reference":"User/u%d"},"profile":{"reference":"%s/x%d"},"active":%v}`, i, typ, i, i%2 == 0)).ID
		all = append(all, id)
		if typ == "Patient" {
			pats = append(pats, id)
		}
	}
	mustCreate(t, s, "p2", `{"resourceType":"ProjectMembership","project":{"reference":"Project/p2"},"user":{"reference":"User/u"},"profile":{"reference":"Patient/x"}}`)
	// One token value: streamed from its index rows, in _lastUpdated order.
	expectOrder(t, s, sc, "ProjectMembership", "profile-type=Patient", pats...)
	expectOrder(t, s, sc, "ProjectMembership", "profile-type=Patient&_count=3&_offset=4", pats[4:7]...)
	rev := append([]string{}, pats...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	expectOrder(t, s, sc, "ProjectMembership", "profile-type=Patient&_sort=-_lastUpdated", rev...)
	expectOrder(t, s, sc, "ProjectMembership", "profile-type=Patient&active=true", pats[0], pats[2], pats[4], pats[6], pats[8])
	expectTotal(t, s, sc, "ProjectMembership", "profile-type=Patient", 10)
	expectTotal(t, s, sc, "ProjectMembership", "profile-type:not=ClientApplication,Practitioner", 10)
	expectTotal(t, s, sc, "ProjectMembership", "profile-type:not=Patient", 20)
	expectTotal(t, s, sc, "ProjectMembership", "", 30)
	expectTotal(t, s, sc, "ProjectMembership", "profile-type=Patient&active=true", 5)
	expectTotal(t, s, store.AllProjects, "ProjectMembership", "profile-type=Patient", 11)
	// Walked: every type but ClientApplication, in order.
	var humans []string
	for i, id := range all {
		if i%3 != 2 {
			humans = append(humans, id)
		}
	}
	expectOrder(t, s, sc, "ProjectMembership", "profile-type:not=ClientApplication&_count=100", humans...)

	// A value under two systems is listed once, whichever shape runs.
	two := mustCreate(t, s, "p1", `{"resourceType":"Patient","identifier":[{"system":"urn:a","value":"dup"},{"system":"urn:b","value":"dup"}],"name":[{"family":"Dupont","given":["Dupontel"]}]}`)
	expectOrder(t, s, sc, "Patient", "identifier=dup", two.ID)
	expectTotal(t, s, sc, "Patient", "identifier=dup", 1)
	expectOrder(t, s, sc, "Patient", "name=dupont", two.ID)
	expectTotal(t, s, sc, "Patient", "name=dupont", 1)
	expectOrder(t, s, sc, "Patient", "name=dupont&identifier=dup", two.ID)
	// Deleted resources are gone from every shape and count.
	if err := s.Delete(context.Background(), sc, "Patient", two.ID, store.Write{}); err != nil {
		t.Fatal(err)
	}
	expectOrder(t, s, sc, "Patient", "identifier=dup")
	expectTotal(t, s, sc, "Patient", "identifier:not=dup", 0)
}

// testTotalsFollowWrites: a type's total follows creates, batches,
// deletions and rolled-back transactions, in every project scope.
func testTotalsFollowWrites(t *testing.T, s store.Store) {
	ctx := context.Background()
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, mustCreate(t, s, "p1", `{"resourceType":"Flag","status":"active","code":{"text":"x"},"subject":{"reference":"Group/g"}}`).ID)
	}
	batch := make([]fhir.Resource, 5)
	for i := range batch {
		batch[i] = res(t, `{"resourceType":"Flag","status":"inactive","code":{"text":"x"},"subject":{"reference":"Group/g"}}`)
	}
	if err := s.CreateMany(ctx, batch, store.Write{Project: "p1"}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, "p2", `{"resourceType":"Flag","status":"active","code":{"text":"x"},"subject":{"reference":"Group/g"}}`)
	for _, id := range ids[:2] {
		if err := s.Delete(ctx, store.ProjectScope("p1"), "Flag", id, store.Write{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, store.ProjectScope("p1"), "Flag", ids[0], store.Write{}); err != nil { // again: no change
		t.Fatal(err)
	}
	err := s.InTx(ctx, func(tx store.Store) error {
		if _, err := tx.Create(ctx, res(t, `{"resourceType":"Flag","status":"active","code":{"text":"x"},"subject":{"reference":"Group/g"}}`), store.Write{Project: "p1"}); err != nil {
			return err
		}
		return fmt.Errorf("roll back")
	})
	if err == nil {
		t.Fatal("rollback")
	}
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "", 6)
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "status:not=inactive", 1)
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "status=inactive,entered-in-error", 5)
	expectTotal(t, s, store.AllProjects, "Flag", "", 7)
	expectTotal(t, s, store.Scope{Projects: []string{"p1", "p2"}}, "Flag", "status:not=active", 5)
	expectTotal(t, s, store.ProjectScope("p3"), "Flag", "", 0)
	// An update moves a resource from one value's count to another's.
	if _, err := s.Update(ctx, store.ProjectScope("p1"), "Flag", ids[2], store.Write{}, func(cur fhir.Resource) (fhir.Resource, error) {
		cur["status"] = "inactive"
		return cur, nil
	}); err != nil {
		t.Fatal(err)
	}
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "status=inactive", 6)
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "status=active", 0)
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "status:not=active", 6)
	// A resource that breaks its type's cardinality counts once.
	mustCreate(t, s, "p1", `{"resourceType":"Flag","status":["active","inactive"],"code":{"text":"x"},"subject":{"reference":"Group/g"}}`)
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "status:not=active,inactive", 0)
	expectTotal(t, s, store.ProjectScope("p1"), "Flag", "", 7)
}

// testSearchSingleValuedShapes: the shapes that rely on a parameter having
// one index row per resource (birthdate, gender are Single) give what the
// naive shape gives: the sort walk without its per-row probe in the date
// indexes' (end, id) order, ties broken by id, the resources without a
// date last; a stream without its duplicate check; two filters whose
// counts bound each other.
func testSearchSingleValuedShapes(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	// Five of each date, so that ties are many: "1970" and "1970-01-01"
	// share their start and differ in their end, as "1980-05" and
	// "1980-05-05" share neither.
	dates := []string{"1970", "1970-01-01", "1980-05-05", "1980-05", ""}
	lo := map[string]string{"1970": "1970-01-01", "1970-01-01": "1970-01-01", "1980-05-05": "1980-05-05", "1980-05": "1980-05-01"}
	hi := map[string]string{"1970": "1971-01-01", "1970-01-01": "1970-01-02", "1980-05-05": "1980-05-06", "1980-05": "1980-06-01"}
	type pat struct {
		rec          *store.Record
		gender, date string
		family       string
	}
	var pats []pat
	for i := range 25 {
		p := pat{gender: []string{"female", "male", "other"}[i%3], date: dates[i%5], family: fmt.Sprintf("Fam%d", i%4)}
		birth := ""
		if p.date != "" {
			birth = `,"birthDate":"` + p.date + `"`
		}
		p.rec = mustCreate(t, s, "p1", `{"resourceType":"Patient","gender":"`+p.gender+`"`+birth+`,"name":[{"family":"`+p.family+`"}]}`)
		pats = append(pats, p)
	}
	mustCreate(t, s, "p2", `{"resourceType":"Patient","gender":"female","birthDate":"1900-01-01"}`)

	// want lists the ids of the patients that keep passes, sorted by
	// birthdate (its start ascending, its end descending), then by id in
	// the same direction, those without one last.
	want := func(desc bool, keep func(pat) bool) []string {
		var list []pat
		for _, p := range pats {
			if keep(p) {
				list = append(list, p)
			}
		}
		slices.SortFunc(list, func(a, b pat) int {
			if (a.date == "") != (b.date == "") {
				if a.date == "" {
					return 1
				}
				return -1
			}
			ka, kb := lo[a.date]+a.rec.ID, lo[b.date]+b.rec.ID
			if desc {
				ka, kb = hi[b.date]+b.rec.ID, hi[a.date]+a.rec.ID
			}
			if a.date == "" {
				ka, kb = a.rec.ID, b.rec.ID
				if desc {
					ka, kb = kb, ka
				}
			}
			return strings.Compare(ka, kb)
		})
		var out []string
		for _, p := range list {
			out = append(out, p.rec.ID)
		}
		return out
	}
	all := func(pat) bool { return true }
	notMale := func(p pat) bool { return p.gender != "male" }
	female := func(p pat) bool { return p.gender == "female" }
	for _, c := range []struct {
		query string
		desc  bool
		keep  func(pat) bool
	}{
		{"_sort=birthdate", false, all},                     // sort walk
		{"_sort=birthdate,_id", false, all},                 // the naive walk, sorted by correlated keys
		{"gender:not=male&_sort=birthdate", false, notMale}, // sort walk testing a condition
		{"gender=female&_sort=birthdate", false, female},    // collect: a rare value
		{"_sort=-birthdate", true, all},                     // sort walk, backwards
		{"_sort=-birthdate,-_id", true, all},                // naive
		{"gender:not=male&_sort=-birthdate", true, notMale}, // sort walk
		{"gender=female&_sort=-birthdate", true, female},    // collect
		{"birthdate=ge1975&_sort=-birthdate", true, func(p pat) bool { return p.date >= "1975" }},
	} {
		w := want(c.desc, c.keep)
		expectOrder(t, s, sc, "Patient", c.query+"&_count=100", w...)
		// Page by page, across the end of the dated resources.
		var paged []string
		for off := 0; off < len(w)+4; off += 4 {
			for _, rec := range search(t, s, sc, "Patient", fmt.Sprintf("%s&_count=4&_offset=%d", c.query, off)).Records {
				paged = append(paged, rec.ID)
			}
		}
		if strings.Join(paged, ",") != strings.Join(w, ",") {
			t.Errorf("%s by pages of 4 = %v, want %v", c.query, paged, w)
		}
	}

	// One value of a single-valued token, streamed in _lastUpdated order.
	var females []string
	for _, p := range pats {
		if p.gender == "female" {
			females = append(females, p.rec.ID)
		}
	}
	expectOrder(t, s, sc, "Patient", "gender=female&_count=100", females...)
	expectOrder(t, s, sc, "Patient", "gender=female&_count=3&_offset=3", females[3:6]...)
	expectTotal(t, s, sc, "Patient", "gender=female", len(females))
	// Two filters, either of which may drive.
	var fam1Female, fam1Dated []string
	for _, p := range pats {
		if p.family == "Fam1" && p.gender == "female" {
			fam1Female = append(fam1Female, p.rec.ID)
		}
		if p.family == "Fam1" && p.date != "" && lo[p.date] < "1975" {
			fam1Dated = append(fam1Dated, p.rec.ID)
		}
	}
	expectIDs(t, s, sc, "Patient", "family:exact=Fam1&gender=female", fam1Female...)
	expectIDs(t, s, sc, "Patient", "gender=female&family:exact=Fam1", fam1Female...)
	expectIDs(t, s, sc, "Patient", "family=fam1&birthdate=lt1975", fam1Dated...)
	expectTotal(t, s, sc, "Patient", "family:exact=Fam1&gender=female", len(fam1Female))
	expectIDs(t, s, sc, "Patient", "family:exact=Nobody&gender=female")
}
