package fhirapi_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
)

type bundleAnswer struct {
	ResourceType string `json:"resourceType"`
	Type         string `json:"type"`
	Entry        []struct {
		Resource map[string]any `json:"resource"`
		Response struct {
			Status   string         `json:"status"`
			Location string         `json:"location"`
			ETag     string         `json:"etag"`
			Outcome  map[string]any `json:"outcome"`
		} `json:"response"`
	} `json:"entry"`
}

func postBundle(t *testing.T, c *servertest.Client, b map[string]any) (*servertest.Response, bundleAnswer) {
	t.Helper()
	r := c.Do("POST", "fhir/R4", b, "")
	var a bundleAnswer
	json.Unmarshal(r.Body, &a)
	return r, a
}

func entry(method, url string, resource map[string]any) map[string]any {
	e := map[string]any{"request": map[string]any{"method": method, "url": url}}
	if resource != nil {
		e["resource"] = resource
	}
	return e
}

func countPatients(t *testing.T, c *servertest.Client, family string) int {
	t.Helper()
	r := c.Do("GET", "fhir/R4/Patient?family="+family+"&_total=accurate", nil, "")
	var b struct {
		Total int `json:"total"`
	}
	json.Unmarshal(r.Body, &b)
	return b.Total
}

// TestBatchBundle: a batch's entries are independent, each answered like the
// same request alone (statuses, resources, outcomes, authorization), in
// order; what the client's auto-batching sends (GETs) works.
func TestBatchBundle(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "batch")
		member := s.NewMember(t, c.ProjectID, "plain member", false)
		other := s.NewProject(t, "elsewhere")
		pid := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Batchley"}}})["id"].(string)
		hidden := other.Create(map[string]any{"resourceType": "Patient"})["id"].(string)

		patch := base64.StdEncoding.EncodeToString([]byte(`[{"op":"add","path":"/gender","value":"female"}]`))
		r, a := postBundle(t, member, map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{
			entry("GET", "Patient/"+pid, nil),
			entry("GET", "Patient?family=Batchley", nil),
			entry("POST", "Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Newbie"}}}),
			entry("GET", "Patient/"+hidden, nil),
			entry("POST", "Project", map[string]any{"resourceType": "Project", "name": "no"}),
			entry("PATCH", "Patient/"+pid, map[string]any{"resourceType": "Binary", "contentType": "application/json-patch+json", "data": patch}),
			entry("DELETE", "Patient/"+pid, nil),
			entry("GET", "Nope/1", nil),
			map[string]any{"request": map[string]any{"url": "Patient"}},
			entry("POST", "/", map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{}}),
		}})
		if r.Status != 200 || a.Type != "batch-response" || len(a.Entry) != 10 {
			t.Fatalf("batch: %d %s", r.Status, r.Body)
		}
		want := []string{"200", "200", "201", "404", "403", "200", "200", "404", "400", "404"}
		for i, w := range want {
			if a.Entry[i].Response.Status != w {
				t.Errorf("entry %d: status %s, want %s (%v)", i, a.Entry[i].Response.Status, w, a.Entry[i].Response.Outcome)
			}
			oc := a.Entry[i].Response.Outcome
			if oc == nil || oc["resourceType"] != "OperationOutcome" {
				t.Errorf("entry %d: no outcome", i)
			}
			if ok := w[0] == '2'; ok != (oc["id"] == "ok" || oc["id"] == "created") {
				t.Errorf("entry %d: outcome id %v for status %s", i, oc["id"], w)
			}
		}
		if a.Entry[0].Resource["id"] != pid || !strings.HasPrefix(a.Entry[0].Response.ETag, `W/"`) {
			t.Errorf("read entry: %v %v", a.Entry[0].Resource, a.Entry[0].Response)
		}
		if a.Entry[1].Resource["resourceType"] != "Bundle" || a.Entry[1].Resource["type"] != "searchset" {
			t.Errorf("search entry: %v", a.Entry[1].Resource)
		}
		if a.Entry[2].Resource["id"] == nil || !strings.Contains(a.Entry[2].Response.Location, "Patient/") {
			t.Errorf("create entry: %v %v", a.Entry[2].Resource, a.Entry[2].Response)
		}
		if a.Entry[5].Resource["gender"] != "female" {
			t.Errorf("patch entry: %v", a.Entry[5].Resource)
		}
		// The entries ran in order: the patch saw the Patient, the delete removed it.
		if r := c.Do("GET", "fhir/R4/Patient/"+pid, nil, ""); r.Status != 410 {
			t.Errorf("after the batch's delete: %d", r.Status)
		}
		if n := countPatients(t, c, "Newbie"); n != 1 {
			t.Errorf("created by the batch: %d", n)
		}

		// What MedplumClient's auto-batching sends: GETs, without resources.
		_, a = postBundle(t, c, map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{
			entry("GET", "Patient?family=Newbie", nil), entry("GET", "metadata", nil),
		}})
		if len(a.Entry) != 2 || a.Entry[0].Response.Status != "200" {
			t.Errorf("auto-batch shape: %+v", a)
		}

		// Bundles that are not batches or transactions.
		for what, b := range map[string]any{
			"searchset":     map[string]any{"resourceType": "Bundle", "type": "searchset", "entry": []any{}},
			"no type":       map[string]any{"resourceType": "Bundle", "entry": []any{}},
			"no entry":      map[string]any{"resourceType": "Bundle", "type": "batch"},
			"not a Bundle":  map[string]any{"resourceType": "Patient", "type": "batch", "entry": []any{}},
			"entry not obj": map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{1}},
			"array":         []any{1, 2},
		} {
			r := c.Do("POST", "fhir/R4", b, "")
			wantOutcome(t, what, r, 400, "invalid", "")
		}
		wantOutcome(t, "not JSON", c.Do("POST", "fhir/R4/", "{", ""), 400, "invalid", "")
		wantOutcome(t, "text body", c.Do("POST", "fhir/R4/", "x", "text/plain"), 415, "", "")
		wantOutcome(t, "anonymous", s.Anonymous(t).Do("POST", "fhir/R4", map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{}}, ""), 401, "", "")
	})
}

// TestBundleEntryLimit: more entries than SANDBOT_MAX_BUNDLE_ENTRIES is 400
// before any entry runs.
func TestBundleEntryLimit(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "limit")
		var es []any
		for range 6 {
			es = append(es, entry("POST", "Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Limited"}}}))
		}
		wantOutcome(t, "6 entries", c.Do("POST", "fhir/R4", map[string]any{"resourceType": "Bundle", "type": "batch", "entry": es}, ""), 400, "invalid", "Too many bundle entries (limit 5)")
		if n := countPatients(t, c, "Limited"); n != 0 {
			t.Errorf("entries ran: %d", n)
		}
		if r, _ := postBundle(t, c, map[string]any{"resourceType": "Bundle", "type": "batch", "entry": es[:5]}); r.Status != 200 {
			t.Errorf("5 entries: %d %s", r.Status, r.Body)
		}
	}, func(c *server.Config) { c.Limits.BundleEntries = 5 })
}

// TestTransactionBundle: all or nothing in one store transaction, urn:uuid
// references rewritten whatever the entries' order, conditional creates, and
// a failing entry (here the 100th) leaves nothing behind.
func TestTransactionBundle(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "transaction")
		member := s.NewMember(t, c.ProjectID, "plain member", false)
		patientURN, encounterURN := "urn:uuid:"+uuid.NewString(), "urn:uuid:"+uuid.NewString()
		// The Observation comes first and refers to entries after it.
		r, a := postBundle(t, c, map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"request": map[string]any{"method": "POST", "url": "Observation"}, "resource": map[string]any{
				"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "tx"},
				"subject": map[string]any{"reference": patientURN}, "encounter": map[string]any{"reference": encounterURN}}},
			map[string]any{"fullUrl": encounterURN, "request": map[string]any{"method": "POST", "url": "Encounter"},
				"resource": map[string]any{"resourceType": "Encounter", "status": "finished", "class": map[string]any{"code": "AMB"},
					"subject": map[string]any{"reference": patientURN}}},
			map[string]any{"fullUrl": patientURN, "request": map[string]any{"method": "POST", "url": "Patient", "ifNoneExist": "identifier=tx|1"},
				"resource": map[string]any{"resourceType": "Patient", "identifier": []any{map[string]any{"system": "tx", "value": "1"}}}},
		}})
		if r.Status != 200 || a.Type != "transaction-response" || len(a.Entry) != 3 {
			t.Fatalf("transaction: %d %s", r.Status, r.Body)
		}
		patient := "Patient/" + a.Entry[2].Resource["id"].(string)
		encounter := "Encounter/" + a.Entry[1].Resource["id"].(string)
		obs := a.Entry[0].Resource
		if a.Entry[0].Response.Status != "201" || obs["subject"].(map[string]any)["reference"] != patient ||
			obs["encounter"].(map[string]any)["reference"] != encounter {
			t.Errorf("references not rewritten: %v (patient %s, encounter %s)", obs, patient, encounter)
		}
		if got := a.Entry[1].Resource["subject"].(map[string]any)["reference"]; got != patient {
			t.Errorf("encounter subject %v", got)
		}
		// ifNoneExist: the Patient exists now, so a second transaction refers to it.
		_, a = postBundle(t, c, map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"fullUrl": patientURN, "request": map[string]any{"method": "POST", "url": "Patient", "ifNoneExist": "identifier=tx|1"},
				"resource": map[string]any{"resourceType": "Patient", "identifier": []any{map[string]any{"system": "tx", "value": "1"}}}},
			map[string]any{"request": map[string]any{"method": "POST", "url": "Observation"}, "resource": map[string]any{
				"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "again"}, "subject": map[string]any{"reference": patientURN}}},
		}})
		if len(a.Entry) != 2 || a.Entry[0].Response.Status != "200" || "Patient/"+fmt.Sprint(a.Entry[0].Resource["id"]) != patient ||
			a.Entry[1].Resource["subject"].(map[string]any)["reference"] != patient {
			t.Errorf("conditional create: %+v", a)
		}

		// 100 entries, the last one refused: nothing is kept.
		var es []any
		for i := range 99 {
			es = append(es, entry("POST", "Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Hundred", "given": []any{fmt.Sprint(i)}}}}))
		}
		failing := append(append([]any{}, es...), entry("PUT", "Patient/"+uuid.NewString(), map[string]any{"resourceType": "Observation"}))
		r = c.Do("POST", "fhir/R4", map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": failing}, "")
		wantOutcome(t, "failing transaction", r, 400, "invalid", "")
		if !strings.Contains(string(r.Body), "Bundle.entry[99]") {
			t.Errorf("the failure does not name the entry: %s", r.Body)
		}
		if n := countPatients(t, c, "Hundred"); n != 0 {
			t.Errorf("a failed transaction kept %d Patients", n)
		}
		// The same 99 and a good 100th: all kept.
		ok := append(append([]any{}, es...), entry("POST", "Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Hundred"}}}))
		if r, a := postBundle(t, c, map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": ok}); r.Status != 200 || len(a.Entry) != 100 {
			t.Fatalf("100-entry transaction: %d %.300s", r.Status, r.Body)
		}
		if n := countPatients(t, c, "Hundred"); n != 100 {
			t.Errorf("100-entry transaction kept %d", n)
		}

		// Each entry is authorized like the same request alone: a member may
		// not create a Project, and that fails the whole transaction.
		r = member.Do("POST", "fhir/R4", map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			entry("POST", "Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Refused"}}}),
			entry("POST", "Project", map[string]any{"resourceType": "Project", "name": "x"}),
		}}, "")
		wantOutcome(t, "member transaction", r, 403, "", "")
		if n := countPatients(t, c, "Refused"); n != 0 {
			t.Errorf("refused transaction kept %d", n)
		}

		// urn:uuid references that go round in a circle cannot be created.
		u1, u2 := "urn:uuid:"+uuid.NewString(), "urn:uuid:"+uuid.NewString()
		r = c.Do("POST", "fhir/R4", map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"fullUrl": u1, "request": map[string]any{"method": "POST", "url": "Patient"},
				"resource": map[string]any{"resourceType": "Patient", "link": []any{map[string]any{"type": "seealso", "other": map[string]any{"reference": u2}}}}},
			map[string]any{"fullUrl": u2, "request": map[string]any{"method": "POST", "url": "Patient"},
				"resource": map[string]any{"resourceType": "Patient", "link": []any{map[string]any{"type": "seealso", "other": map[string]any{"reference": u1}}}}},
		}}, "")
		wantOutcome(t, "circular", r, 400, "invalid", "")
	})
}
