package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// TestPartitionOrder enqueues the tasks of four partitions interleaved, in
// batches, on two engines (two processes) of four workers each, and checks
// that each partition's tasks ran one at a time in the order they were
// enqueued, whichever process ran them, while the partitions ran side by
// side. The task functions take a random few milliseconds, so that a
// successor is often fetched while its predecessor runs (it waits), or
// before (it is handed back).
func TestPartitionOrder(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		const parts, perPart = 4, 40
		var mu sync.Mutex
		ran := map[string][]int{}
		running := map[string]bool{}
		var overlap []string
		all := make(chan struct{}, parts*perPart)
		fn := func(ctx context.Context, j *jobs.Job) error {
			var task struct {
				P string `json:"p"`
				N int    `json:"n"`
			}
			if err := json.Unmarshal(j.Payload, &task); err != nil {
				return err
			}
			mu.Lock()
			if running[task.P] {
				overlap = append(overlap, fmt.Sprintf("%s/%d", task.P, task.N))
			}
			running[task.P] = true
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			mu.Lock()
			running[task.P] = false
			ran[task.P] = append(ran[task.P], task.N)
			mu.Unlock()
			all <- struct{}{}
			return nil
		}
		var engines []*jobs.Engine
		var first store.Store
		for range 2 {
			s := open()
			if first == nil {
				first = s
			}
			e := jobs.New(jobs.Config{Store: s, Workers: 4, Poll: 20 * time.Millisecond})
			e.HandleTasks("ordered", "ordered", fn)
			start(t, e)
			engines = append(engines, e)
		}
		ctx := context.Background()
		for n := 0; n < perPart; n += 5 {
			var batch []jobs.Task
			for i := n; i < n+5; i++ {
				for p := range parts {
					part := "p" + strconv.Itoa(p)
					batch = append(batch, jobs.Task{Kind: "ordered", Project: "proj", Partition: part,
						Payload: []byte(fmt.Sprintf(`{"p":%q,"n":%d}`, part, i))})
				}
			}
			if err := first.InTx(ctx, func(tx store.Store) error { return engines[n%2].EnqueueMany(ctx, tx, batch) }); err != nil {
				t.Fatal(err)
			}
		}
		timeout := time.After(60 * time.Second)
		for range parts * perPart {
			select {
			case <-all:
			case <-timeout:
				t.Fatalf("not every task ran: %v", ran)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(overlap) > 0 {
			t.Errorf("tasks ran while a task of their partition ran: %v", overlap)
		}
		for p := range parts {
			got := ran["p"+strconv.Itoa(p)]
			for i, n := range got {
				if n != i {
					t.Fatalf("partition p%d ran in the order %v", p, got)
				}
			}
		}
	})
}
