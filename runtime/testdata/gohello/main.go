//go:build wasip1

// gohello is a Go reactor bot written against the raw ABI (no SDK), for the
// runtime's tests and benchmarks: {"input":{"name":"x"}} -> {"result":{"greeting":"Hello, x"}}.
package main

import (
	"encoding/json"
	"unsafe"
)

func main() {}

var pinned = map[uintptr][]byte{}

//go:wasmexport sandbot_alloc
func alloc(size uint32) uint32 {
	b := make([]byte, size)
	if size == 0 {
		return 0
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	pinned[p] = b
	return uint32(p)
}

//go:wasmimport sandbot log
func hostLog(level, ptr, n uint32)

var out []byte

//go:wasmexport sandbot_handle
func handle(ptr, n uint32) uint64 {
	in := unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), n)
	var ev struct {
		Input struct {
			Name string `json:"name"`
		} `json:"input"`
	}
	var env map[string]any
	if err := json.Unmarshal(in, &ev); err != nil {
		env = map[string]any{"error": err.Error()}
	} else {
		msg := "greeting " + ev.Input.Name
		hostLog(1, uint32(uintptr(unsafe.Pointer(unsafe.StringData(msg)))), uint32(len(msg)))
		env = map[string]any{"result": map[string]string{"greeting": "Hello, " + ev.Input.Name}}
	}
	delete(pinned, uintptr(ptr))
	out, _ = json.Marshal(env)
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(out))))<<32 | uint64(len(out))
}
