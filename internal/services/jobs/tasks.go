package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// Tasks are background work without an AsyncJob: a subscription's delivery,
// say, which no client polls. A task is enqueued in the transaction that
// makes it due (Enqueue), and run by a TaskFunc that says, by its error,
// whether to try it again.

// Task is a task to enqueue.
type Task struct {
	Kind    string
	Project string
	Payload []byte
	// MaxAttempts is how many times it may be run (0: the engine's).
	MaxAttempts int
	// Order, when set, makes the tasks of a queue that share it run one at
	// a time in the order they were enqueued: a task waits while one
	// enqueued before it is still to run, running or waiting to be tried
	// again (one that gave up no longer holds the others back).
	Order string
	// At, when set, is when it becomes due (River's job scheduler, which
	// runs on the elected leader every few seconds, makes it available).
	At time.Time
	// Unique enqueues it only if no task of the same kind, project and
	// payload is waiting, running or completed (within River's retention):
	// a second Enqueue of the same task, from any process, is a no-op.
	Unique bool
}

// orderWait is how long a task whose predecessor is not done waits before
// it looks again.
const orderWait = 20 * time.Millisecond

// TaskFunc runs a task. nil: done. A *RetryError: run it again after its
// delay, uncounted (no capacity). An error wrapped by Permanent: give up
// now. Any other error: try again, counted, after a delay that doubles
// from a second, until the attempts run out.
type TaskFunc func(ctx context.Context, job *Job) error

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks a task's error as one that trying again would not cure.
func Permanent(err error) error { return &permanentError{err} }

// taskWorkersPerWorker is how many tasks of a queue one process runs at
// once per job worker (SANDBOT_JOB_WORKERS). A task (a delivery) spends
// most of its time waiting on the database and on River's turns; the CPU
// its bot takes is shared out by the runtime's admission, whoever asks. With
// as many task workers as job workers, deliveries ran at a quarter of the
// rate of the writes that caused them (bench/subscriptions).
const taskWorkersPerWorker = 4

// HandleTasks registers the function that runs the tasks of a kind, in
// queue. Call it before Start.
func (e *Engine) HandleTasks(kind, queue string, fn TaskFunc) {
	e.handlers[kind] = registered{queue: queue}
	e.queues[queue] = river.QueueConfig{MaxWorkers: taskWorkersPerWorker * e.cfg.Workers}
	river.AddWorkerArgs(e.workers, args{K: kind}, &taskWorker{engine: e, fn: fn, queue: queue})
}

// Enqueue adds a task in tx, a transaction of the engine's store: it runs
// if and only if tx commits. Its River priority, like a job's, comes from
// its project's backlog in its queue.
func (e *Engine) Enqueue(ctx context.Context, tx store.Store, t Task) error {
	reg, ok := e.handlers[t.Kind]
	if !ok {
		return fmt.Errorf("jobs: no handler of %q", t.Kind)
	}
	client, err := e.clientFor(ctx)
	if err != nil {
		return err
	}
	sqlTx, ok := sqlstore.TxOf(tx)
	if !ok {
		return errors.New("jobs: Enqueue outside a transaction of the store")
	}
	n, err := e.backlog(ctx, sqlTx, reg.queue, t.Project, priorityLimit(e.cfg.Workers))
	if err != nil {
		return err
	}
	m := map[string]string{"project": t.Project}
	if t.Order != "" {
		m["order"] = t.Order
	}
	meta, _ := json.Marshal(m)
	opts := &river.InsertOpts{Queue: reg.queue, Priority: priorityFor(n, e.cfg.Workers), Metadata: meta}
	if t.MaxAttempts > 0 {
		opts.MaxAttempts = t.MaxAttempts
	}
	if !t.At.IsZero() {
		opts.ScheduledAt = t.At
	}
	if t.Unique {
		opts.UniqueOpts = river.UniqueOpts{ByArgs: true}
	}
	_, err = client.InsertTx(ctx, sqlTx, args{K: t.Kind, Project: t.Project, Payload: t.Payload}, opts)
	if err == nil {
		e.metrics.submitted.WithLabelValues(reg.queue).Inc()
	}
	return err
}

// taskWorker runs the tasks of one kind.
type taskWorker struct {
	river.WorkerDefaults[args]
	engine *Engine
	fn     TaskFunc
	queue  string
}

func (w *taskWorker) Work(ctx context.Context, rj *river.Job[args]) error {
	e := w.engine
	var meta struct {
		Order string `json:"order"`
	}
	if json.Unmarshal(rj.Metadata, &meta) == nil && meta.Order != "" {
		waiting, err := e.predecessorPending(ctx, w.queue, meta.Order, rj.ID)
		if err != nil {
			return err
		}
		if waiting {
			return river.JobSnooze(orderWait)
		}
	}
	if rj.Attempt == 1 {
		e.metrics.startLatency.WithLabelValues(w.queue).Observe(time.Since(rj.CreatedAt).Seconds())
	}
	e.metrics.running.WithLabelValues(w.queue).Inc()
	defer e.metrics.running.WithLabelValues(w.queue).Dec()
	job := &Job{Project: rj.Args.Project, Kind: rj.Args.K, Payload: rj.Args.Payload, Attempt: rj.Attempt,
		MaxAttempts: rj.MaxAttempts}
	err := w.fn(ctx, job)
	var retry *RetryError
	var permanent *permanentError
	switch {
	case err == nil:
		e.metrics.ended.WithLabelValues(w.queue, "completed").Inc()
		return nil
	case ctx.Err() != nil:
		e.metrics.ended.WithLabelValues(w.queue, "interrupted").Inc()
		return errors.Join(err, context.Cause(ctx), context.Canceled)
	case errors.As(err, &retry):
		e.metrics.ended.WithLabelValues(w.queue, "retry").Inc()
		return river.JobSnooze(retry.After)
	case errors.As(err, &permanent):
		e.metrics.ended.WithLabelValues(w.queue, "error").Inc()
		return river.JobCancel(err)
	}
	e.metrics.ended.WithLabelValues(w.queue, "failed").Inc()
	return err
}

// predecessorPending reports whether a task of queue with the same order
// key, enqueued before the task id, is still to be done.
func (e *Engine) predecessorPending(ctx context.Context, queue, order string, id int64) (bool, error) {
	var q string
	if e.store.Dialect() == sqlstore.Postgres {
		q = `SELECT EXISTS (SELECT 1 FROM river_job WHERE metadata @> jsonb_build_object('order', $1::text) AND queue = $2
			AND id < $3 AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled'))`
	} else {
		// json_extract(metadata, '$.order') is indexed (sqlstore's
		// indexRiver).
		q = `SELECT EXISTS (SELECT 1 FROM river_job WHERE json_extract(metadata, '$.order') = ?1 AND id < ?3 AND queue = ?2
			AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled'))`
	}
	var pending bool
	err := e.store.DB().QueryRowContext(ctx, q, order, queue, id).Scan(&pending)
	return pending, err
}

// NextRetry doubles the wait after each failed attempt, from a second, up
// to an hour.
func (w *taskWorker) NextRetry(job *river.Job[args]) time.Time {
	return time.Now().Add(min(time.Second<<min(max(job.Attempt-1, 0), 12), time.Hour))
}
