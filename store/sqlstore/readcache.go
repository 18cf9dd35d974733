package sqlstore

import (
	"sync"
	"sync/atomic"
)

// readCache keeps the current rows of recently read resources of a SQLite
// database, so that the reads every request repeats (the Bot of a
// $execute, above all) do not go to SQLite. It exists for latency more than
// for throughput: under a steady stream of writes (a bot's AuditEvents),
// one read in a thousand of the same row from SQLite took over 4 ms
// (BenchmarkReadDuringAuditWrites), which set the tail of every $execute.
//
// Validity across processes: every sandbot process on one database file
// maps the same small file of version counters (the database path plus
// "-versions", as SQLite keeps its own "-shm" beside the database). A
// transaction that updates or deletes a resource increments the counter of
// the resource's slot after it commits; a cached row is used only while its
// slot's counter still has the value read before the row was fetched. A
// write by another process is therefore seen by the very next read, as
// without the cache. Creations need no increment: a new id was never cached
// (misses are not cached). Writers outside sandbot (the sqlite3 shell) are
// not seen until the process restarts.
type readCache struct {
	counters []uint64 // shared with the other processes (mmap), or local
	release  func()

	mu       sync.RWMutex
	rows     map[string]cachedRow
	bytes    int
	maxBytes int
}

type cachedRow struct {
	r     row
	stamp uint64
}

// readCacheSlots is the number of version counters: 16,384 (128 KiB). Two
// ids in one slot only cost each other spurious misses.
const readCacheSlots = 1 << 14

// readCacheBytes bounds the JSON the cache holds.
const readCacheBytes = 64 << 20

// newReadCache fails when the counters cannot be shared: then there is no
// cache, rather than one that could go stale.
func newReadCache(counterPath string) (*readCache, error) {
	counters, release, err := mapCounters(counterPath, readCacheSlots+1)
	if err != nil {
		return nil, err
	}
	return &readCache{rows: map[string]cachedRow{}, maxBytes: readCacheBytes, counters: counters, release: release}, nil
}

// changeCounter is the counter after the slots: every process increments it
// after committing changes of store.ChangeTypes, and the change feed reads
// the changes table only when it moved (changes.go).
func (c *readCache) changeCounter() *uint64 { return &c.counters[readCacheSlots] }

func (c *readCache) slot(id string) *uint64 {
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return &c.counters[h%readCacheSlots]
}

// stamp is taken before a row is read from the database and passed to put.
func (c *readCache) stamp(id string) uint64 { return atomic.LoadUint64(c.slot(id)) }

func (c *readCache) get(id string) (row, bool) {
	c.mu.RLock()
	e, ok := c.rows[id]
	c.mu.RUnlock()
	if !ok || e.stamp != c.stamp(id) {
		return row{}, false
	}
	return e.r, true
}

// put caches r if no write to its slot has committed since stamp was taken.
func (c *readCache) put(r row, stamp uint64) {
	if r.Deleted || len(r.Content) > c.maxBytes/64 || c.stamp(r.ID) != stamp {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.rows[r.ID]; ok {
		c.bytes -= len(old.r.Content)
	}
	// Over budget: drop arbitrary entries (map order) until there is room.
	for id, e := range c.rows {
		if c.bytes+len(r.Content) <= c.maxBytes {
			break
		}
		delete(c.rows, id)
		c.bytes -= len(e.r.Content)
	}
	c.rows[r.ID] = cachedRow{r: r, stamp: stamp}
	c.bytes += len(r.Content)
}

// invalidate is called after a transaction that changed ids has committed.
func (c *readCache) invalidate(ids []string) {
	for _, id := range ids {
		atomic.AddUint64(c.slot(id), 1)
	}
	c.mu.Lock()
	for _, id := range ids {
		if e, ok := c.rows[id]; ok {
			c.bytes -= len(e.r.Content)
			delete(c.rows, id)
		}
	}
	c.mu.Unlock()
}

func (c *readCache) close() { c.release() }
