package runtime

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// reserve maps size bytes of private anonymous memory. MAP_NORESERVE: only
// the pages a guest touches count against the machine's memory.
func reserve(size uint64) ([]byte, error) {
	return syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
}

// discard zeroes b by giving its pages back to the kernel. b must be
// page-aligned at its start, which it is: warmBytes is a multiple of the
// page size.
func discard(b []byte) error {
	return syscall.Madvise(b, syscall.MADV_DONTNEED)
}

func release(b []byte) { _ = syscall.Munmap(b) }

// remapZero replaces b (page-aligned) by fresh private anonymous memory:
// zero, and backed by nothing until touched.
func remapZero(b []byte) error {
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_FIXED|unix.MAP_NORESERVE)
	return err
}
