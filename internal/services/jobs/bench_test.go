package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/store"
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

// BenchmarkEnqueueTen enqueues ten partitioned tasks (an HL7 feed's batch:
// a small message each, ten patients) per transaction, committed, on each
// store, with and without reading their ids back; it reports the time per
// task:
//
//	go test ./internal/services/jobs -run '^$' -bench EnqueueTen -benchtime 1000x
func BenchmarkEnqueueTen(b *testing.B) {
	payload, _ := json.Marshal(map[string]any{"agent": "a1", "channel": "adt", "bot": "Bot/1", "control": "c1", "ack": "AA",
		"message": "MSH|^~\\&|SEND|FAC|RECV|FAC|20250101120000||ADT^A08^ADT_A01|c1|P|2.5\rEVN|A08|20250101120000\rPID|1||PAT1^^^MRN^MR||Doe^Jane||19800101|F\r"})
	for _, be := range storetest.Backends(b) {
		s, err := sqlstore.Open(context.Background(), be.NewURL(b), sqlstore.Options{Migrate: true})
		if err != nil {
			b.Fatal(err)
		}
		e := jobs.New(jobs.Config{Store: s, Workers: 4})
		e.HandleTasks("bench", "bench", func(context.Context, *jobs.Job) error { return nil })
		for _, ids := range []bool{false, true} {
			name := be.Name + "/no-ids"
			if ids {
				name = be.Name + "/ids"
			}
			b.Run(name, func(b *testing.B) {
				n := 0
				for b.Loop() {
					err := s.InTx(context.Background(), func(tx store.Store) error {
						tasks := make([]jobs.Task, 10)
						for k := range tasks {
							n++
							tasks[k] = jobs.Task{Kind: "bench", Project: "p1", Payload: payload, MaxAttempts: 5, Partition: fmt.Sprintf("PAT%d", n%50)}
						}
						if ids {
							_, err := e.EnqueueManyIDs(context.Background(), tx, tasks)
							return err
						}
						return e.EnqueueMany(context.Background(), tx, tasks)
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*10), "µs/task")
			})
		}
		s.Close()
	}
}
