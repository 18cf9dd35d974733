//go:build unix

package sqlstore

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// mapCounters maps n uint64 counters from the file at path, shared with
// every process that maps it, creating the file (zeroed) if needed.
func mapCounters(path string, n int) ([]uint64, func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	size := int64(n * 8)
	if st, err := f.Stat(); err != nil {
		return nil, nil, err
	} else if st.Size() < size {
		// Growing with Truncate fills with zeros and never shrinks a file
		// another process has already sized.
		if err := f.Truncate(size); err != nil {
			return nil, nil, err
		}
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("map %s: %w", path, err)
	}
	counters := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n)
	return counters, func() { _ = syscall.Munmap(b) }, nil
}
