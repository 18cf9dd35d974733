package runtime

import (
	"sync"

	"github.com/tetratelabs/wazero/experimental"
)

// memPool recycles the linear memories of finished executions. Each buffer
// reserves the runtime's whole memory limit of address space up front (see
// mmap_linux.go), so growing a guest's memory never copies; only the pages the
// guest touches are ever backed. When an execution ends, the bytes it used are
// zeroed (the first warmBytes by clearing, which keeps them resident for the
// next execution; the rest are returned to the kernel, which hands back zero
// pages), and the buffer goes back to the pool.
type memPool struct {
	size      uint64 // bytes reserved per buffer (the runtime memory limit)
	warmBytes uint64
	maxIdle   int

	mu   sync.Mutex
	idle [][]byte
}

func newMemPool(size uint64, maxIdle int) *memPool {
	return &memPool{size: size, warmBytes: 4 << 20, maxIdle: maxIdle}
}

func (p *memPool) get() ([]byte, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		b := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return b, nil
	}
	p.mu.Unlock()
	return reserve(p.size)
}

// put zeroes the first used bytes of b and keeps it for reuse.
func (p *memPool) put(b []byte, used uint64) {
	if used > uint64(len(b)) {
		used = uint64(len(b))
	}
	warm := min(used, p.warmBytes)
	clear(b[:warm])
	if used > warm {
		if err := discard(b[warm:used]); err != nil {
			release(b)
			return
		}
	}
	p.mu.Lock()
	if len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, b)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	release(b)
}

func (p *memPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, b := range idle {
		release(b)
	}
}

// guestMemory is the experimental.LinearMemory of one execution. It enforces
// the execution's memory limit (a refused grow makes memory.grow return -1
// and is remembered, so that the failure it causes is reported as a memory
// failure) and records the high-water mark for the metrics and for zeroing.
type guestMemory struct {
	pool    *memPool // nil: plain Go heap memory, as wazero would do by itself
	limit   uint64
	buf     []byte
	used    uint64
	refused bool
	freed   bool
	mu      sync.Mutex
}

var _ experimental.LinearMemory = (*guestMemory)(nil)

// Allocate implements experimental.MemoryAllocator. The runtime checks before
// instantiation that the module's initial memory fits the limit.
func (g *guestMemory) Allocate(capacity, max uint64) experimental.LinearMemory {
	return g
}

func (g *guestMemory) Reallocate(size uint64) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if size > g.limit || g.freed {
		g.refused = true
		return nil
	}
	if g.pool == nil {
		if g.buf == nil {
			g.buf = make([]byte, size)
		} else if size > uint64(len(g.buf)) {
			g.buf = append(g.buf, make([]byte, size-uint64(len(g.buf)))...)
		}
		g.used = max(g.used, size)
		return g.buf[:size]
	}
	if g.buf == nil {
		b, err := g.pool.get()
		if err != nil {
			g.refused = true
			return nil
		}
		g.buf = b
	}
	if size > uint64(len(g.buf)) {
		g.refused = true
		return nil
	}
	g.used = max(g.used, size)
	return g.buf[:size:size]
}

// Free returns the buffer to the pool. It is called by wazero when the
// instance is closed, and by the runtime after an execution in case wazero
// did not (an instance closed by its context is not released until its next
// call, which never comes). It is idempotent.
func (g *guestMemory) Free() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.freed {
		return
	}
	g.freed = true
	if g.pool != nil && g.buf != nil {
		g.pool.put(g.buf, g.used)
	}
	g.buf = nil
}

func (g *guestMemory) stats() (used uint64, refused bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, g.refused
}
