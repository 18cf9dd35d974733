package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/jobs"
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

func (c *calls) add(j *jobs.Job) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[j.ID]++
	c.attempts[j.ID] = append(c.attempts[j.ID], j.Attempt)
}

func (c *calls) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func (c *calls) seen(id string) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.attempts[id]...)
}

func forEachStore(t *testing.T, fn func(t *testing.T, open func() *sqlstore.Store)) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			url := b.NewURL(t)
			fn(t, func() *sqlstore.Store {
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

func newEngine(s *sqlstore.Store, workers int, h jobs.Handler) *jobs.Engine {
	e := jobs.New(jobs.Config{Store: s, Workers: workers, Poll: 50 * time.Millisecond})
	e.Handle("test", "test", h)
	return e
}

func start(t *testing.T, e *jobs.Engine) {
	t.Helper()
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Stop(context.Background()) })
}

func submitAs(t *testing.T, e *jobs.Engine, p *principal.Principal) string {
	t.Helper()
	rec, err := e.Submit(context.Background(), p, "test", "http://example.test/x", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return rec.ID
}

func submit(t *testing.T, e *jobs.Engine) string { return submitAs(t, e, submitter) }

// await waits until the job's AsyncJob has one of the final statuses.
func await(t *testing.T, s store.Store, id string) fhir.Resource {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
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
	return func(ctx context.Context, j *jobs.Job) (jobs.Outcome, error) {
		c.add(j)
		time.Sleep(5 * time.Millisecond)
		return jobs.Outcome{Status: jobs.StatusCompleted, Output: fhir.Resource{"resourceType": "Parameters"}}, nil
	}
}

// Two engines (two processes) on one database run every job exactly once,
// and the AsyncJob keeps its submitter as author.
func TestTwoEnginesRunEachJobOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		c := newCalls()
		a := newEngine(open(), 3, done(c))
		start(t, a)
		start(t, newEngine(open(), 3, done(c)))
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
			// One version accepted, one active, one completed: the outcome
			// was written once.
			hist, err := s.History(context.Background(), store.AllProjects, "AsyncJob", id, 10, 0)
			if err != nil || len(hist) != 3 {
				t.Errorf("job %s has %d versions (%v)", id, len(hist), err)
			}
		}
	})
}

// An engine that stops hands its running job back without counting the
// attempt; another engine runs it.
func TestStopHandsBackRunningJobs(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		started := make(chan struct{}, 1)
		a := newEngine(open(), 1, func(ctx context.Context, j *jobs.Job) (jobs.Outcome, error) {
			started <- struct{}{}
			<-ctx.Done()
			return jobs.Outcome{}, ctx.Err()
		})
		start(t, a)
		id := submit(t, a)
		<-started
		expired, cancel := context.WithCancel(context.Background())
		cancel()
		a.Stop(expired)

		c := newCalls()
		start(t, newEngine(open(), 1, done(c)))
		if job := await(t, open(), id); job.String("status") != jobs.StatusCompleted {
			t.Fatalf("job: %v", job)
		}
		if got := c.seen(id); len(got) != 1 || got[0] != 1 {
			t.Errorf("attempts seen by the second engine: %v (the shutdown's is not counted)", got)
		}
	})
}

// A job sent back for lack of capacity runs later without counting; a job
// that failed to run is tried again, counting; a job started more than
// MaxAttempts times ends in error without running; a cancelled waiting job
// never runs; who may read and cancel a job.
func TestAttemptsRetriesCancel(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		s := open()
		ctx := context.Background()
		c := newCalls()
		var mu sync.Mutex
		runs := map[string]int{}
		var busy, failing string
		h := func(ctx context.Context, j *jobs.Job) (jobs.Outcome, error) {
			c.add(j)
			mu.Lock()
			runs[j.ID]++
			n := runs[j.ID]
			mu.Unlock()
			switch {
			case j.ID == busy && n == 1:
				return jobs.Outcome{}, &jobs.RetryError{After: 50 * time.Millisecond, Reason: "busy"}
			case j.ID == failing && n == 1:
				return jobs.Outcome{}, fmt.Errorf("the database is down")
			}
			return jobs.Outcome{Status: jobs.StatusCompleted}, nil
		}
		// Jobs submitted before any worker starts.
		e := newEngine(s, 2, h)
		busy, failing = submit(t, e), submit(t, e)
		abandoned, cancelled := submit(t, e), submit(t, e)
		if err := e.Cancel(ctx, submitter, cancelled); err != nil {
			t.Fatal(err)
		}
		// As if the processes that started it had died three times.
		rec, err := s.Read(ctx, store.AllProjects, "AsyncJob", abandoned)
		if err != nil {
			t.Fatal(err)
		}
		res, _ := rec.Resource()
		riverID := res["extension"].([]any)[0].(map[string]any)["valueString"].(string)
		if _, err := s.DB().ExecContext(ctx, `UPDATE river_job SET attempt = 3 WHERE id = `+riverID); err != nil {
			t.Fatal(err)
		}
		start(t, e)

		if job := await(t, s, busy); job.String("status") != jobs.StatusCompleted || fmt.Sprint(c.seen(busy)) != "[1 1]" {
			t.Errorf("job sent back for capacity: %v, attempts %v", job["status"], c.seen(busy))
		}
		if job := await(t, s, failing); job.String("status") != jobs.StatusCompleted || fmt.Sprint(c.seen(failing)) != "[1 2]" {
			t.Errorf("job that failed once: %v, attempts %v", job["status"], c.seen(failing))
		}
		if job := await(t, s, abandoned); job.String("status") != jobs.StatusError || c.count(abandoned) != 0 {
			t.Errorf("job whose starts all died: %v, run %d times", job, c.count(abandoned))
		}
		if job := await(t, s, cancelled); job.String("status") != jobs.StatusCancelled || c.count(cancelled) != 0 {
			t.Errorf("cancelled job: %v, run %d times", job["status"], c.count(cancelled))
		}
		// Cancelling a finished job is refused; cancelling a cancelled one is not.
		if err := e.Cancel(ctx, submitter, busy); !fhir.IsCode(err, fhir.EInvalid) {
			t.Errorf("cancel of a completed job: %v", err)
		}
		if err := e.Cancel(ctx, submitter, cancelled); err != nil {
			t.Errorf("second cancel: %v", err)
		}
		// Someone else's job does not exist for them.
		other := &principal.Principal{ProjectID: "p1", Profile: "Practitioner/other"}
		if _, err := e.Get(ctx, other, busy); !fhir.IsCode(err, fhir.ENotFound) {
			t.Errorf("another member reads the job: %v", err)
		}
		if err := e.Cancel(ctx, other, busy); !fhir.IsCode(err, fhir.ENotFound) {
			t.Errorf("another member cancels the job: %v", err)
		}
		admin := &principal.Principal{ProjectID: "p1", Profile: "Practitioner/admin", Admin: true}
		if _, err := e.Get(ctx, admin, busy); err != nil {
			t.Errorf("an admin reads the job: %v", err)
		}
	})
}

// A job cancelled through another process stops where it runs: River
// notifies that process through the database.
func TestCancelReachesAnotherProcess(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		started, stopped := make(chan struct{}), make(chan struct{})
		b := newEngine(open(), 1, func(ctx context.Context, j *jobs.Job) (jobs.Outcome, error) {
			close(started)
			<-ctx.Done()
			close(stopped)
			return jobs.Outcome{}, ctx.Err()
		})
		start(t, b)
		id := submit(t, b)
		<-started
		other := newEngine(open(), 1, done(newCalls()))
		if err := other.Cancel(context.Background(), submitter, id); err != nil {
			t.Fatal(err)
		}
		cancelled := time.Now()
		select {
		case <-stopped:
			t.Logf("the running job stopped %v after the cancel", time.Since(cancelled))
		case <-time.After(30 * time.Second):
			t.Fatal("the running job was not stopped")
		}
		if job := await(t, open(), id); job.String("status") != jobs.StatusCancelled || job["output"] != nil {
			t.Errorf("cancelled job: %v", job)
		}
	})
}

// The per-project limit: a project with QueuePerProject jobs waiting is
// refused another (429), while another project is not.
func TestQueuePerProject(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		e := jobs.New(jobs.Config{Store: open(), Workers: 1, QueuePerProject: 3})
		e.Handle("test", "test", done(newCalls()))
		for i := 0; i < 3; i++ {
			submit(t, e)
		}
		if _, err := e.Submit(context.Background(), submitter, "test", "x", []byte(`{}`)); !fhir.IsCode(err, fhir.EThrottled) {
			t.Errorf("fourth job: %v", err)
		}
		submitAs(t, e, &principal.Principal{ProjectID: "p2", Profile: "Practitioner/b"})
	})
}

// Fairness: project A submits 2,000 jobs, then project B one; B's job starts
// long before A's queue has drained. A's jobs wait at a gate until B's is
// submitted, so that A's whole backlog (but the jobs the workers hold) is
// still queued then, whatever the machine's speed.
func TestProjectsShareTheWorkers(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		const flood = 2000
		var mu sync.Mutex
		var order []string
		gate := make(chan struct{})
		var startedB time.Time
		h := func(ctx context.Context, j *jobs.Job) (jobs.Outcome, error) {
			<-gate
			mu.Lock()
			if j.Project == "project-b" {
				startedB = time.Now()
			}
			order = append(order, j.Project)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			return jobs.Outcome{Status: jobs.StatusCompleted}, nil
		}
		s := open()
		e := jobs.New(jobs.Config{Store: s, Workers: 2, QueuePerProject: flood, Poll: 50 * time.Millisecond})
		e.Handle("test", "test", h)
		start(t, e)
		a := &principal.Principal{ProjectID: "project-a", Profile: "Practitioner/a"}
		for i := 0; i < flood; i++ {
			submitAs(t, e, a)
		}
		mu.Lock()
		ranBeforeB := len(order)
		mu.Unlock()
		submittedB := time.Now()
		b := submitAs(t, e, &principal.Principal{ProjectID: "project-b", Profile: "Practitioner/b"})
		close(gate)
		await(t, s, b)
		waited := startedB.Sub(submittedB)
		mu.Lock()
		pos := -1
		for i, p := range order {
			if p == "project-b" {
				pos = i
				break
			}
		}
		mu.Unlock()
		// Between B's submission and its start, only the jobs the workers
		// had already taken (and A's few first-priority ones) may run.
		between := pos - ranBeforeB
		t.Logf("B's job waited %v; %d of A's jobs had run when B submitted, %d ran between, %d were left", waited, ranBeforeB, between, flood-pos)
		if pos < 0 || between > 10 || flood-pos < flood/4 {
			t.Errorf("B's job ran at position %d, %d jobs after its submission", pos, between)
		}
	})
}

// An AsyncJob left waiting by the version whose queue was a table of its
// own (no River job) ends in error when an engine starts, rather than wait
// forever; jobs of River are left alone.
func TestOrphansOfTheOldQueueEnd(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func() *sqlstore.Store) {
		s := open()
		ctx := context.Background()
		orphan, err := s.Create(ctx, fhir.Resource{"resourceType": "AsyncJob", "status": jobs.StatusAccepted, "request": "x",
			"requestTime": "2026-01-01T00:00:00.000Z"}, store.Write{Project: "p1", Author: submitter.Author()})
		if err != nil {
			t.Fatal(err)
		}
		c := newCalls()
		e := newEngine(s, 1, done(c))
		waiting := submit(t, e)
		start(t, e)
		if job := await(t, s, orphan.ID); job.String("status") != jobs.StatusError {
			t.Errorf("orphan: %v", job)
		}
		if job := await(t, s, waiting); job.String("status") != jobs.StatusCompleted {
			t.Errorf("River's job: %v", job)
		}
	})
}
