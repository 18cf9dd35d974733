package fhirservice

import (
	"encoding/json"
	"testing"
)

// FuzzBundleRequest: any body either is refused with a 400 or parses into
// entries whose requests build without panicking, whose transaction order is
// a permutation of the entries, and whose rewritten bodies are JSON.
func FuzzBundleRequest(f *testing.F) {
	f.Add([]byte(`{"resourceType":"Bundle","type":"batch","entry":[{"request":{"method":"GET","url":"Patient/1"}}]}`))
	f.Add([]byte(`{"resourceType":"Bundle","type":"transaction","entry":[` +
		`{"fullUrl":"urn:uuid:00000000-0000-0000-0000-000000000001","request":{"method":"POST","url":"Patient"},"resource":{"resourceType":"Patient","id":"urn:uuid:00000000-0000-0000-0000-000000000001"}},` +
		`{"request":{"method":"POST","url":"Observation","ifNoneExist":"subject=urn:uuid:00000000-0000-0000-0000-000000000001"},"resource":{"resourceType":"Observation","subject":{"reference":"urn:uuid:00000000-0000-0000-0000-000000000001"},"n":1.50}},` +
		`{"request":{"method":"PATCH","url":"Patient/1"},"resource":{"resourceType":"Binary","data":"W3sib3AiOiJyZW1vdmUiLCJwYXRoIjoiL2EifV0="}}]}`))
	f.Add([]byte(`{"resourceType":"Bundle","type":"transaction","entry":[{"fullUrl":"urn:uuid:00000000-0000-0000-0000-000000000001","request":{"method":"POST","url":"Patient"},"resource":{"x":"urn:uuid:00000000-0000-0000-0000-000000000002"}},{"fullUrl":"urn:uuid:00000000-0000-0000-0000-000000000002","request":{"method":"POST","url":"Patient"},"resource":{"x":"urn:uuid:00000000-0000-0000-0000-000000000001"}}]}`))
	f.Add([]byte(`{"resourceType":"Bundle","type":"batch","entry":[1,null,{"request":null}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := parseBundle(body, 1000)
		if err != nil {
			return
		}
		svc := &Service{base: "http://x/fhir/R4/"}
		run := &bundleRun{svc: svc, bundle: b, ids: map[string]string{
			"urn:uuid:00000000-0000-0000-0000-000000000001": "Patient/p1",
		}}
		for _, e := range b.Entry {
			req, err := run.request(e)
			if err != nil {
				continue
			}
			if len(req.Body) > 0 && req.ContentType == FHIRJSON && !json.Valid(req.Body) && json.Valid(e.Resource) {
				t.Fatalf("rewritten body is not JSON: %q from %q", req.Body, e.Resource)
			}
		}
		order, err := transactionOrder(b.Entry)
		if err != nil {
			return
		}
		seen := make([]bool, len(b.Entry))
		for _, i := range order {
			if i < 0 || i >= len(seen) || seen[i] {
				t.Fatalf("order %v is not a permutation of %d entries", order, len(b.Entry))
			}
			seen[i] = true
		}
		if len(order) != len(b.Entry) {
			t.Fatalf("order %v misses entries", order)
		}
	})
}
