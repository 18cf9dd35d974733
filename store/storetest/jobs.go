package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/store"
)

func enqueue(t *testing.T, s store.Store, id, project string) {
	t.Helper()
	if err := s.EnqueueJob(context.Background(), store.Job{ID: id, Project: project, Kind: "test", Payload: []byte(`{"n":"` + id + `"}`)}); err != nil {
		t.Fatalf("enqueue %s: %v", id, err)
	}
}

func claim(t *testing.T, s store.Store, lease time.Duration) *store.Job {
	t.Helper()
	j, err := s.ClaimJob(context.Background(), lease)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return j
}

// testJobQueue: the order of claims, what a claim returns, and what a lost
// claim can no longer do.
func testJobQueue(t *testing.T, s store.Store) {
	ctx := context.Background()
	if j := claim(t, s, time.Minute); j != nil {
		t.Fatalf("empty queue gave %+v", j)
	}
	enqueue(t, s, "j1", "p1")
	time.Sleep(2 * time.Millisecond) // enqueued in distinct milliseconds: claimed in this order
	enqueue(t, s, "j2", "p1")
	time.Sleep(2 * time.Millisecond)
	enqueue(t, s, "j3", "p2")
	if err := s.EnqueueJob(ctx, store.Job{ID: "j1", Project: "p1", Kind: "test"}); err == nil {
		t.Error("a second job with one id was enqueued")
	}
	if n, err := s.JobCount(ctx, "p1"); err != nil || n != 2 {
		t.Errorf("jobs of p1: %d, %v", n, err)
	}

	a := claim(t, s, time.Minute)
	if a == nil || a.ID != "j1" || a.Project != "p1" || a.Kind != "test" || string(a.Payload) != `{"n":"j1"}` || a.Attempts != 1 || a.Claim == "" || a.Created.IsZero() {
		t.Fatalf("first claim = %+v", a)
	}
	b := claim(t, s, time.Minute)
	if b == nil || b.ID != "j2" || b.Claim == a.Claim {
		t.Fatalf("second claim = %+v", b)
	}
	// A claimed job is not claimed again while its lease lasts.
	c := claim(t, s, time.Minute)
	if c == nil || c.ID != "j3" {
		t.Fatalf("third claim = %+v", c)
	}
	if j := claim(t, s, time.Minute); j != nil {
		t.Fatalf("every job is claimed, yet %s was claimed again", j.ID)
	}

	// Only the claim's holder renews, releases or finishes it.
	if err := s.RenewJob(ctx, a.ID, b.Claim, time.Minute); !errors.Is(err, store.ErrJobLost) {
		t.Errorf("renew with another job's claim: %v", err)
	}
	if err := s.FinishJob(ctx, a.ID, ""); !errors.Is(err, store.ErrJobLost) {
		t.Errorf("finish without a claim: %v", err)
	}
	if err := s.RenewJob(ctx, a.ID, a.Claim, time.Minute); err != nil {
		t.Errorf("renew: %v", err)
	}
	// A finish in a transaction that rolls back leaves the job claimed.
	boom := errors.New("rolled back")
	if err := s.InTx(ctx, func(tx store.Store) error {
		if err := tx.FinishJob(ctx, a.ID, a.Claim); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("rolled back finish: %v", err)
	}
	if err := s.InTx(ctx, func(tx store.Store) error { return tx.FinishJob(ctx, a.ID, a.Claim) }); err != nil {
		t.Fatalf("finish: %v", err)
	}
	if err := s.FinishJob(ctx, a.ID, a.Claim); !errors.Is(err, store.ErrJobLost) {
		t.Errorf("second finish: %v", err)
	}
	if n, err := s.JobCount(ctx, "p1"); err != nil || n != 1 {
		t.Errorf("jobs of p1 after a finish: %d, %v", n, err)
	}

	// Released without counting the claim: claimed again, first attempt
	// again, under a new claim; the old claim is lost.
	if err := s.ReleaseJob(ctx, b.ID, b.Claim, 0, true); err != nil {
		t.Fatalf("release: %v", err)
	}
	b2 := claim(t, s, time.Minute)
	if b2 == nil || b2.ID != "j2" || b2.Attempts != 1 || b2.Claim == b.Claim {
		t.Fatalf("claim after release = %+v", b2)
	}
	if err := s.RenewJob(ctx, b.ID, b.Claim, time.Minute); !errors.Is(err, store.ErrJobLost) {
		t.Errorf("renew with a released claim: %v", err)
	}
	// Released with a delay and counted: not claimable before the delay.
	if err := s.ReleaseJob(ctx, b2.ID, b2.Claim, time.Hour, false); err != nil {
		t.Fatalf("release with delay: %v", err)
	}
	if j := claim(t, s, time.Minute); j != nil {
		t.Errorf("a job released for an hour was claimed: %+v", j)
	}

	// A claim whose lease ended is claimed again; the first claim is lost.
	if err := s.RenewJob(ctx, c.ID, c.Claim, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	c2 := claim(t, s, time.Minute)
	if c2 == nil || c2.ID != "j3" || c2.Attempts != 2 || c2.Claim == c.Claim {
		t.Fatalf("claim after the lease ended = %+v", c2)
	}
	if err := s.FinishJob(ctx, c.ID, c.Claim); !errors.Is(err, store.ErrJobLost) {
		t.Errorf("the first claim finished a job claimed again: %v", err)
	}

	// Cancelling removes a claimed job (its claim is lost) and a waiting
	// one; a job no longer queued is not cancelled.
	if ok, err := s.CancelJob(ctx, c2.ID); err != nil || !ok {
		t.Errorf("cancel claimed: %v %v", ok, err)
	}
	if err := s.RenewJob(ctx, c2.ID, c2.Claim, time.Minute); !errors.Is(err, store.ErrJobLost) {
		t.Errorf("renew of a cancelled job: %v", err)
	}
	if ok, err := s.CancelJob(ctx, b2.ID); err != nil || !ok {
		t.Errorf("cancel waiting: %v %v", ok, err)
	}
	if ok, err := s.CancelJob(ctx, a.ID); err != nil || ok {
		t.Errorf("cancel finished: %v %v", ok, err)
	}
	if n, err := s.JobCount(ctx, "p1"); err != nil || n != 0 {
		t.Errorf("jobs of p1 at the end: %d, %v", n, err)
	}
}

// testJobClaimsConcurrent: runners claiming at once take every job exactly
// once.
func testJobClaimsConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	const jobs, runners = 60, 8
	for i := 0; i < jobs; i++ {
		enqueue(t, s, fmt.Sprintf("job-%03d", i), "p1")
	}
	var mu sync.Mutex
	claimed := map[string]int{}
	var wg sync.WaitGroup
	for r := 0; r < runners; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j, err := s.ClaimJob(ctx, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if j == nil {
					return
				}
				mu.Lock()
				claimed[j.ID]++
				mu.Unlock()
				if err := s.InTx(ctx, func(tx store.Store) error { return tx.FinishJob(ctx, j.ID, j.Claim) }); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(claimed) != jobs {
		t.Errorf("%d of %d jobs claimed", len(claimed), jobs)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Errorf("%s claimed %d times", id, n)
		}
	}
}
