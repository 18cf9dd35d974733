package rest

import (
	"sync"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// parsedCache keeps decoded resources by id and version. $execute reads the
// Bot and its Project on every call (so that a redeploy or a settings change
// applies to the very next execution, on every replica) but decodes their
// JSON only when the version changed. Callers must not modify what they get.
type parsedCache struct {
	mu sync.Mutex
	m  map[string]parsedEntry
}

type parsedEntry struct {
	version string
	res     fhir.Resource
}

const parsedCacheMax = 4096

// resource decodes rec, or returns the decoding of the same version.
func (c *parsedCache) resource(rec *store.Record) (fhir.Resource, error) {
	c.mu.Lock()
	e, ok := c.m[rec.ID]
	c.mu.Unlock()
	if ok && e.version == rec.VersionID {
		return e.res, nil
	}
	res, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= parsedCacheMax {
		c.m = make(map[string]parsedEntry, 64)
	}
	c.m[rec.ID] = parsedEntry{version: rec.VersionID, res: res}
	c.mu.Unlock()
	return res, nil
}

// recentRecords keeps records read shortly before: a bot's Project (its
// settings and secrets), which every execution needs. An entry is dropped
// when the store announces a change of the project (Handler.Changed, within
// milliseconds on every replica); projectTTL is only the safety net for a
// change feed that failed.
type recentRecords struct {
	mu sync.Mutex
	m  map[string]recentEntry
	// gen counts forgets: a record read before one is not kept after it.
	gen uint64
}

type recentEntry struct {
	rec     *store.Record
	expires time.Time
}

const projectTTL = 10 * time.Second

func (c *recentRecords) get(key string) *store.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || time.Now().After(e.expires) {
		return nil
	}
	return e.rec
}

// generation is taken before the record is read.
func (c *recentRecords) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put keeps rec unless forget ran since gen was taken.
func (c *recentRecords) put(key string, rec *store.Record, gen uint64, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	if c.m == nil || len(c.m) >= parsedCacheMax {
		c.m = make(map[string]recentEntry, 64)
	}
	c.m[key] = recentEntry{rec: rec, expires: time.Now().Add(ttl)}
}

func (c *recentRecords) forget() {
	c.mu.Lock()
	c.m = nil
	c.gen++
	c.mu.Unlock()
}
