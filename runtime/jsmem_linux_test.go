package runtime

import (
	"encoding/binary"
	"os"
	"unsafe"
)

// privateBytes counts the bytes of b's pages that are private copies (see
// jsImage.reset).
func privateBytes(b []byte) (int, error) {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := len(b) / 4096
	entries := make([]byte, 8*n)
	if _, err := f.ReadAt(entries, int64(uintptr(unsafe.Pointer(&b[0]))/4096*8)); err != nil {
		return 0, err
	}
	private := 0
	for i := 0; i < n; i++ {
		if e := binary.LittleEndian.Uint64(entries[8*i:]); e&(1<<63) != 0 && e&(1<<61) == 0 {
			private += 4096
		}
	}
	return private, nil
}
