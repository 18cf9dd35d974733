//go:build !unix

package sqlstore

import "errors"

// mapCounters is not available: the SQLite read cache is disabled.
func mapCounters(path string, n int) ([]uint64, func(), error) {
	return nil, nil, errors.New("shared counters need mmap")
}
