package fhirapi_test

import (
	"fmt"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// BenchmarkBundle measures Bundles through the real server on every backend:
// a 100-entry transaction of creates (one store transaction), and a batch of
// 10 reads against the same 10 reads sent one by one (what the client's
// auto-batching saves):
//
//	go test ./internal/handlers/fhirapi -run '^$' -bench Bundle -benchtime 200x
func BenchmarkBundle(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			s := servertest.Start(b, be)
			c := s.NewProject(b, "bench-bundle")
			b.Run("transaction100", func(b *testing.B) {
				es := make([]any, 100)
				for i := range es {
					es[i] = entry("POST", "Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": fmt.Sprint("Bench", i)}}})
				}
				tx := map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": es}
				b.ResetTimer()
				for range b.N {
					if r := c.Do("POST", "fhir/R4", tx, ""); r.Status != 200 {
						b.Fatalf("transaction: %d %.200s", r.Status, r.Body)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/100, "us/entry")
			})
			var ids []string
			for range 10 {
				ids = append(ids, c.Create(map[string]any{"resourceType": "Patient"})["id"].(string))
			}
			b.Run("batch10reads", func(b *testing.B) {
				es := make([]any, len(ids))
				for i, id := range ids {
					es[i] = entry("GET", "Patient/"+id, nil)
				}
				batch := map[string]any{"resourceType": "Bundle", "type": "batch", "entry": es}
				for range b.N {
					if r := c.Do("POST", "fhir/R4", batch, ""); r.Status != 200 {
						b.Fatalf("batch: %d", r.Status)
					}
				}
			})
			b.Run("10reads", func(b *testing.B) {
				for range b.N {
					for _, id := range ids {
						if r := c.Do("GET", "fhir/R4/Patient/"+id, nil, ""); r.Status != 200 {
							b.Fatalf("read: %d", r.Status)
						}
					}
				}
			})
		})
	}
}
