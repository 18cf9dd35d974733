package fhirapi_test

import (
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// BenchmarkGraphQL measures $graphql through the real server on every
// backend: one resource by id against the same REST read, and a list of 20
// Observations with each subject resolved (21 reads):
//
//	go test ./internal/handlers/fhirapi -run '^$' -bench GraphQL -benchtime 200x
func BenchmarkGraphQL(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			s := servertest.Start(b, be)
			c := s.NewProject(b, "bench-graphql")
			pid := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Bench"}}})["id"].(string)
			for range 20 {
				c.Create(map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "b"},
					"subject": map[string]any{"reference": "Patient/" + pid}})
			}
			run := func(b *testing.B, q string) {
				body := map[string]any{"query": q}
				for range b.N {
					if r := c.Do("POST", "fhir/R4/$graphql", body, "application/json"); r.Status != 200 {
						b.Fatalf("graphql: %d %.200s", r.Status, r.Body)
					}
				}
			}
			b.Run("read", func(b *testing.B) { run(b, `{ Patient(id: "`+pid+`") { id name { family } } }`) })
			b.Run("rest-read", func(b *testing.B) {
				for range b.N {
					if r := c.Do("GET", "fhir/R4/Patient/"+pid, nil, ""); r.Status != 200 {
						b.Fatal(r.Status)
					}
				}
			})
			b.Run("list20-with-references", func(b *testing.B) {
				run(b, `{ ObservationList(subject: "Patient/`+pid+`", _count: 20) { id subject { resource { ... on Patient { name { family } } } } } }`)
			})
		})
	}
}
