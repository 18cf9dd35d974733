package fhirapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestErrorsAndLimits: client mistakes get the reference's 4xx outcomes.
func TestErrorsAndLimits(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "errors")
		id := str(c.Create(map[string]any{"resourceType": "Patient"}), "id")
		big := `{"resourceType":"Patient","text":{"status":"generated","div":"` + strings.Repeat("x", 1<<20) + `"}}`
		justUnder := `{"resourceType":"Patient","name":[{"text":"` + strings.Repeat("y", (1<<20)-69) + `"}]}`
		for _, tc := range []struct {
			what, method, path string
			body               any
			ct                 string
			status             int
			code, text         string
		}{
			{"body over 1 MiB", "POST", "fhir/R4/Patient", big, "", 413, "too-long", ""},
			{"update over 1 MiB", "PUT", "fhir/R4/Patient/" + id, big, "", 413, "too-long", ""},
			{"patch over 1 MiB", "PATCH", "fhir/R4/Patient/" + id, `[{"op":"add","path":"/gender","value":"` + strings.Repeat("z", 1<<20) + `"}]`, "application/json-patch+json", 413, "too-long", ""},
			{"text/plain create", "POST", "fhir/R4/Patient", `{"resourceType":"Patient"}`, "text/plain", 415, "not-supported", ""},
			{"form create", "POST", "fhir/R4/Patient", `resourceType=Patient`, "application/x-www-form-urlencoded", 415, "not-supported", ""},
			{"xml create", "POST", "fhir/R4/Patient", `<Patient/>`, "application/fhir+xml", 415, "not-supported", ""},
			{"malformed JSON", "POST", "fhir/R4/Patient", `{"resourceType":"Patient",`, "", 400, "invalid", "Content could not be parsed"},
			{"two JSON values", "POST", "fhir/R4/Patient", `{"resourceType":"Patient"} {}`, "", 400, "invalid", "Content could not be parsed"},
			{"JSON array", "POST", "fhir/R4/Patient", `[{"resourceType":"Patient"}]`, "", 400, "invalid", ""},
			{"JSON string", "POST", "fhir/R4/Patient", `"Patient"`, "", 400, "invalid", ""},
			{"missing resourceType", "POST", "fhir/R4/Patient", `{"gender":"male"}`, "", 400, "invalid", ""},
			{"wrong resourceType", "POST", "fhir/R4/Patient", `{"resourceType":"Practitioner"}`, "", 400, "invalid", "Incorrect resource type: expected Patient, but found Practitioner"},
			{"unknown resourceType in body", "POST", "fhir/R4/Patient", `{"resourceType":"Nope"}`, "", 400, "invalid", ""},
			{"unknown type: search", "GET", "fhir/R4/Nope", nil, "", 404, "not-found", ""},
			{"unknown type: read", "GET", "fhir/R4/Nope/" + id, nil, "", 404, "not-found", ""},
			{"unknown type: create", "POST", "fhir/R4/Nope", `{"resourceType":"Nope"}`, "", 404, "not-found", ""},
			{"unmatched FHIR route", "GET", "fhir/R4/Patient/" + id + "/x/y/z", nil, "", 404, "not-found", ""},
			{"unknown path", "GET", "nope", nil, "", 404, "not-found", ""},
			{"unknown path POST", "POST", "admin/nope/x", `{}`, "", 404, "not-found", ""},
		} {
			r := c.Do(tc.method, tc.path, tc.body, tc.ct)
			wantOutcome(t, tc.what, r, tc.status, tc.code, tc.text)
		}
		for _, ct := range []string{"application/fhir+json", "application/fhir+json; charset=utf-8", "application/json", "Application/JSON; charset=UTF-8", "application/scim+json"} {
			if r := c.Do("POST", "fhir/R4/Patient", `{"resourceType":"Patient"}`, ct); r.Status != 201 {
				t.Errorf("create as %q: %d %s", ct, r.Status, r.Body)
			}
		}
		if r := c.Do("POST", "fhir/R4/Patient", justUnder, ""); r.Status != 201 {
			t.Errorf("body just under 1 MiB: %d %.200s", r.Status, r.Body)
		}
	})
}

// TestNoClientMistakeIs5xx throws malformed requests at every route shape;
// none may answer 5xx (the reference client retries 5xx, even POSTs).
func TestNoClientMistakeIs5xx(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "nasty")
		id := str(c.Create(map[string]any{"resourceType": "Patient"}), "id")
		ids := []string{"x", "..", "a%2Fb", "%00", strings.Repeat("a", 65), strings.Repeat("9", 300), "'%20OR%201=1", "%E2%80%AE", "Patient"}
		var paths []string
		for _, bad := range ids {
			paths = append(paths, "fhir/R4/Patient/"+bad, "fhir/R4/Patient/"+bad+"/_history", "fhir/R4/Patient/"+id+"/_history/"+bad)
		}
		queries := []string{
			"_id=%zz", "name=%", "name=%zz", "%zz", "_count=%zz", "_count=1e9", "_count=99999999999999999999", "_count=-0",
			"_offset=99999999999999999999", "_offset=10001", "_offset=1e3", "_lastUpdated=gt", "_lastUpdated=ge%zz",
			"_lastUpdated=2021-02-30", "_lastUpdated=lt99999-01-01", "_lastUpdated=eq-2021", "_sort=", "_sort=-", "_sort=_id,-_lastUpdated",
			"identifier=|", "identifier=||||", "identifier:missing=", "name:exact=", "name=" + strings.Repeat("%F0%9F%98%80", 500),
			"name=a&name=b&name=c&name=d&name=e&name=f", "=", "&&&", "name", "_total=estimate", "active=%00", "_include=Patient:x",
			"birthdate=ge1900&birthdate=lt1800", "birthdate=2000-01-01T25:00:00Z", "name=\\", "name=a\\,b", "_id=" + strings.Repeat("a,", 2000),
		}
		for _, q := range queries {
			paths = append(paths, "fhir/R4/Patient?"+q, "fhir/R4/ProjectMembership?"+q, "fhir/R4/Patient/"+id+"/_history?_count="+q)
		}
		for _, p := range paths {
			for _, m := range []string{"GET", "DELETE"} {
				if r := c.Do(m, p, nil, ""); r.Status >= 500 {
					t.Errorf("%s %s: %d %s", m, p, r.Status, r.Body)
				}
			}
		}
		// Invalid percent-encoding in the path: Go's client refuses to send
		// it, so the request line is written by hand.
		for _, p := range []string{"/fhir/R4/Patient/%zz", "/fhir/R4/%zz", "/fhir/R4/Patient/" + id + "/_history/%z", "/%zz"} {
			req, _ := http.NewRequest("GET", s.URL, nil)
			req.URL.Opaque = p
			req.Header.Set("Authorization", "Bearer "+c.Token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode >= 500 || resp.StatusCode == 200 {
				t.Errorf("GET %s: %d", p, resp.StatusCode)
			}
		}
		bodies := []string{
			``, `null`, `[]`, `[1,2]`, `{}`, `"x"`, `1`, `true`, `{"resourceType":null}`, `{"resourceType":1}`,
			`{"resourceType":"Patient","id":1}`, `{"resourceType":"Patient","meta":"x"}`, `{"resourceType":"Patient","meta":{"project":5}}`,
			`{"resourceType":"Patient","name":"not an array"}`, `{"resourceType":"Patient","birthDate":"yesterday"}`,
			`{"resourceType":"Patient","telecom":[{"system":"email","value":{"x":1}}]}`, `{"resourceType":"Patient","identifier":[null,1,"x"]}`,
			`{"resourceType":"Patient","managingOrganization":{"reference":"Organization/../../x"}}`,
			`{"resourceType":"Patient","link":[{"other":{"reference":"Patient/` + strings.Repeat("a", 100) + `"}}]}`,
			`{"resourceType":"Patient","x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
			"\xff\xfe", `{"resourceType":"Patient","a":"\ud800"}`,
		}
		for _, b := range bodies {
			for _, target := range []struct{ method, path, ct string }{
				{"POST", "fhir/R4/Patient", "application/fhir+json"},
				{"PUT", "fhir/R4/Patient/" + id, "application/fhir+json"},
				{"PUT", "fhir/R4/Patient/x%20y", "application/fhir+json"},
				{"PATCH", "fhir/R4/Patient/" + id, "application/json-patch+json"},
				{"POST", "fhir/R4/Patient/_search", "application/x-www-form-urlencoded"},
				{"POST", "fhir/R4/Patient", "application/json; charset=%%%"},
				{"POST", "oauth2/token", "application/x-www-form-urlencoded"},
			} {
				if r := c.DoWith(target.method, target.path, nil, "", map[string]string{"Content-Type": target.ct}); r.Status >= 500 {
					t.Errorf("%s %s without body: %d %s", target.method, target.path, r.Status, r.Body)
				}
				if r := c.Do(target.method, target.path, b, target.ct); r.Status >= 500 {
					t.Errorf("%s %s %.60q: %d %s", target.method, target.path, b, r.Status, r.Body)
				}
			}
		}
		patches := []string{
			`[{"op":"move","from":"/id","path":"/x"}]`, `[{"op":"copy","from":"/nothing","path":"/x"}]`, `[{"op":"add","path":"","value":[]}]`,
			`[{"op":"add","path":"","value":{"resourceType":"Patient","id":"` + id + `"}}]`, `[{"op":"replace","path":"/meta","value":null}]`,
			`[{"op":"remove","path":"/meta"}]`, `[{"op":"add","path":"/name/-1/x","value":1}]`, `[{"op":"add","path":"/a/b/c/d","value":1}]`,
			`[{"op":"nope"}]`, `[{}]`, `[null]`, `[{"op":"replace","path":"/id","value":null}]`, `[{"op":"add","path":"/meta/project","value":"other"}]`,
		}
		for _, p := range patches {
			if r := c.Do("PATCH", "fhir/R4/Patient/"+id, p, "application/json-patch+json"); r.Status >= 500 {
				t.Errorf("PATCH %s: %d %s", p, r.Status, r.Body)
			}
		}
		// The resource survived all of it in its own project.
		r := c.Do("GET", "fhir/R4/Patient/"+id, nil, "")
		if r.Status != 200 || str(r.JSON(), "meta", "project") != c.ProjectID {
			t.Errorf("after the nasty inputs: %d %s", r.Status, r.Body)
		}
	})
}
