//go:build wasip1

package sdk

import (
	"io"
	"os"
	"unsafe"
)

// The bot ABI, version 1, for the reactor shape: the host allocates the
// event through sandbot_alloc, calls sandbot_handle, and reads the envelope
// at the returned (pointer << 32 | length).

// pinned keeps host-allocated buffers alive (Go's GC would otherwise free
// memory only the host knows about) until the SDK has consumed them.
var pinned = map[uint32][]byte{}

// out keeps the last envelope alive until the host has read it.
var out []byte

//go:wasmexport sandbot_alloc
func sandbotAlloc(size uint32) uint32 {
	if size == 0 {
		size = 1
	}
	b := make([]byte, size)
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	pinned[p] = b
	return p
}

// take returns the pinned buffer at ptr (its first n bytes) and unpins it.
func take(ptr, n uint32) []byte {
	b, ok := pinned[ptr]
	if !ok || uint32(len(b)) < n {
		return nil // not memory the host got from sandbot_alloc
	}
	delete(pinned, ptr)
	return b[:n]
}

//go:wasmexport sandbot_handle
func sandbotHandle(ptr, n uint32) uint64 {
	event := take(ptr, n)
	if event == nil && n > 0 {
		out = buildEnvelope(nil, &Error{Message: "sdk: the event is not in memory from sandbot_alloc"})
	} else {
		out = invoke(event)
	}
	clear(pinned)
	if len(out) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(out))))<<32 | uint64(len(out))
}

//go:wasmimport sandbot log
func sandbotLog(level, ptr, n uint32)

//go:wasmimport sandbot fhir
func sandbotFHIR(ptr, n uint32) uint64

func hostLog(level Level, msg string) {
	if msg == "" {
		msg = " "
	}
	sandbotLog(uint32(level), uint32(uintptr(unsafe.Pointer(unsafe.StringData(msg)))), uint32(len(msg)))
}

func hostFHIR(req []byte) []byte {
	r := sandbotFHIR(uint32(uintptr(unsafe.Pointer(unsafe.SliceData(req)))), uint32(len(req)))
	if r == 0 {
		return nil
	}
	return take(uint32(r>>32), uint32(r))
}

// serveCommand runs the command shape: event on stdin, envelope on stdout.
func serveCommand() {
	event, err := io.ReadAll(os.Stdin)
	if err != nil {
		os.Stderr.WriteString("sdk: reading the event: " + err.Error() + "\n")
		os.Exit(1)
	}
	if _, err := os.Stdout.Write(invoke(event)); err != nil {
		os.Exit(1)
	}
}
