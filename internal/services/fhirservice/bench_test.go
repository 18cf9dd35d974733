package fhirservice_test

import (
	"context"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

// BenchmarkServiceOverhead: what the FHIR service adds to a read and a
// search (authorization, the rules, presentation, the dispatcher's parsing
// and encoding) over the store alone, on each backend:
//
//	go test ./internal/services/fhirservice -run '^$' -bench ServiceOverhead
func BenchmarkServiceOverhead(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			s := servertest.Start(b, be)
			c := s.NewProject(b, "bench")
			id := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Bench"}}})["id"].(string)
			ctx := context.Background()
			p, err := principal.ForUser(ctx, s.Store, "ClientApplication/"+c.ClientID)
			if err != nil {
				b.Fatal(err)
			}
			b.Run("store read", func(b *testing.B) {
				for b.Loop() {
					if _, err := s.Store.Read(ctx, p.Scope(), "Patient", id); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("service read", func(b *testing.B) {
				for b.Loop() {
					if _, err := s.Service.Read(ctx, p, "Patient", id); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("dispatcher read", func(b *testing.B) {
				req := &fhirservice.Request{Method: "GET", URL: "Patient/" + id}
				for b.Loop() {
					if r := s.Service.Do(ctx, p, req); r.Status != 200 {
						b.Fatal(r.Status)
					}
				}
			})
			b.Run("store search", func(b *testing.B) {
				for b.Loop() {
					req, _ := fhir.ParseSearch("Patient", "name=bench")
					if _, err := s.Store.Search(ctx, store.ProjectScope(c.ProjectID), req); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("dispatcher search", func(b *testing.B) {
				req := &fhirservice.Request{Method: "GET", URL: "Patient?name=bench"}
				for b.Loop() {
					if r := s.Service.Do(ctx, p, req); r.Status != 200 {
						b.Fatal(r.Status)
					}
				}
			})
		})
	}
}
