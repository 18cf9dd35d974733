package jobs_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// BenchmarkStartLatency measures a job's wait from Submit's return (its
// transaction committed) to its handler's start, one job at a time every
// 5 ms (a queue that keeps up), on each store; it reports the median and
// the 99th percentile:
//
//	go test ./internal/services/jobs -run '^$' -bench StartLatency -benchtime 400x
func BenchmarkStartLatency(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			s, err := sqlstore.Open(context.Background(), be.NewURL(b), sqlstore.Options{Migrate: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var mu sync.Mutex
			started := map[string]time.Time{}
			e := jobs.New(jobs.Config{Store: s, Workers: 4})
			e.Handle("test", "test", func(ctx context.Context, j *jobs.Job) (jobs.Outcome, error) {
				now := time.Now()
				mu.Lock()
				started[j.ID] = now
				mu.Unlock()
				return jobs.Outcome{Status: jobs.StatusCompleted}, nil
			})
			if err := e.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			defer e.Stop(context.Background())
			submitted := map[string]time.Time{}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rec, err := e.Submit(context.Background(), submitter, "test", "x", []byte(`{}`))
				if err != nil {
					b.Fatal(err)
				}
				submitted[rec.ID] = time.Now()
				time.Sleep(5 * time.Millisecond)
			}
			deadline := time.Now().Add(time.Minute)
			for {
				mu.Lock()
				n := len(started)
				mu.Unlock()
				if n == b.N || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			b.StopTimer()
			var waits []time.Duration
			mu.Lock()
			for id, at := range submitted {
				if st, ok := started[id]; ok {
					waits = append(waits, max(st.Sub(at), 0))
				}
			}
			mu.Unlock()
			if len(waits) < b.N {
				b.Fatalf("%d of %d jobs started", len(waits), b.N)
			}
			slices.Sort(waits)
			b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "p99-µs")
		})
	}
}
