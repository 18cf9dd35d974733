package runtime

import (
	"sync"

	"github.com/tetratelabs/wazero/experimental"
)

// memPool recycles the linear memories of finished executions. Each buffer
// reserves the runtime's whole memory limit of address space up front (see
// mmap_linux.go), so growing a guest's memory never copies; only the pages the
// guest touches are ever backed. A finished execution's buffer is zeroed
// (the first warmBytes by clearing, which keeps them resident for the next
// execution; the rest are returned to the kernel, which hands back zero
// pages) by a background goroutine, off the request's path: for a Go bot
// that is 0.4 ms of 3 ms. A get that finds no clean buffer zeroes a dirty
// one itself rather than wait, so a buffer is never handed out unzeroed.
type memPool struct {
	size      uint64 // bytes reserved per buffer (the runtime memory limit)
	warmBytes uint64
	maxIdle   int // clean and dirty buffers kept, together

	mu     sync.Mutex
	idle   [][]byte // zeroed
	dirty  []dirtyBuf
	closed bool
	wake   chan struct{}
	done   chan struct{}
}

type dirtyBuf struct {
	b    []byte
	used uint64
}

func newMemPool(size uint64, maxIdle int) *memPool {
	p := &memPool{size: size, warmBytes: 4 << 20, maxIdle: maxIdle,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	go p.cleaner()
	return p
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
	if n := len(p.dirty); n > 0 {
		d := p.dirty[n-1]
		p.dirty[n-1] = dirtyBuf{}
		p.dirty = p.dirty[:n-1]
		p.mu.Unlock()
		if p.zero(d) {
			return d.b, nil
		}
		return reserve(p.size)
	}
	p.mu.Unlock()
	return reserve(p.size)
}

// put hands b, of which the guest used the first used bytes, to the
// cleaner; over maxIdle buffers it is unmapped instead.
func (p *memPool) put(b []byte, used uint64) {
	p.mu.Lock()
	if p.closed || len(p.idle)+len(p.dirty) >= p.maxIdle {
		p.mu.Unlock()
		release(b)
		return
	}
	p.dirty = append(p.dirty, dirtyBuf{b: b, used: min(used, uint64(len(b)))})
	select { // under mu: close closes wake under mu too
	case p.wake <- struct{}{}:
	default:
	}
	p.mu.Unlock()
}

// zero clears the used part of d.b; false means it failed and d.b is gone.
func (p *memPool) zero(d dirtyBuf) bool {
	warm := min(d.used, p.warmBytes)
	clear(d.b[:warm])
	if d.used > warm {
		if err := discard(d.b[warm:d.used]); err != nil {
			release(d.b)
			return false
		}
	}
	return true
}

func (p *memPool) cleaner() {
	defer close(p.done)
	for range p.wake {
		for {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				return
			}
			n := len(p.dirty)
			if n == 0 {
				p.mu.Unlock()
				break
			}
			d := p.dirty[n-1]
			p.dirty[n-1] = dirtyBuf{}
			p.dirty = p.dirty[:n-1]
			p.mu.Unlock()
			if !p.zero(d) {
				continue
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				release(d.b)
				return
			}
			p.idle = append(p.idle, d.b)
			p.mu.Unlock()
		}
	}
}

func (p *memPool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	idle, dirty := p.idle, p.dirty
	p.idle, p.dirty = nil, nil
	close(p.wake)
	p.mu.Unlock()
	<-p.done
	for _, b := range idle {
		release(b)
	}
	for _, d := range dirty {
		release(d.b)
	}
}

// guestMemory is the experimental.LinearMemory of one execution. It enforces
// the execution's memory limit (a refused grow makes memory.grow return -1
// and is remembered, so that the failure it causes is reported as a memory
// failure) and records the high-water mark for the metrics and for zeroing.
type guestMemory struct {
	pool    *memPool // nil: plain Go heap memory, as wazero would do by itself
	image   *jsImage // the module's initial memory, or nil
	mapped  bool     // the image is mapped over the start of buf
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
			if g.image != nil {
				copy(g.buf, g.image.bytes()[:min(uint64(g.image.size), size)])
			}
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
		if g.image != nil {
			if uint64(g.image.size) > uint64(len(b)) || g.image.mapInto(b) != nil {
				g.pool.put(b, 0)
				g.refused = true
				return nil
			}
			g.mapped = true
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
		if g.mapped {
			// Back to anonymous memory before the pool zeroes the rest:
			// madvise on the image's private mapping would bring the
			// image's bytes back, not zeros.
			if err := remapZero(g.buf[:g.image.size]); err != nil {
				release(g.buf)
				g.buf = nil
				return
			}
		}
		g.pool.put(g.buf, g.used)
	}
	g.buf = nil
}

func (g *guestMemory) stats() (used uint64, refused bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, g.refused
}
