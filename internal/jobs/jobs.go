// Package jobs runs asynchronous requests (Prefer: respond-async) as jobs
// kept in the store, so that a job accepted by one server process is run by
// some process, whichever is alive, exactly once as far as its visible
// outcome goes. It knows nothing of HTTP.
//
// A job is two things written in one transaction by Submit: an AsyncJob
// resource in the submitter's project (status accepted, meta.author the
// submitter), which is what clients read, and a row of the store's queue
// (store.Jobs) holding what the job needs to run. Its status becomes active
// when a runner starts it, then completed, error or cancelled. Every process runs a
// Runner: up to Workers jobs at once, each claimed from the queue with a
// lease (Lease) that the runner renews while the job runs. The outcome is
// written with the queue row's removal in one transaction that holds only if
// the claim is still the runner's, so it is written once, by the claim that
// ran last.
//
// What is guaranteed:
//   - A job accepted (202) is run, whatever happens to the process that
//     accepted it: a claim whose process died is claimed again by any
//     runner once its lease ends.
//   - Its outcome (AsyncJob status completed or error, and output) is
//     written exactly once; a cancelled job's never is.
//   - A job that was never claimed, or whose claim ended before its
//     handler started, runs once.
//   - A job whose process died while its handler ran is run again, so
//     what that handler did before the crash (a bot's writes) may be done
//     twice: handlers are run at least once. A job claimed MaxAttempts times
//     without finishing ends in error rather than taking more processes down
//     with it. A clean shutdown waits for running jobs, and hands those that
//     outlast it back to the queue without counting the attempt.
//
// Reads and cancellation are the submitter's, or a project admin's (Get,
// Cancel): a job is another caller's business only within those bounds.
package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// AsyncJob statuses (the reference's codes).
const (
	StatusAccepted  = "accepted"
	StatusActive    = "active" // claimed by a runner, running
	StatusCompleted = "completed"
	StatusError     = "error"
	StatusCancelled = "cancelled"
)

// Outcome is what a job's handler produced: the AsyncJob's final status
// (StatusCompleted or StatusError) and output (a Parameters resource).
type Outcome struct {
	Status string
	Output fhir.Resource
}

// ErrorOutcome is the outcome of a job that could not run: status error,
// and the error's OperationOutcome as the output's "outcome" parameter.
func ErrorOutcome(err error) Outcome {
	return Outcome{Status: StatusError, Output: OutcomeParameters(fhir.OutcomeFor(err))}
}

// OutcomeParameters is a Parameters resource holding an OperationOutcome as
// its "outcome" parameter.
func OutcomeParameters(oo *fhir.OperationOutcome) fhir.Resource {
	// Stored as decoded JSON, as every resource is held.
	b, _ := json.Marshal(oo)
	res, err := fhir.ParseResource(b)
	if err != nil {
		res = fhir.Resource{"resourceType": "OperationOutcome"}
	}
	return fhir.Resource{"resourceType": "Parameters", "parameter": []any{
		map[string]any{"name": "outcome", "resource": map[string]any(res)}}}
}

// RetryError asks the runner to give the job back to the queue and try it
// again after After, without counting the attempt: the server had no
// capacity for it (the execution memory budget was full).
type RetryError struct {
	After  time.Duration
	Reason string
}

func (e *RetryError) Error() string { return e.Reason }

// Handler runs a job of one kind. ctx is canceled when the job is cancelled,
// its claim is lost, or the server stops; the handler then returns an
// error, and nothing is written.
type Handler func(ctx context.Context, job *store.Job) (Outcome, error)

// Config configures a Runner.
type Config struct {
	Store store.Store
	// Workers is how many jobs this process runs at once.
	Workers int
	// Lease is how long a claim lasts without renewal: a job whose process
	// died is run again this long after its last renewal.
	Lease time.Duration
	// MaxAttempts is how many claims a job may take; a job claimed more
	// often ends in error (0: 3).
	MaxAttempts int
	// QueuePerProject is how many jobs of one project may be in the queue;
	// Submit beyond it is refused (429).
	QueuePerProject int
	// Poll is how often an idle runner looks for jobs that another
	// process accepted or whose lease ended (0: every second). Jobs this
	// process accepts wake it at once.
	Poll       time.Duration
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Runner accepts jobs and runs those of the queue.
type Runner struct {
	cfg      Config
	store    store.Store
	log      *slog.Logger
	handlers map[string]Handler
	metrics  *metrics

	ctx     context.Context
	cancel  context.CancelFunc
	wake    chan struct{}
	stop    chan struct{}
	loopEnd chan struct{}
	running sync.WaitGroup

	mu       sync.Mutex
	inFlight map[string]context.CancelCauseFunc
	started  bool
	stopped  bool
}

// Causes of a running job's cancellation.
var (
	errCancelled = errors.New("the job was cancelled")
	errLost      = errors.New("the job's claim was lost")
	errShutdown  = errors.New("the server is stopping")
)

// New builds a runner; Handle its kinds, then Start it.
func New(cfg Config) *Runner {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Runner{cfg: cfg, store: cfg.Store, log: cfg.Log, handlers: map[string]Handler{}, metrics: newMetrics(cfg.Registerer),
		ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), stop: make(chan struct{}), loopEnd: make(chan struct{}),
		inFlight: map[string]context.CancelCauseFunc{}}
}

// Handle registers the handler of a kind of job. Call it before Start.
func (r *Runner) Handle(kind string, h Handler) { r.handlers[kind] = h }

// Start starts claiming jobs.
func (r *Runner) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.stopped {
		return
	}
	r.started = true
	go r.loop()
}

// Submit accepts a job: its AsyncJob (status accepted, request the URL it
// answers, in the submitter's project and authored by the submitter) and
// its queue row, in one transaction. It answers the AsyncJob's record.
func (r *Runner) Submit(ctx context.Context, p *principal.Principal, kind, request string, payload []byte) (*store.Record, error) {
	if _, ok := r.handlers[kind]; !ok {
		return nil, fmt.Errorf("jobs: no handler of %q", kind)
	}
	var rec *store.Record
	err := r.store.InTx(ctx, func(tx store.Store) error {
		if err := tx.Lock(ctx, "jobs:"+p.ProjectID); err != nil {
			return err
		}
		n, err := tx.JobCount(ctx, p.ProjectID)
		if err != nil {
			return err
		}
		if r.cfg.QueuePerProject > 0 && n >= r.cfg.QueuePerProject {
			return fhir.Errorf(fhir.EThrottled, "This project has %d asynchronous jobs waiting or running, the most it may have; try again once some have finished", n)
		}
		job := fhir.Resource{"resourceType": "AsyncJob", "status": StatusAccepted, "request": request,
			"requestTime": time.Now().UTC().Format(fhir.TimeFormat)}
		rec, err = tx.Create(ctx, job, store.Write{Project: p.ProjectID, Author: p.Author()})
		if err != nil {
			return err
		}
		return tx.EnqueueJob(ctx, store.Job{ID: rec.ID, Project: p.ProjectID, Kind: kind, Payload: payload})
	})
	if err != nil {
		return nil, err
	}
	r.metrics.submitted.Inc()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return rec, nil
}

// Get reads a job's AsyncJob for p: its submitter, a project admin or a
// super admin; for anyone else it does not exist (404).
func (r *Runner) Get(ctx context.Context, p *principal.Principal, id string) (fhir.Resource, error) {
	return r.read(ctx, r.store, p, id)
}

func (r *Runner) read(ctx context.Context, s store.Store, p *principal.Principal, id string) (fhir.Resource, error) {
	if !fhir.ValidID(id) {
		return nil, fhir.ErrNotFound
	}
	rec, err := s.Read(ctx, p.Scope(), "AsyncJob", id)
	if err != nil {
		return nil, err
	}
	job, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	if !mayRead(p, job) {
		return nil, fhir.ErrNotFound
	}
	return job, nil
}

// mayRead is the rule of who reads (and cancels) a job: its submitter (the
// profile that authored its AsyncJob) and the project's admins.
func mayRead(p *principal.Principal, job fhir.Resource) bool {
	if p.SuperAdmin || p.Admin {
		return true
	}
	meta, _ := job["meta"].(map[string]any)
	author, _ := meta["author"].(map[string]any)
	return p.Profile != "" && author["reference"] == p.Profile
}

// Cancel cancels a job for p (as Get decides who may): a waiting job never
// runs, and a running one has its context canceled (at once in this
// process, within a second in another). Its AsyncJob becomes cancelled. A
// job that already ended cannot be cancelled (400), as on the reference;
// cancelling a cancelled job is no error.
func (r *Runner) Cancel(ctx context.Context, p *principal.Principal, id string) error {
	if _, err := r.Get(ctx, p, id); err != nil {
		return err
	}
	err := r.store.InTx(ctx, func(tx store.Store) error {
		if _, err := tx.CancelJob(ctx, id); err != nil {
			return err
		}
		// Read again after the queue row is gone: a runner that finished
		// the job first has written its status.
		job, err := r.read(ctx, tx, p, id)
		if err != nil {
			return err
		}
		switch st := job.String("status"); st {
		case StatusCancelled:
			return nil
		case StatusCompleted, StatusError:
			return fhir.Invalid(fmt.Sprintf("AsyncJob cannot be cancelled if status is not 'accepted' or 'active', job had status '%s'", st))
		}
		return r.setStatus(ctx, tx, id, Outcome{Status: StatusCancelled})
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	cancel := r.inFlight[id]
	r.mu.Unlock()
	if cancel != nil {
		cancel(errCancelled)
	}
	r.metrics.done.WithLabelValues("cancelled").Inc()
	return nil
}

// setStatus writes a job's final status (and output) into its AsyncJob,
// keeping its author (the submitter, who may read it).
func (r *Runner) setStatus(ctx context.Context, tx store.Store, id string, out Outcome) error {
	cur, err := tx.Read(ctx, store.AllProjects, "AsyncJob", id)
	if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
		return nil // deleted by a super admin: nothing to report to
	}
	if err != nil {
		return err
	}
	res, err := cur.Resource()
	if err != nil {
		return err
	}
	meta, _ := res["meta"].(map[string]any)
	author, _ := meta["author"].(map[string]any)
	ref, _ := author["reference"].(string)
	_, err = tx.Update(ctx, store.AllProjects, "AsyncJob", id, store.Write{Author: fhir.Reference{Reference: ref}},
		func(job fhir.Resource) (fhir.Resource, error) {
			job["status"] = out.Status
			if out.Status != StatusActive {
				job["transactionTime"] = time.Now().UTC().Format(fhir.TimeFormat)
			}
			if out.Output != nil {
				job["output"] = out.Output
			}
			return job, nil
		})
	return err
}

// loop claims jobs while a worker is free, and waits for a wake-up or the
// poll interval when the queue has nothing due.
func (r *Runner) loop() {
	defer close(r.loopEnd)
	slots := make(chan struct{}, r.cfg.Workers)
	idle := time.NewTimer(0)
	defer idle.Stop()
	for {
		select {
		case slots <- struct{}{}:
		case <-r.stop:
			return
		}
		select {
		case <-r.stop:
			return
		default:
		}
		job, err := r.store.ClaimJob(r.ctx, r.cfg.Lease)
		if err != nil || job == nil {
			<-slots
			if err != nil && r.ctx.Err() == nil {
				r.log.Warn("jobs: claim failed", "err", err)
			}
			idle.Reset(r.cfg.Poll)
			select {
			case <-idle.C:
			case <-r.wake:
			case <-r.stop:
				return
			}
			continue
		}
		r.running.Add(1)
		go func() {
			defer func() { <-slots }()
			defer r.running.Done()
			r.run(job)
		}()
	}
}

// renewEvery is how often a running job's lease is renewed, which is also
// how soon a runner hears that another process cancelled its job.
func (r *Runner) renewEvery() time.Duration { return min(r.cfg.Lease/3, time.Second) }

// run runs one claimed job and writes its outcome, unless the claim was
// lost or the server is stopping.
func (r *Runner) run(job *store.Job) {
	ctx, cancel := context.WithCancelCause(r.ctx)
	defer cancel(nil)
	r.mu.Lock()
	r.inFlight[job.ID] = cancel
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.inFlight, job.ID)
		r.mu.Unlock()
	}()
	r.metrics.running.Inc()
	defer r.metrics.running.Dec()

	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(r.renewEvery())
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			err := r.store.RenewJob(ctx, job.ID, job.Claim, r.cfg.Lease)
			if errors.Is(err, store.ErrJobLost) {
				cancel(errLost)
				return
			}
			if err != nil && ctx.Err() == nil {
				r.log.Warn("jobs: lease not renewed", "job", job.ID, "err", err)
			}
		}
	}()

	var out Outcome
	var err error
	h := r.handlers[job.Kind]
	switch {
	case h == nil:
		// A kind this version does not know (a rolling upgrade): leave it
		// to a process that does.
		err = &RetryError{After: 10 * time.Second, Reason: "unknown kind " + job.Kind}
	case job.Attempts > r.cfg.MaxAttempts:
		out = Outcome{Status: StatusError, Output: OutcomeParameters(&fhir.OperationOutcome{ResourceType: "OperationOutcome",
			Issue: []fhir.Issue{{Severity: "error", Code: "incomplete", Details: &fhir.IssueDetails{Text: fmt.Sprintf(
				"The job was abandoned: the server running it stopped during each of its %d attempts", job.Attempts-1)}}}})}
	default:
		if err = r.markActive(ctx, job); err == nil {
			out, err = h(ctx, job)
		}
	}
	cancel(nil)
	<-renewed

	// A fresh context: what is written now must not be cut short by the
	// job's cancellation.
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(r.ctx), 30*time.Second)
	defer wcancel()
	cause := context.Cause(ctx)
	var retry *RetryError
	switch {
	case errors.Is(cause, errCancelled) || errors.Is(cause, errLost):
		r.metrics.done.WithLabelValues("lost").Inc()
		return
	case errors.Is(err, store.ErrJobLost):
		r.metrics.done.WithLabelValues("lost").Inc()
		return
	case err == nil:
		// An outcome, even one that arrived as the server was stopping:
		// written below, never run again.
	case errors.Is(cause, errShutdown):
		r.release(wctx, job, 0, true, "shutdown")
		return
	case errors.As(err, &retry):
		r.release(wctx, job, retry.After, true, "retry")
		return
	case err != nil:
		// The handler could not run it (the database failing): try again
		// later, counting the attempt, so that a job that always fails so
		// ends in error.
		r.log.Warn("jobs: job failed to run; it will be tried again", "job", job.ID, "kind", job.Kind, "err", err)
		r.release(wctx, job, 5*time.Second, false, "failed")
		return
	}
	err = r.store.InTx(wctx, func(tx store.Store) error {
		if err := tx.FinishJob(wctx, job.ID, job.Claim); err != nil {
			return err
		}
		return r.setStatus(wctx, tx, job.ID, out)
	})
	switch {
	case errors.Is(err, store.ErrJobLost):
		r.metrics.done.WithLabelValues("lost").Inc()
	case err != nil:
		// The claim stays: its lease ends and the job runs again.
		r.log.Warn("jobs: outcome not written; the job will run again", "job", job.ID, "err", err)
		r.metrics.done.WithLabelValues("unwritten").Inc()
	default:
		r.metrics.done.WithLabelValues(out.Status).Inc()
	}
}

// markActive shows in the job's AsyncJob that a runner has it (status
// active), in one transaction with a renewal of the claim, so that a job
// cancelled meanwhile is never shown running: store.ErrJobLost then.
func (r *Runner) markActive(ctx context.Context, job *store.Job) error {
	return r.store.InTx(ctx, func(tx store.Store) error {
		if err := tx.RenewJob(ctx, job.ID, job.Claim, r.cfg.Lease); err != nil {
			return err
		}
		cur, err := tx.Read(ctx, store.AllProjects, "AsyncJob", job.ID)
		if err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return nil
			}
			return err
		}
		res, err := cur.Resource()
		if err != nil || res.String("status") != StatusAccepted {
			return err
		}
		return r.setStatus(ctx, tx, job.ID, Outcome{Status: StatusActive})
	})
}

func (r *Runner) release(ctx context.Context, job *store.Job, after time.Duration, uncount bool, why string) {
	err := r.store.ReleaseJob(ctx, job.ID, job.Claim, after, uncount)
	if err != nil && !errors.Is(err, store.ErrJobLost) {
		r.log.Warn("jobs: job not released; it runs again when its lease ends", "job", job.ID, "err", err)
	}
	r.metrics.done.WithLabelValues(why).Inc()
}

// Stop stops claiming, waits for the running jobs until ctx ends, then
// cancels those still running and gives them back to the queue (without
// counting the attempt), so that another process, or this one's next start,
// runs them without waiting for their leases to end. Stopping twice is
// harmless.
func (r *Runner) Stop(ctx context.Context) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	r.stopped = true
	started := r.started
	r.mu.Unlock()
	close(r.stop)
	if started {
		<-r.loopEnd
	}
	done := make(chan struct{})
	go func() { r.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		r.mu.Lock()
		for _, cancel := range r.inFlight {
			cancel(errShutdown)
		}
		r.mu.Unlock()
		<-done
	}
	r.cancel()
}

type metrics struct {
	submitted prometheus.Counter
	running   prometheus.Gauge
	done      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		submitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_jobs_submitted_total",
			Help: "Asynchronous jobs accepted by this process.",
		}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_jobs_running",
			Help: "Asynchronous jobs this process is running.",
		}),
		done: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_jobs_ended_total",
			Help: "Claims of asynchronous jobs by how they ended: completed, error, cancelled, lost (cancelled or claimed again elsewhere), retry (no capacity), shutdown, failed (tried again later), unwritten.",
		}, []string{"how"}),
	}
	if reg != nil {
		reg.MustRegister(m.submitted, m.running, m.done)
	}
	return m
}
