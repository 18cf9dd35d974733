package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// auditEvent is shaped as the bot executions' AuditEvents are.
func auditEvent(now time.Time) fhir.Resource {
	bot := "Bot/0193a2b4-5c6d-7e8f-9a0b-c1d2e3f4a5b6"
	ts := now.Format(fhir.TimeFormat)
	return fhir.Resource{
		"resourceType": "AuditEvent",
		"type":         map[string]any{"system": "https://medplum.com/CodeSystem/audit-event", "code": "execute"},
		"recorded":     ts,
		"period":       map[string]any{"start": ts, "end": ts},
		"agent": []any{
			map[string]any{"who": map[string]any{"reference": "ClientApplication/0193a2b4-5c6d-7e8f-9a0b-c1d2e3f4a5b7"}, "requestor": true},
			map[string]any{"who": map[string]any{"reference": bot}, "requestor": false},
		},
		"source":  map[string]any{"observer": map[string]any{"reference": bot}},
		"entity":  []any{map[string]any{"what": map[string]any{"reference": bot}, "role": map[string]any{"code": "4"}}},
		"outcome": "0",
	}
}

// BenchmarkCreateManyAuditEvents writes AuditEvents in batches of 128, as
// the bot audit writer does under load; ns/op is per event.
func BenchmarkCreateManyAuditEvents(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			s, err := sqlstore.Open(context.Background(), be.NewURL(b), sqlstore.Options{Migrate: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			const batch = 128
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				list := make([]fhir.Resource, min(batch, b.N-done))
				for i := range list {
					list[i] = auditEvent(time.Now())
				}
				if err := s.InTx(ctx, func(tx store.Store) error {
					return tx.CreateMany(ctx, list, store.Write{Project: "p1", Author: fhir.Reference{Reference: "system"}})
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
