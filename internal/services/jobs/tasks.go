package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
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
	// Partition, when set, orders the tasks of its kind that share it: one
	// runs only once every task of the partition enqueued before it has
	// ended (completed, or given up), so they run one at a time in the
	// order their transactions committed. Tasks of different partitions
	// run in parallel. A task whose predecessor is running waits for it in
	// its worker for up to PartitionWait; one whose predecessor waits (for
	// a worker, or a retry) is put back for PartitionSnooze, without
	// counting an attempt.
	Partition string
	// At, when set, is when it becomes due (River's job scheduler, which
	// runs on the elected leader every few seconds, makes it available).
	At time.Time
	// Unique enqueues it only if no task of the same kind, project and
	// payload is waiting, running or completed (within River's retention):
	// a second Enqueue of the same task, from any process, is a no-op.
	Unique bool
}

// PartitionWait is how long a task of a partition whose predecessor is
// running waits for it in its worker before it is handed back;
// PartitionSnooze is how long a task handed back waits to be fetched again.
const (
	PartitionWait   = 2 * time.Second
	PartitionSnooze = 250 * time.Millisecond
)

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
	return e.EnqueueMany(ctx, tx, []Task{t})
}

// EnqueueMany adds tasks in tx, in their order, with one insert: the
// partitions' locks are taken at once, in sorted order (two transactions
// never wait for each other in a cycle), and each project's backlog is
// counted once.
func (e *Engine) EnqueueMany(ctx context.Context, tx store.Store, tasks []Task) error {
	_, err := e.enqueueMany(ctx, tx, tasks, false)
	return err
}

// EnqueueManyIDs is EnqueueMany, answering the tasks' ids (Job.TaskID), in
// their order, for TaskState. It costs more: River reads the inserted jobs
// back, and on SQLite through its own JSON statement, which EnqueueMany's
// insert avoids (sqlstore's fastInsertSQLite). BenchmarkEnqueueTen, batches
// of ten: on SQLite 140-146 µs a task, against 74-80 without.
func (e *Engine) EnqueueManyIDs(ctx context.Context, tx store.Store, tasks []Task) ([]int64, error) {
	return e.enqueueMany(ctx, tx, tasks, true)
}

func (e *Engine) enqueueMany(ctx context.Context, tx store.Store, tasks []Task, withIDs bool) ([]int64, error) {
	if len(tasks) == 0 {
		return nil, nil
	}
	client, err := e.clientFor(ctx)
	if err != nil {
		return nil, err
	}
	sqlTx, ok := sqlstore.TxOf(tx)
	if !ok {
		return nil, errors.New("jobs: Enqueue outside a transaction of the store")
	}
	// Tasks of a partition are inserted one transaction at a time, so that
	// their ids are in commit order.
	var keys []string
	for _, t := range tasks {
		if t.Partition != "" {
			keys = append(keys, "task-partition "+t.Partition)
		}
	}
	if len(keys) > 0 {
		if err := tx.Lock(ctx, keys...); err != nil {
			return nil, err
		}
	}
	type qp struct{ queue, project string }
	backlogs := map[qp]int{}
	params := make([]river.InsertManyParams, 0, len(tasks))
	queues := make([]string, 0, len(tasks))
	for _, t := range tasks {
		reg, ok := e.handlers[t.Kind]
		if !ok {
			return nil, fmt.Errorf("jobs: no handler of %q", t.Kind)
		}
		k := qp{reg.queue, t.Project}
		n, ok := backlogs[k]
		if !ok {
			if n, err = e.backlog(ctx, sqlTx, reg.queue, t.Project, priorityLimit(e.cfg.Workers)); err != nil {
				return nil, err
			}
		}
		backlogs[k] = n + 1
		md := map[string]string{"project": t.Project}
		if t.Partition != "" {
			md["partition"] = t.Partition
		}
		meta, _ := json.Marshal(md)
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
		params = append(params, river.InsertManyParams{
			Args: args{K: t.Kind, Project: t.Project, Payload: t.Payload, Partition: t.Partition}, InsertOpts: opts})
		queues = append(queues, reg.queue)
	}
	if !withIDs {
		if _, err := client.InsertManyFastTx(ctx, sqlTx, params); err != nil {
			return nil, err
		}
		e.countSubmitted(queues)
		return nil, nil
	}
	res, err := client.InsertManyTx(ctx, sqlTx, params)
	if err != nil {
		return nil, err
	}
	e.countSubmitted(queues)
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	return ids, nil
}

func (e *Engine) countSubmitted(queues []string) {
	for _, q := range queues {
		e.metrics.submitted.WithLabelValues(q).Inc()
	}
}

// TaskState is what became of a task: its state ("available", "running",
// "retryable", "completed", "cancelled", "discarded", ...), the attempts
// started, and the output its function recorded (RecordOutput), if any.
// A task that no longer exists (River deletes ended tasks after a
// retention time) is state "".
func (e *Engine) TaskState(ctx context.Context, id int64) (state string, attempt int, output json.RawMessage, err error) {
	client, err := e.clientFor(ctx)
	if err != nil {
		return "", 0, nil, err
	}
	row, err := client.JobGet(ctx, id)
	if errors.Is(err, river.ErrNotFound) {
		return "", 0, nil, nil
	}
	if err != nil {
		return "", 0, nil, err
	}
	return string(row.State), row.Attempt, row.Output(), nil
}

// RecordOutput records v (JSON) as the output of the task whose function
// is running with ctx; TaskState reads it, on any process, once the
// attempt has ended.
func RecordOutput(ctx context.Context, v any) error { return river.RecordOutput(ctx, v) }

// taskWorker runs the tasks of one kind.
type taskWorker struct {
	river.WorkerDefaults[args]
	engine *Engine
	fn     TaskFunc
	queue  string
}

func (w *taskWorker) Work(ctx context.Context, rj *river.Job[args]) (err error) {
	e := w.engine
	ended := false // completed or given up: it is no task's predecessor any more
	if p := rj.Args.Partition; p != "" {
		// Whatever the outcome, the tasks of the partition waiting on this
		// process look again.
		defer func() { e.partitions.ended(p, rj.ID, ended) }()
		// A predecessor that is running usually ends within moments: wait
		// for it here rather than hand the task back to a fetch that may
		// come only at the next poll. A predecessor on this process wakes
		// the wait as it ends; one on another replica is seen by looking
		// again every partitionPoll. One that waits (its turn, or a retry)
		// may take long: hand the task back at once, behind it in the
		// fetch order.
		deadline := time.Now().Add(PartitionWait)
		var after int64
		for {
			changed := e.partitions.changed(p) // before looking: an end meanwhile is not missed
			// Those that ended on this process, not yet marked so by
			// River's completer (up to 250 ms later), are looked past.
			id, state, err := e.predecessor(ctx, w.queue, p, after, rj.ID, e.partitions.endedHere)
			if err != nil {
				return err
			}
			if state == "" {
				break
			}
			after = id - 1
			if state != "running" || time.Now().After(deadline) {
				e.metrics.ended.WithLabelValues(w.queue, "partition_wait").Inc()
				return river.JobSnooze(PartitionSnooze)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-changed:
			case <-time.After(partitionPoll):
			}
		}
	}
	if rj.Attempt == 1 {
		e.metrics.startLatency.WithLabelValues(w.queue).Observe(time.Since(rj.CreatedAt).Seconds())
	}
	e.metrics.running.WithLabelValues(w.queue).Inc()
	defer e.metrics.running.WithLabelValues(w.queue).Dec()
	job := &Job{Project: rj.Args.Project, Kind: rj.Args.K, Payload: rj.Args.Payload, Attempt: rj.Attempt,
		MaxAttempts: rj.MaxAttempts, TaskID: rj.ID}
	err = w.fn(ctx, job)
	var retry *RetryError
	var permanent *permanentError
	switch {
	case err == nil:
		ended = true
		e.metrics.ended.WithLabelValues(w.queue, "completed").Inc()
		return nil
	case ctx.Err() != nil:
		e.metrics.ended.WithLabelValues(w.queue, "interrupted").Inc()
		return errors.Join(err, context.Cause(ctx), context.Canceled)
	case errors.As(err, &retry):
		e.metrics.ended.WithLabelValues(w.queue, "retry").Inc()
		return river.JobSnooze(retry.After)
	case errors.As(err, &permanent):
		ended = true
		e.metrics.ended.WithLabelValues(w.queue, "error").Inc()
		return river.JobCancel(err)
	}
	e.metrics.ended.WithLabelValues(w.queue, "failed").Inc()
	return err
}

// partitionPoll is how often a task waiting for a predecessor that runs
// on another process looks again.
const partitionPoll = 20 * time.Millisecond

// partitionWaits wakes the tasks of a partition that wait on this process
// for a predecessor when a task of the partition ends here, and knows which
// tasks ended here: River's batch completer marks a task completed up to
// 250 ms after its function returned, and its successors would wait for
// that (looking every few milliseconds: most of the database's work under
// an HL7 feed, docs/performance.md).
type partitionWaits struct {
	mu       sync.Mutex
	m        map[string]chan struct{}
	endedIDs map[int64]time.Time
}

// endedHereFor is how long a task that ended here is remembered: far
// longer than River's completer takes to record it.
const endedHereFor = time.Minute

// changed is closed at the next end of a task of partition p.
func (w *partitionWaits) changed(p string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.m[p]
	if !ok {
		if w.m == nil {
			w.m = map[string]chan struct{}{}
		}
		ch = make(chan struct{})
		w.m[p] = ch
	}
	return ch
}

// ended wakes the waits of partition p as task id's attempt ends there
// (ended: for good, completed or given up). Every waiting task ends too
// (runs, or is handed back), so the partition's entry does not outlive
// its waits.
func (w *partitionWaits) ended(p string, id int64, ended bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ended {
		now := time.Now()
		if w.endedIDs == nil {
			w.endedIDs = map[int64]time.Time{}
		}
		if len(w.endedIDs) >= 4096 {
			for k, at := range w.endedIDs {
				if now.Sub(at) > endedHereFor {
					delete(w.endedIDs, k)
				}
			}
		}
		w.endedIDs[id] = now
	}
	if ch, ok := w.m[p]; ok {
		close(ch)
		delete(w.m, p)
	}
}

// endedHere tells whether task id ended for good on this process.
func (w *partitionWaits) endedHere(id int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.endedIDs[id]
	return ok && time.Since(at) <= endedHereFor
}

// predecessor is the id and state of the first task of partition enqueued
// after task after and before task id that has not ended, looking past
// those endedHere says ended on this process (state "" when there is none).
func (e *Engine) predecessor(ctx context.Context, queue, partition string, after, id int64, endedHere func(int64) bool) (int64, string, error) {
	var q string
	if e.store.Dialect() == sqlstore.Postgres {
		// The partition of the jobs that have not ended is indexed
		// (sqlstore's indexRiver; the same expression and states).
		q = `SELECT id, state::text FROM river_job WHERE (metadata->>'partition') = $1::text
			AND queue = $2 AND id > $3 AND id < $4 AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled')
			ORDER BY id LIMIT $5`
	} else {
		q = `SELECT id, state FROM river_job WHERE json_extract(metadata, '$.partition') = ?1 AND id > ?3 AND id < ?4
			AND queue = ?2 AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled') ORDER BY id LIMIT ?5`
	}
	for {
		rows, err := e.store.DB().QueryContext(ctx, q, partition, queue, after, id, predecessorPage)
		if err != nil {
			return 0, "", err
		}
		n := 0
		for rows.Next() {
			var pid int64
			var state string
			if err := rows.Scan(&pid, &state); err != nil {
				rows.Close()
				return 0, "", err
			}
			n, after = n+1, pid
			if !endedHere(pid) {
				rows.Close()
				return pid, state, nil
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return 0, "", err
		}
		if n < predecessorPage {
			return 0, "", nil
		}
	}
}

// predecessorPage is how many of a task's predecessors one lookup reads:
// under a feed, several that ended on this process wait for River's
// completer to mark them, and one lookup each (as before) was four per
// message.
const predecessorPage = 16

// NextRetry doubles the wait after each failed attempt, from a second, up
// to an hour.
func (w *taskWorker) NextRetry(job *river.Job[args]) time.Time {
	return time.Now().Add(min(time.Second<<min(max(job.Attempt-1, 0), 12), time.Hour))
}
