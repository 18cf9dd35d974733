package sqlstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
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
			s := openStore(b, be.NewURL(b))
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

// BenchmarkReadDuringAuditWrites reads one resource by id while another
// goroutine commits batches of 100 AuditEvents, as bot executions do under
// load; it reports the read latency's p50, p99 and p99.9 in µs, with the
// SQLite read cache and without it (reads from the database each time).
func BenchmarkReadDuringAuditWrites(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		for _, cached := range []bool{true, false} {
			if cached && be.Name != "sqlite" {
				continue // PostgreSQL has no cache
			}
			name := be.Name + "/db"
			if cached {
				name = be.Name + "/cache"
			}
			b.Run(name, func(b *testing.B) {
				s := openStore(b, be.NewURL(b))
				if !cached {
					sqlstore.DisableReadCache(s)
				}
				ctx := context.Background()
				rec, err := s.Create(ctx, fhir.Resource{"resourceType": "Bot", "name": "x"}, store.Write{Project: "p1"})
				if err != nil {
					b.Fatal(err)
				}
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						list := make([]fhir.Resource, 100)
						for i := range list {
							list[i] = auditEvent(time.Now())
						}
						if err := s.CreateMany(ctx, list, store.Write{Project: "p1"}); err != nil {
							b.Error(err)
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
				}()
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for b.Loop() {
					t0 := time.Now()
					if _, err := s.Read(ctx, store.AllProjects, "Bot", rec.ID); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
					time.Sleep(100 * time.Microsecond) // readers arrive spread out, as requests do
				}
				b.StopTimer()
				close(stop)
				wg.Wait()
				slices.Sort(lat)
				q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
				b.ReportMetric(q(0.5), "p50-µs")
				b.ReportMetric(q(0.99), "p99-µs")
				b.ReportMetric(q(0.999), "p99.9-µs")
			})
		}
	}
}

// BenchmarkCreateDurability measures what SQLite's synchronous setting costs
// a write: one Patient per transaction, as POST /fhir/R4/Patient writes it,
// with NORMAL (the WAL is synced at checkpoints only: a commit survives the
// process crashing, not the machine) and FULL (the WAL is synced at every
// commit: it survives a power loss), from one writer and from eight (SQLite
// serialises writers, so eight only show how the lock's waits add up). The
// database lives in the test's temporary directory: measure on the disk the
// data directory will use, since the cost is one fsync per commit.
func BenchmarkCreateDurability(b *testing.B) {
	patient := func(i int) fhir.Resource {
		return fhir.Resource{"resourceType": "Patient", "active": true, "gender": "female", "birthDate": "1970-01-01",
			"identifier": []any{map[string]any{"system": "urn:bench:mrn", "value": fmt.Sprint("MRN", i)}},
			"name":       []any{map[string]any{"family": "Durable", "given": []any{"Bench"}}}}
	}
	for _, mode := range []string{"NORMAL", "FULL"} {
		for _, writers := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/writers=%d", mode, writers), func(b *testing.B) {
				s, err := sqlstore.Open(context.Background(), filepath.Join(b.TempDir(), "sandbot.db"),
					sqlstore.Options{Migrate: true, SQLiteSynchronous: mode})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				ctx := context.Background()
				var n atomic.Int64
				// RunParallel starts GOMAXPROCS × parallelism goroutines.
				b.SetParallelism(max(1, writers/goruntime.GOMAXPROCS(0)))
				b.ResetTimer()
				if writers == 1 {
					for b.Loop() {
						if _, err := s.Create(ctx, patient(int(n.Add(1))), store.Write{Project: "p1"}); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := s.Create(ctx, patient(int(n.Add(1))), store.Write{Project: "p1"}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
