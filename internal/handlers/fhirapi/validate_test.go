package fhirapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store"
)

// issuesOf decodes an OperationOutcome's issues.
func issuesOf(t *testing.T, r *servertest.Response) []fhir.Issue {
	t.Helper()
	var o fhir.OperationOutcome
	if err := json.Unmarshal(r.Body, &o); err != nil || o.ResourceType != "OperationOutcome" {
		t.Fatalf("not an OperationOutcome: %s", r.Body)
	}
	return o.Issue
}

// hasIssue reports whether an issue names expr and says text.
func hasIssue(issues []fhir.Issue, expr, text string) bool {
	for _, is := range issues {
		if is.Severity == "error" && len(is.Expression) == 1 && is.Expression[0] == expr && is.Details != nil && strings.Contains(is.Details.Text, text) {
			return true
		}
	}
	return false
}

const validPatient = `{"resourceType":"Patient","meta":{"tag":[{"system":"urn:t","code":"v"}]},
"extension":[{"url":"http://hl7.org/fhir/us/core/StructureDefinition/us-core-birthsex","valueCode":"F"}],
"identifier":[{"system":"urn:mrn","value":"1"}],"active":true,"name":[{"family":"Lovelace","given":["Ada","King"]}],
"gender":"female","birthDate":"1815-12-10","_birthDate":{"extension":[{"url":"http://hl7.org/fhir/StructureDefinition/patient-birthTime","valueDateTime":"1815-12-10T10:00:00Z"}]},
"multipleBirthBoolean":false,"generalPractitioner":[{"reference":"#org1"}],
"contained":[{"resourceType":"Organization","id":"org1","name":"Clinic"}]}`

const validObservation = `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},
"effectiveDateTime":"2024-01-01T10:00:00Z","valueQuantity":{"value":72.5,"unit":"/min","system":"http://unitsofmeasure.org","code":"/min"},
"component":[{"code":{"text":"a"},"valueString":"x"},{"code":{"text":"b"},"valueInteger":3}]}`

var invalidPatients = []struct{ body, expr, text string }{
	{`{"resourceType":"Patient","gender":5}`, "Patient.gender", "expected a string"},
	{`{"resourceType":"Patient","foo":"bar"}`, "Patient.foo", "Invalid additional property"},
	{`{"resourceType":"Patient","birthDate":"not-a-date"}`, "Patient.birthDate", "Invalid date"},
	{`{"resourceType":"Patient","name":"Ada"}`, "Patient.name", "Expected an array"},
}

// TestWritesAreValidated: the four invalid Patients of issue 19 answer 400
// naming the element (create, update, patch), a valid rich Patient and
// Observation pass, and nothing invalid is stored.
func TestWritesAreValidated(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "validation")
		for _, ip := range invalidPatients {
			r := c.Do("POST", "fhir/R4/Patient", ip.body, "")
			if r.Status != 400 || !hasIssue(issuesOf(t, r), ip.expr, ip.text) {
				t.Errorf("create %s: %d %s", ip.body, r.Status, r.Body)
			}
		}
		r := c.Do("POST", "fhir/R4/Patient", `{"resourceType":"Patient","gender":5,"foo":"bar","birthDate":"x","name":"Ada"}`, "")
		if is := issuesOf(t, r); r.Status != 400 || len(is) != 4 {
			t.Errorf("four errors: %d, %d issues: %s", r.Status, len(is), r.Body)
		}
		if r := c.Do("GET", "fhir/R4/Patient?_summary=count", nil, ""); r.JSON()["total"] != float64(0) {
			t.Errorf("invalid patients were stored: %s", r.Body)
		}
		p := c.Do("POST", "fhir/R4/Patient", validPatient, "")
		if p.Status != 201 {
			t.Fatalf("valid patient: %d %s", p.Status, p.Body)
		}
		if o := c.Do("POST", "fhir/R4/Observation", validObservation, ""); o.Status != 201 {
			t.Fatalf("valid observation: %d %s", o.Status, o.Body)
		}
		pat := p.JSON()
		id := pat["id"].(string)
		pat["gender"] = float64(5)
		if r := c.Do("PUT", "fhir/R4/Patient/"+id, pat, ""); r.Status != 400 || !hasIssue(issuesOf(t, r), "Patient.gender", "expected a string") {
			t.Errorf("update: %d %s", r.Status, r.Body)
		}
		r = c.Do("PATCH", "fhir/R4/Patient/"+id, `[{"op":"add","path":"/birthDate","value":"not-a-date"}]`, "application/json-patch+json")
		if r.Status != 400 || !hasIssue(issuesOf(t, r), "Patient.birthDate", "Invalid date") {
			t.Errorf("patch: %d %s", r.Status, r.Body)
		}
		r = c.Do("PATCH", "fhir/R4/Patient/"+id, `[{"op":"replace","path":"/name/0/given/1","value":7}]`, "application/json-patch+json")
		if r.Status != 400 || !hasIssue(issuesOf(t, r), "Patient.name[0].given[1]", "expected a string") {
			t.Errorf("patch given: %d %s", r.Status, r.Body)
		}
		if got := c.Do("GET", "fhir/R4/Patient/"+id, nil, "").JSON(); got["gender"] != "female" || got["birthDate"] != "1815-12-10" {
			t.Errorf("the stored patient changed: %v", got)
		}
	})
}

// TestTransactionWithAnInvalidEntry: one invalid entry fails the whole
// transaction with 400 naming it, and nothing is written.
func TestTransactionWithAnInvalidEntry(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "validation-tx")
		bundle := `{"resourceType":"Bundle","type":"transaction","entry":[
{"fullUrl":"urn:uuid:c757873d-ec9a-4326-a141-556f43239520","request":{"method":"POST","url":"Patient"},"resource":` + validPatient + `},
{"request":{"method":"POST","url":"Observation"},"resource":` + validObservation + `},
{"request":{"method":"POST","url":"Patient"},"resource":{"resourceType":"Patient","birthDate":"not-a-date"}}]}`
		r := c.Do("POST", "fhir/R4", bundle, "")
		if r.Status != 400 || !hasIssue(issuesOf(t, r), "Patient.birthDate", "Bundle.entry[2]: Invalid date") {
			t.Errorf("transaction: %d %s", r.Status, r.Body)
		}
		for _, typ := range []string{"Patient", "Observation"} {
			if r := c.Do("GET", "fhir/R4/"+typ+"?_summary=count", nil, ""); r.JSON()["total"] != float64(0) {
				t.Errorf("%s written by a failed transaction: %s", typ, r.Body)
			}
		}
		// A batch answers the invalid entry alone 400.
		batch := strings.Replace(bundle, `"transaction"`, `"batch"`, 1)
		r = c.Do("POST", "fhir/R4", batch, "")
		if r.Status != 200 {
			t.Fatalf("batch: %d %s", r.Status, r.Body)
		}
		es := entries(t, r)
		if len(es) != 3 {
			t.Fatalf("batch entries: %s", r.Body)
		}
		for i, want := range []string{"201", "201", "400"} {
			resp, _ := es[i]["response"].(map[string]any)
			if st, _ := resp["status"].(string); !strings.HasPrefix(st, want) {
				t.Errorf("batch entry %d: %v, want %s", i, resp, want)
			}
		}
	})
}

// TestValidateOperation: $validate at the type and instance level answers
// 200 with the same checks, writing nothing.
func TestValidateOperation(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "validate-op")
		r := c.Do("POST", "fhir/R4/Patient/$validate", validPatient, "")
		if is := issuesOf(t, r); r.Status != 200 || len(is) != 1 || is[0].Severity != "information" || is[0].Details.Text != "All OK" {
			t.Errorf("valid: %d %s", r.Status, r.Body)
		}
		for _, ip := range invalidPatients {
			r := c.Do("POST", "fhir/R4/Patient/$validate", ip.body, "")
			if r.Status != 200 || !hasIssue(issuesOf(t, r), ip.expr, ip.text) {
				t.Errorf("$validate %s: %d %s", ip.body, r.Status, r.Body)
			}
		}
		params := `{"resourceType":"Parameters","parameter":[{"name":"mode","valueCode":"create"},{"name":"resource","resource":{"resourceType":"Patient","gender":5}}]}`
		if r := c.Do("POST", "fhir/R4/Patient/$validate", params, ""); r.Status != 200 || !hasIssue(issuesOf(t, r), "Patient.gender", "expected a string") {
			t.Errorf("Parameters: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Observation/$validate", `{"resourceType":"Patient"}`, ""); r.Status != 200 || !hasIssue(issuesOf(t, r), "resourceType", "Incorrect resource type") {
			t.Errorf("wrong type: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Patient/$validate?mode=bogus", validPatient, ""); r.Status != 400 {
			t.Errorf("bad mode: %d %s", r.Status, r.Body)
		}
		if r := c.Do("GET", "fhir/R4/Patient?_summary=count", nil, ""); r.JSON()["total"] != float64(0) {
			t.Errorf("$validate wrote: %s", r.Body)
		}
		pat := c.Create(map[string]any{"resourceType": "Patient", "gender": "male"})
		id := pat["id"].(string)
		if r := c.Do("POST", "fhir/R4/Patient/"+id+"/$validate", nil, ""); r.Status != 200 || issuesOf(t, r)[0].Details.Text != "All OK" {
			t.Errorf("stored: %d %s", r.Status, r.Body)
		}
		pat["birthDate"] = "not-a-date"
		if r := c.Do("POST", "fhir/R4/Patient/"+id+"/$validate", pat, ""); r.Status != 200 || !hasIssue(issuesOf(t, r), "Patient.birthDate", "Invalid date") {
			t.Errorf("instance body: %d %s", r.Status, r.Body)
		}
		pat["birthDate"] = "2000-01-01"
		pat["id"] = "other"
		if r := c.Do("POST", "fhir/R4/Patient/"+id+"/$validate", pat, ""); r.Status != 200 || !hasIssue(issuesOf(t, r), "Patient.id", "Incorrect resource ID") {
			t.Errorf("instance id: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Patient/"+id+"/$validate?mode=delete", nil, ""); r.Status != 200 || issuesOf(t, r)[0].Details.Text != "All OK" {
			t.Errorf("delete mode: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Patient/nope/$validate", nil, ""); r.Status != 404 {
			t.Errorf("unknown instance: %d %s", r.Status, r.Body)
		}
		if got := c.Do("GET", "fhir/R4/Patient/"+id, nil, "").JSON(); got["birthDate"] != nil {
			t.Errorf("instance $validate wrote: %v", got)
		}
	})
}

// TestServerWritesAreValid: what the server writes itself, partly straight
// to the store (the project, its client and memberships, a Bot with its
// membership and code, the AuditEvents and AsyncJobs of executions), is
// valid FHIR (decision 44).
func TestServerWritesAreValid(t *testing.T) {
	echo := readWasm(t, "../../../examples/c-echo/c-echo.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "server-writes")
		bot := deployBot(t, c, echo, map[string]any{"name": "echo"})
		if r := c.Do("POST", "fhir/R4/Bot/"+bot+"/$execute", "hi", "text/plain"); r.Status != 200 {
			t.Fatalf("execute: %d %s", r.Status, r.Body)
		}
		awaitJob(t, c, submit(t, c, bot, "hi", "text/plain"))
		awaitAudit(t, c, "entity=Bot/"+bot, nil)
		checked := 0
		for _, typ := range []string{"Project", "ClientApplication", "ProjectMembership", "Bot", "Binary", "AuditEvent", "AsyncJob", "Login", "User", "JsonWebKey"} {
			found, err := store.SearchResources(context.Background(), s.Store, store.AllProjects, typ, "_count=1000")
			if err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
			for _, res := range found {
				checked++
				if issues := fhir.Validate(res); len(issues) > 0 {
					t.Errorf("stored %s/%s is not valid: %+v (%v)", typ, res.ID(), issues, *issues[0].Details)
				}
			}
		}
		if checked < 8 {
			t.Errorf("only %d resources checked", checked)
		}
	})
}
