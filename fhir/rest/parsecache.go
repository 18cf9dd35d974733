package rest

import (
	"sync"

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
