package runtime

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// jsImage is a JavaScript bot's snapshot: the engine's linear memory after
// @medplum/core and the bot's module were evaluated. On Linux it lives in a
// memfd and is mapped copy-on-write over the start of each instance's memory
// reservation: restoring costs no copy, an execution pays only for the pages
// it writes (a page fault and a 4 KiB copy each), and every instance of one
// bot shares the image's pages in the page cache.
//
// Between executions an instance's memory is put back to the image page by
// page: /proc/self/pagemap tells which pages of the mapping are private
// copies (written since the mapping was made), and only those are copied
// back from the image. The pages an execution merely read stay mapped, so
// the next execution does not fault them in again; and a page copied back
// stays private, so the next execution writing it takes no fault either.
// (Dropping the written pages with MADV_DONTNEED instead, the fallback when
// pagemap cannot be read, made a trivial bot's execution 0.5 ms slower: the
// next execution faulted every page back in.)
type jsImage struct {
	size int    // bytes, a multiple of the wasm page size
	sp   uint64 // the __stack_pointer global at the snapshot
	fd   int
	view []byte // the image, mapped shared and read-only
}

var pagemap struct {
	once sync.Once
	f    *os.File
}

var pagemapBuffers = sync.Pool{New: func() any { return new([]byte) }}

func pagemapFile() *os.File {
	pagemap.once.Do(func() {
		if f, err := os.Open("/proc/self/pagemap"); err == nil {
			pagemap.f = f
		}
	})
	return pagemap.f
}

func newJSImage(mem []byte, sp uint64) (*jsImage, error) {
	fd, err := unix.MemfdCreate("sandbot-js-image", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("runtime: memfd for a JavaScript image: %w", err)
	}
	for off := 0; off < len(mem); {
		n, err := unix.Pwrite(fd, mem[off:], int64(off))
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("runtime: writing a JavaScript image: %w", err)
		}
		off += n
	}
	view, err := unix.Mmap(fd, 0, len(mem), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("runtime: mapping a JavaScript image: %w", err)
	}
	return &jsImage{size: len(mem), sp: sp, fd: fd, view: view}, nil
}

// mapInto shows the image, copy-on-write, over the start of buf (a
// reservation from reserve, at least img.size bytes).
func (img *jsImage) mapInto(buf []byte) error {
	_, err := unix.MmapPtr(img.fd, 0, unsafe.Pointer(unsafe.SliceData(buf)), uintptr(img.size),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_FIXED)
	return err
}

// reset puts buf[:img.size] back to the image: the private pages (written
// since mapInto) get the image's bytes again.
func (img *jsImage) reset(buf []byte) error {
	const page = 4096
	f := pagemapFile()
	if f == nil {
		return img.drop(buf)
	}
	n := img.size / page
	bp := pagemapBuffers.Get().(*[]byte)
	defer pagemapBuffers.Put(bp)
	if cap(*bp) < 8*n {
		*bp = make([]byte, 8*n)
	}
	entries := (*bp)[:8*n]
	first := uintptr(unsafe.Pointer(unsafe.SliceData(buf))) / page
	if _, err := f.ReadAt(entries, int64(first*8)); err != nil {
		return img.drop(buf)
	}
	for i := 0; i < n; i++ {
		e := binary.LittleEndian.Uint64(entries[8*i:])
		const present, swapped, fileOrShared = 1 << 63, 1 << 62, 1 << 61
		if (e&present != 0 && e&fileOrShared == 0) || e&swapped != 0 {
			copy(buf[i*page:(i+1)*page], img.view[i*page:(i+1)*page])
		}
	}
	return nil
}

// drop discards every private page of buf[:img.size]: the next access maps
// the image's page again (MADV_DONTNEED on a private file mapping).
func (img *jsImage) drop(buf []byte) error {
	return unix.Madvise(buf[:img.size], unix.MADV_DONTNEED)
}

// bytes is the image's contents (read-only).
func (img *jsImage) bytes() []byte { return img.view }

func (img *jsImage) close() {
	_ = unix.Munmap(img.view)
	unix.Close(img.fd)
}
