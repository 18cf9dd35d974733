// Package jobs runs the server's background work on River
// (riverqueue/river), over the store's own database, so that accepting a job
// and running it survive any one server process. It knows nothing of HTTP.
//
// Today its one kind of work is an asynchronous request (Prefer:
// respond-async): an AsyncJob resource in the submitter's project, which is
// what clients read, and a River job holding what the work needs, written
// in one transaction by Submit (River's InsertTx on the store's
// transaction). The AsyncJob's status becomes active when a worker starts
// the job, then completed, error or cancelled; the outcome is written and
// the River job completed in one transaction (JobCompleteTx), so an outcome
// is written once.
//
// What is guaranteed:
//   - A job accepted (202) is run, whatever happens to the process that
//     accepted it: every process runs workers, and a job whose process died
//     while running it is rescued by River and run again by any process
//     once RescueAfter has passed since it started.
//   - Its outcome (AsyncJob status completed or error, and output) is
//     written exactly once; a cancelled job's never is.
//   - A job whose process died while its handler ran is run again, so what
//     that handler did before the crash (a bot's writes) may be done twice:
//     handlers are run at least once. A job started MaxAttempts times
//     without an outcome ends in error rather than taking more processes
//     down with it. A clean shutdown waits for running jobs, and hands those
//     that outlast it back to the queue without counting the attempt.
//   - Fairness between projects: a job's River priority comes from its
//     project's backlog in the queue when it is submitted, so one project's
//     ten thousand jobs wait behind another project's first few.
//
// Reads and cancellation are the submitter's, or a project admin's (Get,
// Cancel): a job is another caller's business only within those bounds.
package jobs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/rivertype"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// AsyncJob statuses (the reference's codes).
const (
	StatusAccepted  = "accepted"
	StatusActive    = "active" // a worker runs it
	StatusCompleted = "completed"
	StatusError     = "error"
	StatusCancelled = "cancelled"
)

// riverJobExtension records, on an AsyncJob, the id of its River job (which
// cancellation needs). AsyncJob has no identifier element.
const riverJobExtension = "https://sandbot.dev/fhir/StructureDefinition/job-queue-id"

// TaskExtension is the extension (valueString, the task's id) that links
// an AsyncJob written by a task's owner (an HL7 message being run again)
// to its task, as a job's AsyncJob is to its River job: an AsyncJob waiting
// or running with it is not taken for one left by an earlier version.
const TaskExtension = riverJobExtension

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

// RetryError asks for the job to be run again after After, without counting
// the attempt: the server had no capacity for it (the execution memory
// budget was full).
type RetryError struct {
	After  time.Duration
	Reason string
}

func (e *RetryError) Error() string { return e.Reason }

// Job is one job as its handler sees it.
type Job struct {
	// ID is the job's id (its AsyncJob's).
	ID      string
	Project string
	Kind    string
	Payload []byte
	// Attempt counts the starts of the job, this one included (a start
	// handed back by a shutdown, or for lack of capacity, is not counted).
	Attempt int
	// MaxAttempts is how many starts a task may take (tasks.go).
	MaxAttempts int
	// TaskID is a task's id (EnqueueManyIDs, TaskState).
	TaskID int64
}

// Handler runs a job of one kind. ctx is canceled when the job is
// cancelled or the server stops; the handler then returns an error, and
// nothing is written. Any other error is the server's (the database
// failing): the job is tried again later, counting the attempt.
type Handler func(ctx context.Context, job *Job) (Outcome, error)

// Config configures an Engine.
type Config struct {
	Store *sqlstore.Store
	// Workers is how many jobs of each queue this process runs at once.
	Workers int
	// QueuePerProject is how many jobs of one project may wait or run in a
	// queue; Submit beyond it is refused (429).
	QueuePerProject int
	// MaxAttempts is how many starts a job may take; a job started more
	// often ends in error (0: 3).
	MaxAttempts int
	// RescueAfter is how long after it started a running job is taken for
	// lost (its process died) and run again. Handlers' work must end well
	// within it: a job's context ends at nine tenths of it (0: 17 minutes,
	// beyond the longest bot timeout and its compilation).
	RescueAfter time.Duration
	// Poll is how often workers look for jobs when no notification came
	// (0: every second). Notifications (PostgreSQL's NOTIFY, SQLite's
	// outbox, polled every 50 ms) bring new jobs and cancellations at once.
	Poll       time.Duration
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Engine accepts jobs and runs them.
type Engine struct {
	cfg      Config
	store    *sqlstore.Store
	log      *slog.Logger
	metrics  *metrics
	workers  *river.Workers
	queues   map[string]river.QueueConfig
	handlers map[string]registered
	client   *river.Client[*sql.Tx]
	// partitions wakes tasks waiting for their predecessor (tasks.go).
	partitions partitionWaits

	mu      sync.Mutex
	started bool
	stopped atomic.Bool
}

type registered struct {
	queue   string
	handler Handler
}

// args is a job as River keeps it. Its River kind is the job's kind.
type args struct {
	K        string          `json:"kind"`
	AsyncJob string          `json:"asyncJob"`
	Project  string          `json:"project"`
	Payload  json.RawMessage `json:"payload"`
	// Partition orders the tasks that share it (Task.Partition).
	Partition string `json:"partition,omitempty"`
}

func (a args) Kind() string { return a.K }

// New builds an engine; Handle its kinds, then Start it.
func New(cfg Config) *Engine {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.RescueAfter <= 0 {
		cfg.RescueAfter = 17 * time.Minute
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Engine{cfg: cfg, store: cfg.Store, log: cfg.Log, metrics: newMetrics(cfg.Registerer, cfg.Store),
		workers: river.NewWorkers(), queues: map[string]river.QueueConfig{}, handlers: map[string]registered{}}
}

// Handle registers the handler of a kind of job, run in queue (one queue
// per purpose: its workers are its own). Call it before Start.
func (e *Engine) Handle(kind, queue string, h Handler) {
	e.handlers[kind] = registered{queue: queue, handler: h}
	e.queues[queue] = river.QueueConfig{MaxWorkers: e.cfg.Workers}
	river.AddWorkerArgs(e.workers, args{K: kind}, &worker{engine: e, handler: h, queue: queue})
}

// Start starts the workers. Jobs may be submitted before it (Submit needs
// the River client, which Start and Submit both make on first use).
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started || e.stopped.Load() {
		return nil
	}
	client, err := e.riverClient(ctx)
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("jobs: start: %w", err)
	}
	e.started = true
	e.endOrphans(ctx)
	return nil
}

// endOrphans ends in error the AsyncJobs still waiting or running that
// have no River job: they were accepted by a version that kept its jobs in
// a table of its own, which the move to River dropped (migration 0009).
// Every job accepted since carries its River job's id.
func (e *Engine) endOrphans(ctx context.Context) {
	found, err := store.SearchResources(ctx, e.store, store.AllProjects, "AsyncJob", "status=accepted,active&_count=1000")
	if err != nil {
		e.log.Warn("jobs: looking for jobs left by an earlier version", "err", err)
		return
	}
	for _, job := range found {
		if riverJobID(job) != 0 {
			continue
		}
		out := ErrorOutcome(fhir.Errorf(fhir.EConflict, "The server was upgraded while this job waited, and it did not run: submit it again"))
		err := e.store.InTx(ctx, func(tx store.Store) error { return setStatus(ctx, tx, job.ID(), out, true) })
		if err != nil && !errors.Is(err, errNotActive) {
			e.log.Warn("jobs: ending a job left by an earlier version", "job", job.ID(), "err", err)
		}
	}
}

// riverClient makes the River client once; e.mu is held.
func (e *Engine) riverClient(ctx context.Context) (*river.Client[*sql.Tx], error) {
	if e.client != nil {
		return e.client, nil
	}
	driver, err := e.store.RiverDriver(ctx)
	if err != nil {
		return nil, err
	}
	rescue := e.cfg.RescueAfter
	cfg := &river.Config{
		Logger:  e.log.With("component", "river"),
		Workers: e.workers,
		Queues:  e.queues,
		// A job's context ends before River would take it for lost.
		JobTimeout:           rescue - rescue/10,
		RescueStuckJobsAfter: rescue,
		// River's completions of the AsyncJob-backed jobs happen in the
		// transaction that writes their outcome; it need not keep them.
		CompletedJobRetentionPeriod: time.Hour,
		CancelledJobRetentionPeriod: time.Hour,
		DiscardedJobRetentionPeriod: 24 * time.Hour,
		// A worker that finishes asks for the next job at once, not after
		// River's default cooldown of 100 ms (which caps a queue's rate).
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: e.cfg.Poll,
		MaxAttempts:       e.cfg.MaxAttempts + 1,
		RetryPolicy:       retryPolicy{},
	}
	if len(e.queues) == 0 {
		cfg.Queues, cfg.Workers = nil, nil // only inserts
	}
	client, err := river.NewClient(driver, cfg)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	e.client = client
	return client, nil
}

func (e *Engine) clientFor(ctx context.Context) (*river.Client[*sql.Tx], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.riverClient(ctx)
}

// retryPolicy tries a job again 5 s after a failed attempt, then 10 s, 15 s:
// the failures it sees are the database's, which recovers in seconds.
type retryPolicy struct{}

func (retryPolicy) NextRetry(job *rivertype.JobRow) time.Time {
	return time.Now().Add(time.Duration(max(job.Attempt, 1)) * 5 * time.Second)
}

// Stop stops taking jobs, waits for the running ones until ctx ends, then
// cancels those still running: River hands them back to the queue without
// counting the attempt, so that another process, or this one's next start,
// runs them without waiting for RescueAfter. Stopping twice is harmless.
func (e *Engine) Stop(ctx context.Context) {
	if e.stopped.Swap(true) {
		return
	}
	e.mu.Lock()
	client, started := e.client, e.started
	e.mu.Unlock()
	if !started {
		return
	}
	if err := client.Stop(ctx); err != nil {
		stopNow, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.StopAndCancel(stopNow); err != nil {
			e.log.Warn("jobs: stop", "err", err)
		}
	}
}

// Submit accepts a job: its AsyncJob (status accepted, request the URL it
// answers, in the submitter's project and authored by the submitter) and
// its River job, in one transaction. It answers the AsyncJob's record.
func (e *Engine) Submit(ctx context.Context, p *principal.Principal, kind, request string, payload []byte) (*fhir.Record, error) {
	reg, ok := e.handlers[kind]
	if !ok {
		return nil, fmt.Errorf("jobs: no handler of %q", kind)
	}
	client, err := e.clientFor(ctx)
	if err != nil {
		return nil, err
	}
	id := uuid.NewString()
	var rec *fhir.Record
	err = e.store.InTx(ctx, func(tx store.Store) error {
		sqlTx, ok := sqlstore.TxOf(tx)
		if !ok {
			return errors.New("jobs: the store's transaction is not a SQL transaction")
		}
		// One submission of a project at a time counts its backlog.
		if err := tx.Lock(ctx, "jobs:"+p.ProjectID); err != nil {
			return err
		}
		n, err := e.backlog(ctx, sqlTx, reg.queue, p.ProjectID, max(e.cfg.QueuePerProject, priorityLimit(e.cfg.Workers)))
		if err != nil {
			return err
		}
		if e.cfg.QueuePerProject > 0 && n >= e.cfg.QueuePerProject {
			return fhir.Errorf(fhir.EThrottled, "This project has %d asynchronous jobs waiting or running, the most it may have; try again once some have finished", n)
		}
		meta, _ := json.Marshal(map[string]string{"project": p.ProjectID})
		res, err := client.InsertTx(ctx, sqlTx, args{K: kind, AsyncJob: id, Project: p.ProjectID, Payload: payload},
			&river.InsertOpts{Queue: reg.queue, Priority: priorityFor(n, e.cfg.Workers), Metadata: meta})
		if err != nil {
			return err
		}
		job := fhir.Resource{"resourceType": "AsyncJob", "status": StatusAccepted, "request": request,
			"requestTime": time.Now().UTC().Format(fhir.TimeFormat),
			"extension":   []any{map[string]any{"url": riverJobExtension, "valueString": strconv.FormatInt(res.Job.ID, 10)}}}
		rec, err = tx.Create(ctx, job, store.Write{Project: p.ProjectID, Author: p.Author(), ID: id})
		return err
	})
	if err != nil {
		return nil, err
	}
	e.metrics.submitted.WithLabelValues(reg.queue).Inc()
	return rec, nil
}

// priorityFor is the River priority (1 first, 4 last) of a job whose project
// has backlog jobs waiting or running in its queue: a project's first jobs
// (as many as a process has workers) go first, and the more it has queued,
// the further back its next ones go. Within one priority, jobs run in the
// order they were submitted.
func priorityFor(backlog, workers int) int {
	switch {
	case backlog < workers:
		return 1
	case backlog < 4*workers:
		return 2
	case backlog < 16*workers:
		return 3
	}
	return 4
}

// priorityLimit is the backlog beyond which priorityFor answers the same.
func priorityLimit(workers int) int { return 16 * workers }

// backlog counts the jobs of project that wait or run in queue, up to
// limit: a count beyond what its caller distinguishes would only cost a
// longer scan on every submission.
func (e *Engine) backlog(ctx context.Context, tx *sql.Tx, queue, project string, limit int) (int, error) {
	var q string
	if e.store.Dialect() == sqlstore.Postgres {
		// The project of the jobs that have not ended is indexed
		// (sqlstore's indexRiver; the same expression and states).
		q = `SELECT count(*) FROM (SELECT 1 FROM river_job WHERE (metadata->>'project') = $1::text
			AND queue = $2 AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled') LIMIT $3) AS backlog`
	} else {
		q = `SELECT count(*) FROM (SELECT 1 FROM river_job WHERE json_extract(metadata, '$.project') = ?1 AND queue = ?2
			AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled') LIMIT ?3)`
	}
	var n int
	err := tx.QueryRowContext(ctx, q, project, queue, limit).Scan(&n)
	return n, err
}

// Get reads a job's AsyncJob for p: its submitter, a project admin or a
// super admin; for anyone else it does not exist (404).
func (e *Engine) Get(ctx context.Context, p *principal.Principal, id string) (fhir.Resource, error) {
	return read(ctx, e.store, p, id)
}

func read(ctx context.Context, s store.Store, p *principal.Principal, id string) (fhir.Resource, error) {
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

// riverJobID is the River job of an AsyncJob (0 when it has none).
func riverJobID(job fhir.Resource) int64 {
	exts, _ := job["extension"].([]any)
	for _, x := range exts {
		if m, ok := x.(map[string]any); ok && m["url"] == riverJobExtension {
			s, _ := m["valueString"].(string)
			id, _ := strconv.ParseInt(s, 10, 64)
			return id
		}
	}
	return 0
}

// Cancel cancels a job for p (as Get decides who may): a waiting job never
// runs, and a running one has its context canceled (notified at once
// through the database to whichever process runs it). Its AsyncJob becomes
// cancelled. A job that already ended cannot be cancelled (400), as on the
// reference; cancelling a cancelled job is no error.
func (e *Engine) Cancel(ctx context.Context, p *principal.Principal, id string) error {
	client, err := e.clientFor(ctx)
	if err != nil {
		return err
	}
	err = e.store.InTx(ctx, func(tx store.Store) error {
		sqlTx, ok := sqlstore.TxOf(tx)
		if !ok {
			return errors.New("jobs: the store's transaction is not a SQL transaction")
		}
		job, err := read(ctx, tx, p, id)
		if err != nil {
			return err
		}
		switch st := job.String("status"); st {
		case StatusCancelled:
			return nil
		case StatusCompleted, StatusError:
			return fhir.Invalid(fmt.Sprintf("AsyncJob cannot be cancelled if status is not 'accepted' or 'active', job had status '%s'", st))
		}
		if rid := riverJobID(job); rid != 0 {
			if _, err := client.JobCancelTx(ctx, sqlTx, rid); err != nil && !errors.Is(err, river.ErrNotFound) {
				return err
			}
		}
		return setStatus(ctx, tx, id, Outcome{Status: StatusCancelled}, false)
	})
	if err != nil {
		return err
	}
	e.metrics.ended.WithLabelValues("", "cancelled").Inc()
	return nil
}

// errNotActive says that a job's AsyncJob was cancelled (or deleted) before
// a worker could show it running.
var errNotActive = errors.New("jobs: the job was cancelled")

// setStatus writes a job's status (and output) into its AsyncJob, keeping
// its author (the submitter, who may read it). onlyIfLive leaves a job that
// was cancelled as it is (errNotActive).
func setStatus(ctx context.Context, tx store.Store, id string, out Outcome, onlyIfLive bool) error {
	cur, err := tx.Read(ctx, store.AllProjects, "AsyncJob", id)
	if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
		if onlyIfLive {
			return errNotActive
		}
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
			switch st := job.String("status"); {
			case onlyIfLive && (st == StatusCancelled || st == StatusCompleted || st == StatusError):
				return nil, errNotActive
			case out.Status == StatusActive && st == StatusActive:
				return nil, errUnchanged
			}
			job["status"] = out.Status
			if out.Status != StatusActive {
				job["transactionTime"] = time.Now().UTC().Format(fhir.TimeFormat)
			}
			if out.Output != nil {
				job["output"] = out.Output
			}
			return job, nil
		})
	if errors.Is(err, errUnchanged) {
		return nil
	}
	return err
}

// errUnchanged ends an update that would change nothing (a job started
// again is active already).
var errUnchanged = errors.New("unchanged")

// worker runs the jobs of one kind.
type worker struct {
	river.WorkerDefaults[args]
	engine  *Engine
	handler Handler
	queue   string
}

func (w *worker) Work(ctx context.Context, rj *river.Job[args]) error {
	e := w.engine
	if rj.Attempt == 1 {
		e.metrics.startLatency.WithLabelValues(w.queue).Observe(time.Since(rj.CreatedAt).Seconds())
	}
	e.metrics.running.WithLabelValues(w.queue).Inc()
	defer e.metrics.running.WithLabelValues(w.queue).Dec()
	job := &Job{ID: rj.Args.AsyncJob, Project: rj.Args.Project, Kind: rj.Args.K, Payload: rj.Args.Payload, Attempt: rj.Attempt}

	var out Outcome
	var err error
	if rj.Attempt > e.cfg.MaxAttempts {
		out = Outcome{Status: StatusError, Output: OutcomeParameters(&fhir.OperationOutcome{ResourceType: "OperationOutcome",
			Issue: []fhir.Issue{{Severity: "error", Code: "incomplete", Details: &fhir.IssueDetails{Text: fmt.Sprintf(
				"The job was abandoned: the server could not finish it in %d attempts (it stopped, or its database failed, during each)", rj.Attempt-1)}}}})}
	} else {
		// Shown running, unless it was cancelled meanwhile.
		err = e.store.InTx(ctx, func(tx store.Store) error {
			return setStatus(ctx, tx, job.ID, Outcome{Status: StatusActive}, true)
		})
		if errors.Is(err, errNotActive) {
			e.metrics.ended.WithLabelValues(w.queue, "lost").Inc()
			return river.JobCancel(err)
		}
		if err == nil {
			out, err = w.handler(ctx, job)
		}
	}

	var retry *RetryError
	switch {
	case err == nil:
		// An outcome, even one that arrived as the server was stopping:
		// written below, never run again.
	case ctx.Err() != nil:
		// Cancelled (River cancels the job) or the server stopping (River
		// hands the job back, uncounted): either way nothing is written.
		e.metrics.ended.WithLabelValues(w.queue, "interrupted").Inc()
		return errors.Join(err, context.Cause(ctx), context.Canceled)
	case errors.As(err, &retry):
		e.metrics.ended.WithLabelValues(w.queue, "retry").Inc()
		return river.JobSnooze(retry.After)
	default:
		e.log.Warn("jobs: job failed to run; it will be tried again", "job", job.ID, "kind", job.Kind, "attempt", rj.Attempt, "err", err)
		e.metrics.ended.WithLabelValues(w.queue, "failed").Inc()
		return err
	}

	// A fresh context: what is written now must not be cut short by a
	// cancellation or the shutdown (it keeps the River client River's
	// completion needs).
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err = e.store.InTx(wctx, func(tx store.Store) error {
		sqlTx, ok := sqlstore.TxOf(tx)
		if !ok {
			return errors.New("jobs: the store's transaction is not a SQL transaction")
		}
		if err := setStatus(wctx, tx, job.ID, out, true); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[riverdriver.Driver[*sql.Tx]](wctx, sqlTx, rj)
		return err
	})
	switch {
	case errors.Is(err, errNotActive):
		// Cancelled while it ran: the cancellation stands.
		e.metrics.ended.WithLabelValues(w.queue, "lost").Inc()
		return river.JobCancel(err)
	case err != nil:
		// Nothing was written: the job runs again.
		e.log.Warn("jobs: outcome not written; the job will run again", "job", job.ID, "err", err)
		e.metrics.ended.WithLabelValues(w.queue, "unwritten").Inc()
		return err
	}
	e.metrics.ended.WithLabelValues(w.queue, out.Status).Inc()
	return nil
}

// Timeout leaves a job's deadline to the engine's JobTimeout.
func (w *worker) Timeout(*river.Job[args]) time.Duration { return 0 }

type metrics struct {
	submitted    *prometheus.CounterVec
	running      *prometheus.GaugeVec
	ended        *prometheus.CounterVec
	startLatency *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer, st *sqlstore.Store) *metrics {
	m := &metrics{
		submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_jobs_submitted_total",
			Help: "Jobs accepted by this process, by queue.",
		}, []string{"queue"}),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sandbot_jobs_running",
			Help: "Jobs this process is running, by queue.",
		}, []string{"queue"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_jobs_ended_total",
			Help: "Starts of jobs in this process by how they ended: completed, error, cancelled (by a client, counted where it was asked), lost (cancelled while it ran), interrupted (cancelled or the server stopping), retry (no capacity: run again later, uncounted), failed (tried again later), unwritten.",
		}, []string{"queue", "how"}),
		startLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandbot_jobs_start_latency_seconds",
			Help:    "Time from a job's submission to its first start, by queue.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"queue"}),
	}
	if reg != nil {
		reg.MustRegister(m.submitted, m.running, m.ended, m.startLatency, &queuedCollector{store: st})
	}
	return m
}

// queuedCollector reports the jobs waiting in every queue of the database
// (all processes'), read at each scrape.
type queuedCollector struct{ store *sqlstore.Store }

var queuedDesc = prometheus.NewDesc("sandbot_jobs_queued",
	"Jobs waiting in the database (every process's), by queue and River state: available (due), scheduled (later), retryable (after a failure), running.",
	[]string{"queue", "state"}, nil)

func (c *queuedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- queuedDesc }

func (c *queuedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.store.DB().QueryContext(ctx, `SELECT queue, state, count(*) FROM river_job
		WHERE state IN ('available', 'scheduled', 'retryable', 'running') GROUP BY queue, state`)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var queue, state string
		var n float64
		if rows.Scan(&queue, &state, &n) == nil {
			ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, n, queue, state)
		}
	}
}
