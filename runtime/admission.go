package runtime

import (
	"context"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Two things decide when an execution runs, both shared fairly between
// tenants (projects):
//
//   - admission: how many executions the node holds at once, and how much
//     memory they hold (limits.ExecutionsPerCore times the cores, and
//     limits.ExecutionMemoryBytes), each tenant at most its share
//     (limits.ProjectExecutionPercent) of both. An execution that does not
//     fit waits up to limits.ExecutionWaitMillis for room, then is refused
//     with a *BusyError (429): nothing queues without bound.
//   - the CPU (cpuTurns): of the admitted executions, only as many run guest
//     code at a time as there are cores. One that has run a quantum gives
//     its core up at its next fuel yield when another execution waits, and
//     a waiting execution's turn comes in round-robin order across tenants,
//     so that a tenant with forty spinning executions delays another's
//     next one by about one quantum. An execution waiting on I/O (its FHIR
//     calls) holds no core.
//
// Both wait in a fairQueue: first in, first out within a tenant, and the
// tenants in turn.

// fairQueue holds waiters in per-tenant FIFO queues, served tenant by
// tenant in round-robin order.
type fairQueue struct {
	byTenant map[string][]*waiter
	ring     []string // tenants with waiters, in the order they are served
	next     int      // index in ring of the next tenant to serve
	n        int
}

// waiter is one execution waiting for room. ready is closed when it is
// granted.
type waiter struct {
	tenant string
	bytes  uint64
	ready  chan struct{}
}

func (q *fairQueue) push(w *waiter) {
	if q.byTenant == nil {
		q.byTenant = map[string][]*waiter{}
	}
	if len(q.byTenant[w.tenant]) == 0 {
		q.ring = append(q.ring, w.tenant)
	}
	q.byTenant[w.tenant] = append(q.byTenant[w.tenant], w)
	q.n++
}

// take removes and answers the first waiter, in fair order, for which fits
// holds; nil when none does. The tenant after it is served next.
func (q *fairQueue) take(fits func(*waiter) bool) *waiter {
	for i := range q.ring {
		idx := (q.next + i) % len(q.ring)
		t := q.ring[idx]
		w := q.byTenant[t][0]
		if fits != nil && !fits(w) {
			continue
		}
		q.drop(t, 0)
		switch {
		case len(q.ring) == 0:
			q.next = 0
		case len(q.byTenant[t]) > 0:
			q.next = (idx + 1) % len(q.ring) // t waits still: the next tenant first
		default:
			q.next = idx % len(q.ring) // t left the ring: its successor is at idx now
		}
		return w
	}
	return nil
}

// remove takes w out of the queue; false when it is no longer there (it
// was granted).
func (q *fairQueue) remove(w *waiter) bool {
	for i, x := range q.byTenant[w.tenant] {
		if x == w {
			q.drop(w.tenant, i)
			if len(q.ring) > 0 {
				q.next %= len(q.ring)
			} else {
				q.next = 0
			}
			return true
		}
	}
	return false
}

// drop removes the i-th waiter of tenant t, and t from the ring when it has
// no waiter left.
func (q *fairQueue) drop(t string, i int) {
	ws := q.byTenant[t]
	copy(ws[i:], ws[i+1:])
	ws[len(ws)-1] = nil
	ws = ws[:len(ws)-1]
	q.n--
	if len(ws) > 0 {
		q.byTenant[t] = ws
		return
	}
	delete(q.byTenant, t)
	for j, x := range q.ring {
		if x == t {
			q.ring = append(q.ring[:j], q.ring[j+1:]...)
			if j < q.next {
				q.next--
			}
			break
		}
	}
}

// admission holds the executions running on this node against the node's
// budget (how many, how much memory) and each tenant's share of it.
type admission struct {
	mu sync.Mutex
	// budget and share are bytes; slots and slotShare executions.
	budget, share    uint64
	slots, slotShare int
	wait             time.Duration
	used             uint64
	running          int
	tenants          map[string]*tenantUse
	queue            fairQueue
}

type tenantUse struct {
	bytes   uint64
	running int
}

// newAdmission: budget bytes and slots executions for the node, percent of
// both for one tenant, wait for room at most (0: none).
func newAdmission(budget, percent int64, slots int, wait time.Duration) *admission {
	share := max(slots*int(percent)/100, 1)
	return &admission{budget: uint64(budget), share: uint64(budget) / 100 * uint64(percent),
		slots: max(slots, 1), slotShare: share, wait: max(wait, 0), tenants: map[string]*tenantUse{}}
}

// retryAfter is what a refused execution is told to wait.
const retryAfter = time.Second

// refusal says which budget an execution did not fit: "" (it fits),
// "node" or "project". An execution larger than a whole budget fits only
// when that budget is empty. The empty tenant has no share of its own
// (sandbot bot run, tests).
func (a *admission) refusal(tenant string, n uint64) string {
	if a.running >= a.slots || (a.used > 0 && a.used+n > a.budget) {
		return "node"
	}
	if t := a.tenants[tenant]; tenant != "" && t != nil && (t.running >= a.slotShare || (t.bytes > 0 && t.bytes+n > a.share)) {
		return "project"
	}
	return ""
}

func (a *admission) take(tenant string, n uint64) {
	a.used += n
	a.running++
	t := a.tenants[tenant]
	if t == nil {
		t = &tenantUse{}
		a.tenants[tenant] = t
	}
	t.bytes += n
	t.running++
}

// acquire reserves one execution of n bytes for tenant, waiting for room
// up to the admission's wait (or until ctx ends); refused says which budget
// stayed full ("node" or "project").
func (a *admission) acquire(ctx context.Context, tenant string, n uint64) (release func(), refused string) {
	a.mu.Lock()
	refused = a.refusal(tenant, n)
	if refused == "" {
		a.take(tenant, n)
		a.mu.Unlock()
		return a.releaser(tenant, n), ""
	}
	if a.wait <= 0 {
		a.mu.Unlock()
		return nil, refused
	}
	w := &waiter{tenant: tenant, bytes: n, ready: make(chan struct{})}
	a.queue.push(w)
	a.mu.Unlock()
	timer := time.NewTimer(a.wait)
	defer timer.Stop()
	select {
	case <-w.ready:
		return a.releaser(tenant, n), ""
	case <-timer.C:
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.queue.remove(w) {
		// Granted as the wait ended: keep it.
		return a.releaser(tenant, n), ""
	}
	if refused = a.refusal(tenant, n); refused == "" {
		refused = "node"
	}
	return nil, refused
}

func (a *admission) releaser(tenant string, n uint64) func() {
	var once sync.Once
	return func() { once.Do(func() { a.release(tenant, n) }) }
}

// release gives back an execution's reservation and admits, in fair order,
// the waiters that now fit.
func (a *admission) release(tenant string, n uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used -= n
	a.running--
	if t := a.tenants[tenant]; t != nil {
		t.bytes -= n
		if t.running--; t.running == 0 {
			delete(a.tenants, tenant)
		}
	}
	for {
		w := a.queue.take(func(w *waiter) bool { return a.refusal(w.tenant, w.bytes) == "" })
		if w == nil {
			return
		}
		a.take(w.tenant, w.bytes)
		close(w.ready)
	}
}

func (a *admission) reserved() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used
}

// reservation is what one execution of m under lim holds against the
// budget: its linear memory at most (the module's declared maximum if it is
// smaller than the limit), what its instance allocates besides (tables,
// globals, element and data instances), its call stack, and what the host
// buffers for it: the result envelope (or a command's stdout) and one reply
// to a FHIR call, each at most the output limit, and its log (the lines
// kept, and a line being written, at most twice the log limit).
func (r *Runtime) reservation(m *Module, lim Limits) uint64 {
	mem := lim.MemoryBytes
	if m.maxMemory > 0 {
		mem = min(mem, m.maxMemory)
	}
	stack := uint64(r.cfg.Limits.BotStackBytes)
	if m.js != nil {
		stack = uint64(r.jsStackBytes())
	}
	return mem + m.instanceBytes + stack + 2*uint64(lim.OutputBytes) + 4*uint64(lim.LogBytes)
}

// cpuTurns lets as many executions run guest code at once as there are
// cores, in turns (see the top of this file).
type cpuTurns struct {
	mu      sync.Mutex
	cores   int
	busy    int
	queue   fairQueue
	quantum time.Duration
	// waiting is the queue's length, read without the lock at every yield.
	waiting atomic.Int64
}

// cpuQuantum is how long an execution runs guest code before it gives its
// core up to a waiting one (at its next yield, at most yieldFuel
// instructions later).
const cpuQuantum = 2 * time.Millisecond

func newCPUTurns(cores int) *cpuTurns {
	return &cpuTurns{cores: max(cores, 1), quantum: cpuQuantum}
}

// turn is one execution's place with the CPU.
type turn struct {
	c      *cpuTurns
	tenant string
	held   bool
	since  time.Time
	// waited is the time the execution spent waiting for a core.
	waited time.Duration
}

// acquire waits for a core, or for ctx to end (its cause is returned).
func (t *turn) acquire(ctx context.Context) error {
	if t == nil || t.held {
		return nil
	}
	c := t.c
	c.mu.Lock()
	if c.busy < c.cores && c.queue.n == 0 {
		c.busy++
		c.mu.Unlock()
		t.held, t.since = true, time.Now()
		return nil
	}
	w := &waiter{tenant: t.tenant, ready: make(chan struct{})}
	c.queue.push(w)
	c.waiting.Store(int64(c.queue.n))
	c.mu.Unlock()
	start := time.Now()
	select {
	case <-w.ready:
	case <-ctx.Done():
		c.mu.Lock()
		removed := c.queue.remove(w)
		c.waiting.Store(int64(c.queue.n))
		c.mu.Unlock()
		if !removed {
			// Granted as ctx ended: pass the core on.
			t.held = true
			t.release()
		}
		t.waited += time.Since(start)
		return context.Cause(ctx)
	}
	t.since = time.Now()
	t.waited += t.since.Sub(start)
	t.held = true
	return nil
}

// release gives the core to the next waiter in fair order, or frees it.
func (t *turn) release() {
	if t == nil || !t.held {
		return
	}
	t.held = false
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.queue.take(nil); w != nil {
		c.waiting.Store(int64(c.queue.n))
		close(w.ready) // the core passes to w
		return
	}
	c.busy--
}

// yield, at a fuel yield, gives the core up once the execution has run its
// quantum and an execution of another tenant waits, or has run
// tenantQuantum and one of its own tenant waits, and waits for its next
// turn; a tenant's many executions thus yield to another tenant's within a
// quantum, but not to each other every quantum, which would hand the core
// from goroutine to goroutine ahead of the Go scheduler's queue. Otherwise
// it lets the Go scheduler run the goroutines that serve requests: compiled
// guest code cannot be preempted, and left alone the scheduler would take
// the thread back only every 10 ms.
func (t *turn) yield(ctx context.Context) error {
	if t == nil || !t.held {
		return nil
	}
	ran := time.Since(t.since)
	if ran < t.c.quantum {
		return nil
	}
	if t.c.waiting.Load() > 0 {
		if w := t.c.handOver(t.tenant, ran >= tenantQuantum); w != nil {
			t.held = false
			return t.acquire(ctx)
		}
	}
	goruntime.Gosched()
	t.since = time.Now()
	return nil
}

// tenantQuantum is how long an execution runs before it yields to a waiting
// execution of its own tenant.
const tenantQuantum = 10 * cpuQuantum

// handOver passes the core of an execution of tenant to a waiter of another
// tenant (or of any, with anyTenant), in fair order; nil when there is none,
// and the core stays.
func (c *cpuTurns) handOver(tenant string, anyTenant bool) *waiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.queue.take(func(w *waiter) bool { return anyTenant || w.tenant != tenant })
	if w != nil {
		c.waiting.Store(int64(c.queue.n))
		close(w.ready)
	}
	return w
}
