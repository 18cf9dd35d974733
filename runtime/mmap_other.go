//go:build !linux

package runtime

// Outside Linux the pool keeps ordinary Go memory.

func reserve(size uint64) ([]byte, error) { return make([]byte, size), nil }

func discard(b []byte) error { clear(b); return nil }

func release([]byte) {}

func remapZero(b []byte) error { clear(b); return nil }
