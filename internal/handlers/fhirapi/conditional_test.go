package fhirapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// patientWith is a Patient with one identifier.
func patientWith(system, value string, extra ...any) map[string]any {
	p := map[string]any{"resourceType": "Patient", "identifier": []any{map[string]any{"system": system, "value": value}}}
	for i := 0; i+1 < len(extra); i += 2 {
		p[extra[i].(string)] = extra[i+1]
	}
	return p
}

// countOf is the number of resources a search finds.
func countOf(t *testing.T, c *servertest.Client, query string) int {
	t.Helper()
	r := c.Do("GET", "fhir/R4/"+query+"&_total=accurate", nil, "")
	if r.Status != 200 {
		t.Fatalf("search %s: %d %s", query, r.Status, r.Body)
	}
	n, _ := r.JSON()["total"].(float64)
	return int(n)
}

func TestConditionalCreate(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "ccreate")
		other := s.NewProject(t, "ccreate-other")
		ifNone := func(body map[string]any, query string) *servertest.Response {
			return c.DoWith("POST", "fhir/R4/Patient", body, "", map[string]string{"If-None-Exist": query})
		}

		// None: created (201, Location), as a plain create.
		r := ifNone(patientWith("urn:cc", "1", "gender", "female"), "identifier=urn:cc|1")
		if r.Status != 201 || r.Header.Get("Location") == "" {
			t.Fatalf("first: %d %s", r.Status, r.Body)
		}
		checkVersionHeaders(t, "first", r)
		id, vid := str(r.JSON(), "id"), str(r.JSON(), "meta", "versionId")

		// One: that resource as it is (200), nothing written.
		r = ifNone(patientWith("urn:cc", "1", "gender", "male"), "identifier=urn:cc|1")
		if r.Status != 200 || str(r.JSON(), "id") != id || str(r.JSON(), "meta", "versionId") != vid ||
			str(r.JSON(), "gender") != "female" || r.Header.Get("Location") != "" {
			t.Fatalf("second: %d %s", r.Status, r.Body)
		}
		checkVersionHeaders(t, "second", r)
		if n := countOf(t, c, "Patient?identifier=urn:cc|1"); n != 1 {
			t.Errorf("%d Patients after two conditional creates, want 1", n)
		}
		// A body id naming another resource than the match (reference: 400).
		r = ifNone(patientWith("urn:cc", "1", "id", "someone-else"), "identifier=urn:cc|1")
		wantOutcome(t, "id mismatch", r, 400, "invalid", "Resource ID did not match resolved ID")

		// Several: 412 multiple-matches, and nothing created.
		c.Create(patientWith("urn:cc", "1"))
		r = ifNone(patientWith("urn:cc", "1"), "identifier=urn:cc|1")
		wantOutcome(t, "several", r, 412, "multiple-matches", "Multiple resources found matching condition")
		if n := countOf(t, c, "Patient?identifier=urn:cc|1"); n != 2 {
			t.Errorf("%d Patients after the 412, want 2", n)
		}

		// Another project's resource never matches, and is not answered.
		theirs := other.Create(patientWith("urn:cc", "theirs"))
		r = ifNone(patientWith("urn:cc", "theirs"), "identifier=urn:cc|theirs")
		if r.Status != 201 || str(r.JSON(), "id") == str(theirs, "id") || str(r.JSON(), "meta", "project") != c.ProjectID {
			t.Fatalf("other project's match: %d %s", r.Status, r.Body)
		}
		if n := countOf(t, other, "Patient?identifier=urn:cc|theirs"); n != 1 {
			t.Errorf("other project sees %d Patients, want its 1", n)
		}

		// A leading "?" is allowed, as @medplum/core may send it.
		if r := ifNone(patientWith("urn:cc", "q"), "?identifier=urn:cc|q"); r.Status != 201 {
			t.Errorf("leading ?: %d %s", r.Status, r.Body)
		}
	})
}

func TestConditionalUpdate(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "cupdate")
		other := s.NewProject(t, "cupdate-other")
		put := func(query string, body map[string]any, headers map[string]string) *servertest.Response {
			return c.DoWith("PUT", "fhir/R4/Patient?"+query, body, "", headers)
		}

		// None: created.
		r := put("identifier=urn:cu|1", patientWith("urn:cu", "1", "gender", "female"), nil)
		if r.Status != 201 || r.Header.Get("Location") == "" {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		id, v1 := str(r.JSON(), "id"), str(r.JSON(), "meta", "versionId")

		// One: updated in place (same id, a new version).
		r = put("identifier=urn:cu|1", patientWith("urn:cu", "1", "gender", "male"), nil)
		if r.Status != 200 || str(r.JSON(), "id") != id || str(r.JSON(), "gender") != "male" || str(r.JSON(), "meta", "versionId") == v1 {
			t.Fatalf("update: %d %s", r.Status, r.Body)
		}
		checkVersionHeaders(t, "update", r)
		v2 := str(r.JSON(), "meta", "versionId")
		// The body may name the match's id.
		if r := put("identifier=urn:cu|1", patientWith("urn:cu", "1", "id", id, "gender", "other"), nil); r.Status != 200 || str(r.JSON(), "gender") != "other" {
			t.Errorf("update naming the id: %d %s", r.Status, r.Body)
		}
		v3 := str(c.Do("GET", "fhir/R4/Patient/"+id, nil, "").JSON(), "meta", "versionId")
		// If-Match: a stale version is 412, nothing written.
		r = put("identifier=urn:cu|1", patientWith("urn:cu", "1", "gender", "unknown"), map[string]string{"If-Match": `W/"` + v2 + `"`})
		wantOutcome(t, "stale If-Match", r, 412, "processing", "")
		r = put("identifier=urn:cu|1", patientWith("urn:cu", "1", "gender", "unknown"), map[string]string{"If-Match": `W/"` + v3 + `"`})
		if r.Status != 200 || str(r.JSON(), "gender") != "unknown" {
			t.Errorf("current If-Match: %d %s", r.Status, r.Body)
		}
		// A body id that is not the match's: 400 (the reference's text).
		r = put("identifier=urn:cu|1", patientWith("urn:cu", "1", "id", "not-"+id), nil)
		wantOutcome(t, "id mismatch", r, 400, "invalid", "Resource ID did not match resolved ID")
		// No match and a client id: 400 (the server chooses ids).
		r = put("identifier=urn:cu|2", patientWith("urn:cu", "2", "id", "mine"), nil)
		wantOutcome(t, "create with id", r, 400, "invalid", "Cannot perform create as update with client-assigned ID")
		// Another type's body: 400.
		r = put("identifier=urn:cu|1", map[string]any{"resourceType": "Observation"}, nil)
		wantOutcome(t, "wrong type", r, 400, "invalid", "")

		// Several: 412, nothing written.
		c.Create(patientWith("urn:cu", "1"))
		r = put("identifier=urn:cu|1", patientWith("urn:cu", "1", "gender", "female"), nil)
		wantOutcome(t, "several", r, 412, "multiple-matches", "Multiple resources found matching condition")
		if g := str(c.Do("GET", "fhir/R4/Patient/"+id, nil, "").JSON(), "gender"); g != "unknown" {
			t.Errorf("after the 412, gender %q", g)
		}

		// Another project's resource is neither updated nor matched.
		theirs := other.Create(patientWith("urn:cu", "theirs", "gender", "female"))
		r = put("identifier=urn:cu|theirs", patientWith("urn:cu", "theirs", "gender", "male"), nil)
		if r.Status != 201 || str(r.JSON(), "id") == str(theirs, "id") {
			t.Fatalf("other project's match: %d %s", r.Status, r.Body)
		}
		if g := str(other.Do("GET", "fhir/R4/Patient/"+str(theirs, "id"), nil, "").JSON(), "gender"); g != "female" {
			t.Errorf("other project's Patient changed: gender %q", g)
		}
	})
}

func TestConditionalDeleteAndPatch(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "cdelete")
		other := s.NewProject(t, "cdelete-other")
		patch := []map[string]any{{"op": "add", "path": "/active", "value": true}}

		// Patch: none is 404, one is patched, several 412.
		r := c.Do("PATCH", "fhir/R4/Patient?identifier=urn:cd|1", patch, "application/json-patch+json")
		wantOutcome(t, "patch none", r, 404, "not-found", "")
		id := str(c.Create(patientWith("urn:cd", "1")), "id")
		r = c.Do("PATCH", "fhir/R4/Patient?identifier=urn:cd|1", patch, "application/json-patch+json")
		if r.Status != 200 || str(r.JSON(), "id") != id || get(r.JSON(), "active") != true {
			t.Fatalf("patch one: %d %s", r.Status, r.Body)
		}
		r = c.Do("PATCH", "fhir/R4/Patient?identifier=urn:cd|1", patch, "application/json")
		wantOutcome(t, "patch media type", r, 415, "", "")

		// Delete: one is deleted, then none is a success that deletes nothing.
		r = c.Do("DELETE", "fhir/R4/Patient?identifier=urn:cd|1", nil, "")
		wantOutcome(t, "delete one", r, 200, "informational", "All OK")
		if r := c.Do("GET", "fhir/R4/Patient/"+id, nil, ""); r.Status != 410 {
			t.Errorf("read after conditional delete: %d", r.Status)
		}
		r = c.Do("DELETE", "fhir/R4/Patient?identifier=urn:cd|1", nil, "")
		wantOutcome(t, "delete none", r, 200, "informational", "All OK")

		// Several: 412 for both, nothing changed.
		a := str(c.Create(patientWith("urn:cd", "2")), "id")
		c.Create(patientWith("urn:cd", "2"))
		wantOutcome(t, "patch several", c.Do("PATCH", "fhir/R4/Patient?identifier=urn:cd|2", patch, "application/json-patch+json"), 412, "multiple-matches", "")
		wantOutcome(t, "delete several", c.Do("DELETE", "fhir/R4/Patient?identifier=urn:cd|2", nil, ""), 412, "multiple-matches", "")
		if n := countOf(t, c, "Patient?identifier=urn:cd|2"); n != 2 {
			t.Errorf("after the 412s: %d Patients, want 2", n)
		}
		if get(c.Do("GET", "fhir/R4/Patient/"+a, nil, "").JSON(), "active") != nil {
			t.Errorf("a 412 patch changed a Patient")
		}

		// If-Match on a conditional delete.
		b := c.Create(patientWith("urn:cd", "3"))
		r = c.DoWith("DELETE", "fhir/R4/Patient?identifier=urn:cd|3", nil, "", map[string]string{"If-Match": `W/"stale"`})
		wantOutcome(t, "delete stale If-Match", r, 412, "processing", "")
		r = c.DoWith("DELETE", "fhir/R4/Patient?identifier=urn:cd|3", nil, "", map[string]string{"If-Match": `W/"` + str(b, "meta", "versionId") + `"`})
		wantOutcome(t, "delete current If-Match", r, 200, "informational", "")

		// Another project's resource is neither deleted nor patched.
		theirs := str(other.Create(patientWith("urn:cd", "theirs")), "id")
		wantOutcome(t, "patch theirs", c.Do("PATCH", "fhir/R4/Patient?identifier=urn:cd|theirs", patch, "application/json-patch+json"), 404, "not-found", "")
		wantOutcome(t, "delete theirs", c.Do("DELETE", "fhir/R4/Patient?identifier=urn:cd|theirs", nil, ""), 200, "informational", "")
		if r := other.Do("GET", "fhir/R4/Patient/"+theirs, nil, ""); r.Status != 200 || get(r.JSON(), "active") != nil {
			t.Errorf("other project's Patient: %d %s", r.Status, r.Body)
		}
	})
}

// TestConditionalBadQueries: every malformed condition is a 400
// OperationOutcome, and nothing is written.
func TestConditionalBadQueries(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "cbad")
		c.Create(patientWith("urn:cb", "1"))
		body := patientWith("urn:cb", "1")
		patch := []map[string]any{{"op": "add", "path": "/active", "value": true}}
		for _, tc := range []struct {
			name, method, path, ifNoneExist string
			body                            any
			ct, text                        string
		}{
			{"PUT without query", "PUT", "Patient", "", body, "", "A conditional update needs at least one search parameter"},
			{"PUT only _count", "PUT", "Patient?_count=1", "", body, "", "A conditional update needs at least one search parameter"},
			{"DELETE without query", "DELETE", "Patient", "", nil, "", "A conditional delete needs at least one search parameter"},
			{"PATCH without query", "PATCH", "Patient?", "", patch, "application/json-patch+json", "A conditional patch needs at least one search parameter"},
			{"If-None-Exist without criteria", "POST", "Patient", "_sort=name", body, "", "If-None-Exist needs at least one search parameter"},
			{"unknown parameter (PUT)", "PUT", "Patient?nonsense=1", "", body, "", "Unknown search parameter: nonsense"},
			{"unknown parameter (If-None-Exist)", "POST", "Patient", "nonsense=1", body, "", "Unknown search parameter: nonsense"},
			{"unknown parameter (DELETE)", "DELETE", "Patient?nonsense=1", "", nil, "", "Unknown search parameter: nonsense"},
			{"bad encoding", "DELETE", "Patient?identifier=%zz", "", nil, "", ""},
			{"bad date", "PUT", "Patient?birthdate=yesterday", "", body, "", ""},
			{"bad _filter", "POST", "Patient", "_filter=name eq", body, "", ""},
		} {
			var h map[string]string
			if tc.ifNoneExist != "" {
				h = map[string]string{"If-None-Exist": tc.ifNoneExist}
			}
			r := c.DoWith(tc.method, "fhir/R4/"+tc.path, tc.body, tc.ct, h)
			wantOutcome(t, tc.name, r, 400, "invalid", tc.text)
		}
		if n := countOf(t, c, "Patient?identifier=urn:cb|1"); n != 1 {
			t.Errorf("%d Patients, want the 1 created", n)
		}
	})
}

// TestConditionalCreateConcurrent: conditional creates of one resource sent
// at once create it once; the others answer it (200). On PostgreSQL this
// is the lock's doing; SQLite's writers are serial anyway.
func TestConditionalCreateConcurrent(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "crace")
		const n = 8
		for round := range 3 {
			query := fmt.Sprintf("identifier=urn:race|%d", round)
			body, _ := json.Marshal(patientWith("urn:race", fmt.Sprint(round)))
			statuses := make([]int, n)
			ids := make([]string, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				method, path, h := "POST", "Patient", "If-None-Exist"
				if i%2 == 1 { // half of them conditional updates of the same
					method, path, h = "PUT", "Patient?"+query, ""
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequest(method, s.URL+"fhir/R4/"+path, bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/fhir+json")
					req.Header.Set("Authorization", "Bearer "+c.Token)
					if h != "" {
						req.Header.Set(h, query)
					}
					<-start
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return
					}
					defer resp.Body.Close()
					b, _ := io.ReadAll(resp.Body)
					var res struct{ ID string }
					json.Unmarshal(b, &res)
					statuses[i], ids[i] = resp.StatusCode, res.ID
				}()
			}
			close(start)
			wg.Wait()
			created := 0
			for i := range n {
				switch statuses[i] {
				case 201:
					created++
				case 200:
				default:
					t.Errorf("round %d request %d: status %d", round, i, statuses[i])
				}
				if ids[i] != ids[0] {
					t.Errorf("round %d: answered ids %v, want one", round, ids)
					break
				}
			}
			if created != 1 {
				t.Errorf("round %d: %d creates answered 201 (%v), want 1", round, created, statuses)
			}
			if got := countOf(t, c, "Patient?"+url.PathEscape(query)); got != 1 {
				t.Errorf("round %d: %d Patients stored, want 1", round, got)
			}
		}
	})
}

// TestConditionalInBundle: a Bundle entry is the same request: a PUT or
// DELETE entry whose url has a query is conditional, and ifNoneExist is the
// header's.
func TestConditionalInBundle(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "cbundle")
		for _, typ := range []string{"batch", "transaction"} {
			sys := "urn:cbundle:" + typ
			entry := func(method, url string, res any, extra ...string) map[string]any {
				req := map[string]any{"method": method, "url": url}
				if len(extra) == 2 {
					req[extra[0]] = extra[1]
				}
				e := map[string]any{"request": req}
				if res != nil {
					e["resource"] = res
				}
				return e
			}
			bundle := map[string]any{"resourceType": "Bundle", "type": typ, "entry": []any{
				entry("PUT", "Patient?identifier="+sys+"|1", patientWith(sys, "1", "gender", "female")),
				entry("POST", "Patient", patientWith(sys, "2"), "ifNoneExist", "identifier="+sys+"|2"),
			}}
			r := c.Do("POST", "fhir/R4", bundle, "")
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", typ, r.Status, r.Body)
			}
			if got := entryStatuses(t, r); fmt.Sprint(got) != "[201 201]" {
				t.Fatalf("%s first: %v %s", typ, got, r.Body)
			}
			bundle["entry"] = []any{
				entry("PUT", "Patient?identifier="+sys+"|1", patientWith(sys, "1", "gender", "male")),
				entry("POST", "Patient", patientWith(sys, "2"), "ifNoneExist", "identifier="+sys+"|2"),
				entry("DELETE", "Patient?identifier="+sys+"|2", nil),
			}
			r = c.Do("POST", "fhir/R4", bundle, "")
			if got := entryStatuses(t, r); fmt.Sprint(got) != "[200 200 200]" {
				t.Fatalf("%s second: %v %s", typ, got, r.Body)
			}
			if n := countOf(t, c, "Patient?identifier="+sys+"|1&gender=male"); n != 1 {
				t.Errorf("%s: conditional update entry: %d updated Patients", typ, n)
			}
			if n := countOf(t, c, "Patient?identifier="+sys+"|2"); n != 0 {
				t.Errorf("%s: conditional delete entry left %d", typ, n)
			}
		}
	})
}

// entryStatuses is the response.status of each entry of a response Bundle.
func entryStatuses(t *testing.T, r *servertest.Response) []string {
	t.Helper()
	var out []string
	for _, e := range entries(t, r) {
		out = append(out, str(e, "response", "status"))
	}
	return out
}

// TestConditionalFromJSBot: a JavaScript bot's MedplumClient sends the
// If-None-Exist header (createResourceIfNoneExist) and conditional URLs
// (upsertResource) through the in-process fetch; the dispatcher answers them
// as it answers HTTP.
func TestConditionalFromJSBot(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "cbot")
		code := `exports.handler = async (medplum) => {
  const p = { resourceType: 'Patient', identifier: [{ system: 'urn:cbot', value: '1' }] };
  const a = await medplum.createResourceIfNoneExist(p, 'identifier=urn:cbot|1');
  const b = await medplum.createResourceIfNoneExist(p, 'identifier=urn:cbot|1');
  const u = await medplum.upsertResource({ ...p, gender: 'female' }, 'identifier=urn:cbot|1');
  const n = await medplum.upsertResource({ resourceType: 'Patient', identifier: [{ system: 'urn:cbot', value: '2' }] }, { identifier: 'urn:cbot|2' });
  return { same: a.id === b.id && b.id === u.id, gender: u.gender, created: n.id !== a.id };
};`
		bot := memberJSBot(t, c, "conditional", code)
		r := c.Do("POST", "fhir/R4/Bot/"+bot+"/$execute", `{}`, "application/json")
		if r.Status != 200 || string(r.Body) != `{"same":true,"gender":"female","created":true}` {
			t.Fatalf("bot: %d %s", r.Status, r.Body)
		}
		if n := countOf(t, c, "Patient?identifier=urn:cbot|1"); n != 1 {
			t.Errorf("%d Patients urn:cbot|1, want 1", n)
		}
	})
}
