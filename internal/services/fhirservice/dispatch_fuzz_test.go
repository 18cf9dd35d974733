package fhirservice_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store/storetest"
)

// FuzzDispatch: whatever a bot or a Bundle entry asks the dispatcher
// (method, URL, content type, If-None-Exist, body), the answer is a 2xx or a 4xx, never a
// 5xx, and a FHIR JSON answer is JSON.
func FuzzDispatch(f *testing.F) {
	s := servertest.Start(f, storetest.Backends(f)[0])
	c := s.NewProject(f, "fuzz")
	ctx := context.Background()
	p, err := principal.ForUser(ctx, s.Store, "ClientApplication/"+c.ClientID)
	if err != nil {
		f.Fatal(err)
	}
	pid := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Fuzz"}}})["id"].(string)
	for _, seed := range []struct{ method, url, ct, body, ifNoneExist string }{
		{"GET", "Patient/" + pid, "", "", ""},
		{"GET", "Patient?name=fuzz&_count=2", "", "", ""},
		{"GET", "Patient/" + pid + "/_history/1", "", "", ""},
		{"PUT", "Patient/" + pid, "application/fhir+json", `{"resourceType":"Patient","id":"` + pid + `"}`, ""},
		{"PATCH", "Patient/" + pid, "application/json-patch+json", `[{"op":"add","path":"/active","value":true}]`, ""},
		{"POST", "Patient/_search", "application/x-www-form-urlencoded", "name=fuzz", ""},
		{"POST", "Binary?_filename=x", "text/plain", "hello", ""},
		{"DELETE", "Observation/x", "", "", ""},
		{"GET", "/fhir/R4/Patient/..%2F..%2Fetc", "", "", ""},
		{"POST", "Project", "application/json", `{"resourceType":"Project","superAdmin":true}`, ""},
		{"GET", "StructureDefinition?name=Patient", "", "", ""},
		// Conditional interactions.
		{"POST", "Patient", "application/fhir+json", `{"resourceType":"Patient"}`, "name=fuzz"},
		{"POST", "Patient", "application/fhir+json", `{"resourceType":"Patient","id":"x"}`, "?_id=" + pid},
		{"POST", "Binary", "text/plain", "hello", "_count=1"},
		{"PUT", "Patient?name=fuzz", "application/fhir+json", `{"resourceType":"Patient","id":"` + pid + `"}`, ""},
		{"PUT", "Patient?identifier=urn:f|1", "application/fhir+json", `{"resourceType":"Patient"}`, ""},
		{"PATCH", "Patient?_id=" + pid, "application/json-patch+json", `[{"op":"add","path":"/active","value":true}]`, ""},
		{"DELETE", "Patient?name=nobody&_filter=name%20eq%20x", "", "", ""},
		{"DELETE", "Patient", "", "", ""},
	} {
		f.Add(seed.method, seed.url, seed.ct, seed.ifNoneExist, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, method, url, ct, ifNoneExist string, body []byte) {
		resp := s.Service.Do(ctx, p, &fhirservice.Request{Method: method, URL: url, ContentType: ct, IfNoneExist: ifNoneExist, Body: body, Accept: "application/fhir+json"})
		if resp.Status >= 500 || resp.Status < 200 {
			t.Fatalf("%s %q (%s, %q): %d %s %v", method, url, ct, body, resp.Status, resp.Body, resp.Err)
		}
		if strings.HasPrefix(resp.ContentType, "application/fhir+json") && !json.Valid(resp.Body) {
			t.Fatalf("%s %q: answer is not JSON: %q", method, url, resp.Body)
		}
	})
}
