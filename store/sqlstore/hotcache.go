package sqlstore

import (
	"sync"

	"github.com/sandbot/sandbot/store"
)

// hotCacheMax bounds the rows kept; past it the cache starts again empty.
const hotCacheMax = 10_000

// hotCache keeps, on PostgreSQL, the rows of store.CachedTypes that
// ReadCached fetched outside a transaction, so that an execution reads its
// Bot and Project from memory instead of making two round trips (which halved the throughput of
// $execute against SQLite, docs/performance.md). SQLite has its own exact
// read cache (readCache), which serves every type.
//
// A row is dropped when the change feed delivers its change, before the
// store's subscribers hear of it: on the writing process at the commit,
// before the write returns; on the others moments later. The bots service
// records on each replica which changes it has seen and makes a write of a
// Bot or Project wait until every other live replica has seen it
// (docs/decisions.md 58), so no replica serves the old row once the write
// has answered.
type hotCache struct {
	mu   sync.Mutex
	rows map[string]row
	// gen counts the drops: a read that began before one may have fetched
	// the row as it was before the change, and is not kept.
	gen uint64
}

func newHotCache() *hotCache { return &hotCache{rows: map[string]row{}} }

// get returns the kept row of id if it is of resourceType.
func (c *hotCache) get(resourceType, id string) (row, bool) {
	c.mu.Lock()
	r, ok := c.rows[id]
	c.mu.Unlock()
	return r, ok && r.ResourceType == resourceType
}

// begin is called before a read whose row put may keep.
func (c *hotCache) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put keeps r unless a drop came since its read began (gen).
func (c *hotCache) put(r row, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	if len(c.rows) >= hotCacheMax {
		clear(c.rows)
	}
	c.rows[r.ID] = r
}

// drop forgets the rows the changes name; a change without a type (changes
// may have been missed) forgets every row.
func (c *hotCache) drop(changes []store.Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range changes {
		switch {
		case ch.ResourceType == "":
			clear(c.rows)
		case store.CachedTypes[ch.ResourceType]:
			delete(c.rows, ch.ID)
		default:
			continue
		}
		c.gen++
	}
}
