package jobs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/jobs"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

var submitter = &principal.Principal{ProjectID: "p1", Profile: "Practitioner/submitter"}

// calls counts a handler's calls per job and the attempts it saw.
type calls struct {
	mu       sync.Mutex
	n        map[string]int
	attempts map[string][]int
}

func newCalls() *calls { return &calls{n: map[string]int{}, attempts: map[string][]int{}} }

func (c *calls) add(j *store.Job) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[j.ID]++
	c.attempts[j.ID] = append(c.attempts[j.ID], j.Attempts)
}

func (c *calls) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func forEachStore(t *testing.T, fn func(t *testing.T, open func() store.Store)) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			url := b.NewURL(t)
			fn(t, func() store.Store {
				s, err := sqlstore.Open(context.Background(), url, sqlstore.Options{Migrate: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
}

func newRunner(t *testing.T, s store.Store, lease time.Duration, h jobs.Handler) *jobs.Runner {
	r := jobs.New(jobs.Config{Store: s, Workers: 3, Lease: lease, Poll: 20 * time.Millisecond})
	r.Handle("test", h)
	r.Start()
	t.Cleanup(func() { r.Stop(context.Background()) })
	return r
}

func submit(t *testing.T, r *jobs.Runner) string {
	t.Helper()
	rec, err := r.Submit(context.Background(), submitter, "test", "http://example.test/x", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return rec.ID
}

// await waits until the job's AsyncJob has one of the final statuses.
func await(t *testing.T, s store.Store, id string) fhir.Resource {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := s.Read(context.Background(), store.AllProjects, "AsyncJob", id)
		if err != nil {
			t.Fatal(err)
		}
		job, _ := rec.Resource()
		switch job.String("status") {
		case jobs.StatusCompleted, jobs.StatusError, jobs.StatusCancelled:
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %s", id, job.String("status"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func done(c *calls) jobs.Handler {
	return func(ctx context.Context, j *store.Job) (jobs.Outcome, error) {
		c.add(j)
		time.Sleep(5 * time.Millisecond)
		return jobs.Outcome{Status: jobs.StatusCompleted, Output: fhir.Resource{"resourceType": "Parameters"}}, nil
	}
}

// Two runners (two processes) on one store run every job exactly once, and
// the AsyncJob keeps its submitter as author.
func TestTwoRunnersRunEachJobOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() store.Store) {
		c := newCalls()
		a := newRunner(t, open(), time.Minute, done(c))
		newRunner(t, open(), time.Minute, done(c))
		var ids []string
		for i := 0; i < 30; i++ {
			ids = append(ids, submit(t, a))
		}
		s := open()
		for _, id := range ids {
			job := await(t, s, id)
			if job.String("status") != jobs.StatusCompleted || job["output"] == nil || job["transactionTime"] == nil {
				t.Errorf("job %s: %v", id, job)
			}
			if author := job["meta"].(map[string]any)["author"].(map[string]any)["reference"]; author != submitter.Profile {
				t.Errorf("job %s author %v", id, author)
			}
			if n := c.count(id); n != 1 {
				t.Errorf("job %s ran %d times", id, n)
			}
		}
	})
}

// A runner that stops hands its running job back without counting the
// attempt; another runner runs it.
func TestStopHandsBackRunningJobs(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() store.Store) {
		started := make(chan struct{}, 1)
		a := jobs.New(jobs.Config{Store: open(), Workers: 1, Lease: time.Minute, Poll: 20 * time.Millisecond})
		a.Handle("test", func(ctx context.Context, j *store.Job) (jobs.Outcome, error) {
			started <- struct{}{}
			<-ctx.Done()
			return jobs.Outcome{}, ctx.Err()
		})
		a.Start()
		id := submit(t, a)
		<-started
		expired, cancel := context.WithCancel(context.Background())
		cancel()
		a.Stop(expired)

		c := newCalls()
		newRunner(t, open(), time.Minute, done(c))
		if job := await(t, open(), id); job.String("status") != jobs.StatusCompleted {
			t.Fatalf("job: %v", job)
		}
		if got := c.attempts[id]; len(got) != 1 || got[0] != 1 {
			t.Errorf("attempts seen by the second runner: %v (the shutdown's is not counted)", got)
		}
	})
}

// A claim whose process died (never renewed) is run by another runner after
// its lease; a job whose claims all died ends in error; a job sent back for
// lack of capacity runs later without counting; a cancelled waiting job
// never runs.
func TestLeasesAttemptsRetriesCancel(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() store.Store) {
		s := open()
		ctx := context.Background()
		// Jobs submitted with no runner started: nothing claims them but
		// the "dead" claims below.
		idle := jobs.New(jobs.Config{Store: s})
		idle.Handle("test", done(newCalls()))
		crashedOnce, crashedAlways, busy, cancelled := submit(t, idle), submit(t, idle), submit(t, idle), submit(t, idle)
		claimAndDie := func(id string) {
			t.Helper()
			for {
				j, err := s.ClaimJob(ctx, time.Millisecond)
				if err != nil || j == nil {
					t.Fatalf("claim: %v %v", j, err)
				}
				if j.ID == id {
					break
				}
				if err := s.ReleaseJob(ctx, j.ID, j.Claim, 0, true); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		claimAndDie(crashedOnce)
		for i := 0; i < 3; i++ {
			claimAndDie(crashedAlways)
		}
		if err := idle.Cancel(ctx, submitter, cancelled); err != nil {
			t.Fatal(err)
		}

		c := newCalls()
		retried := false
		var mu sync.Mutex
		newRunner(t, open(), time.Minute, func(ctx context.Context, j *store.Job) (jobs.Outcome, error) {
			mu.Lock()
			first := j.ID == busy && !retried
			retried = retried || j.ID == busy
			mu.Unlock()
			c.add(j)
			if first {
				return jobs.Outcome{}, &jobs.RetryError{After: 50 * time.Millisecond, Reason: "busy"}
			}
			return jobs.Outcome{Status: jobs.StatusCompleted}, nil
		})
		if job := await(t, s, crashedOnce); job.String("status") != jobs.StatusCompleted || c.attempts[crashedOnce][0] != 2 {
			t.Errorf("job whose first claim died: %v, attempts %v", job["status"], c.attempts[crashedOnce])
		}
		if job := await(t, s, crashedAlways); job.String("status") != jobs.StatusError || c.count(crashedAlways) != 0 {
			t.Errorf("job whose claims all died: %v, run %d times", job, c.count(crashedAlways))
		}
		if job := await(t, s, busy); job.String("status") != jobs.StatusCompleted || len(c.attempts[busy]) != 2 || c.attempts[busy][1] != 1 {
			t.Errorf("job sent back for capacity: %v, attempts %v", job["status"], c.attempts[busy])
		}
		if job := await(t, s, cancelled); job.String("status") != jobs.StatusCancelled || c.count(cancelled) != 0 {
			t.Errorf("cancelled job: %v, run %d times", job["status"], c.count(cancelled))
		}
		// Cancelling a finished job is refused; cancelling a cancelled one is not.
		if err := idle.Cancel(ctx, submitter, crashedOnce); !fhir.IsCode(err, fhir.EInvalid) {
			t.Errorf("cancel of a completed job: %v", err)
		}
		if err := idle.Cancel(ctx, submitter, cancelled); err != nil {
			t.Errorf("second cancel: %v", err)
		}
		// Someone else's job does not exist for them.
		other := &principal.Principal{ProjectID: "p1", Profile: "Practitioner/other"}
		if _, err := idle.Get(ctx, other, busy); !fhir.IsCode(err, fhir.ENotFound) {
			t.Errorf("another member reads the job: %v", err)
		}
		admin := &principal.Principal{ProjectID: "p1", Profile: "Practitioner/admin", Admin: true}
		if _, err := idle.Get(ctx, admin, busy); err != nil {
			t.Errorf("an admin reads the job: %v", err)
		}
	})
}

// A job cancelled through another process's runner stops where it runs:
// that runner hears of it at its next renewal.
func TestCancelReachesAnotherProcess(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() store.Store) {
		started, stopped := make(chan struct{}), make(chan struct{})
		b := newRunner(t, open(), 3*time.Second, func(ctx context.Context, j *store.Job) (jobs.Outcome, error) {
			close(started)
			<-ctx.Done()
			close(stopped)
			return jobs.Outcome{}, ctx.Err()
		})
		id := submit(t, b)
		<-started
		other := jobs.New(jobs.Config{Store: open()})
		if err := other.Cancel(context.Background(), submitter, id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			t.Fatal("the running job was not stopped")
		}
		if job := await(t, open(), id); job.String("status") != jobs.StatusCancelled || job["output"] != nil {
			t.Errorf("cancelled job: %v", job)
		}
	})
}
