package runtime

import (
	"sync"
	"time"
)

// admission holds the memory of the executions running on this node against
// a budget (limits.ExecutionMemoryBytes), and that of each tenant (a
// project) against its share: an execution that does not fit is refused at
// once with a *BusyError, never queued, so a burst of hostile executions (40
// bots each touching 64 MiB) cannot take the node's memory, and one project
// cannot take every execution slot.
type admission struct {
	mu      sync.Mutex
	budget  uint64
	share   uint64
	used    uint64
	tenants map[string]uint64
}

func newAdmission(budget, percent int64) *admission {
	return &admission{budget: uint64(budget), share: uint64(budget) / 100 * uint64(percent), tenants: map[string]uint64{}}
}

// retryAfter is what a refused execution is told to wait.
const retryAfter = time.Second

// acquire reserves n bytes for tenant, or says which budget is full. An
// execution larger than a whole budget runs only when that budget is empty.
// The empty tenant has no share of its own (sandbot bot run, tests).
func (a *admission) acquire(tenant string, n uint64) (release func(), refused string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used > 0 && a.used+n > a.budget {
		return nil, "node"
	}
	if t := a.tenants[tenant]; tenant != "" && t > 0 && t+n > a.share {
		return nil, "project"
	}
	a.used += n
	a.tenants[tenant] += n
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.used -= n
		if a.tenants[tenant] -= n; a.tenants[tenant] == 0 {
			delete(a.tenants, tenant)
		}
	}, ""
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
