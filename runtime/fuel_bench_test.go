package runtime

import (
	"context"
	"github.com/sandbot/sandbot/internal/wasmtest"
	"testing"
)

// What the instrumentation costs (wasmrewrite.go): a tight loop (one fuel
// charge per iteration) and a call-heavy function (a charge and a call depth
// check per call). Both modules are built with wasmtest.Reactor only (the
// runtime's reactorModule before there was a wasmtest), so these two run on
// a build without the instrumentation too, to compare.

// loopBody counts mem[0] down from 10^6 to 0; the envelope is "{}" at 100.
var loopBody = []byte{
	0x41, 0x00, 0x41, 0xc0, 0x84, 0x3d, 0x36, 0x02, 0x00, // mem[0] = 1000000
	0x03, 0x40, // loop
	0x41, 0x00, 0x41, 0x00, 0x28, 0x02, 0x00, 0x41, 0x01, 0x6b, 0x36, 0x02, 0x00, // mem[0] = mem[0] - 1
	0x41, 0x00, 0x28, 0x02, 0x00, 0x0d, 0x00, // br_if 0 (mem[0])
	0x0b,                                                       // end
	0x41, 0xe4, 0x00, 0x41, 0xfb, 0xfa, 0x01, 0x3b, 0x01, 0x00, // mem[100..102] = "{}"
	0x42, 0x82, 0x80, 0x80, 0x80, 0xc0, 0x0c, // i64.const 100<<32 | 2
	0x0b,
}

// fibModule's sandbot_alloc (function 0, (i32) -> i32) is a recursive
// Fibonacci; its handler computes fib(25) (242,785 calls).
func fibModule() []byte {
	wasm := wasmtest.Reactor([]byte{
		0x41, 0x19, 0x10, 0x00, 0x1a, // drop(fib(25))
		0x41, 0xe4, 0x00, 0x41, 0xfb, 0xfa, 0x01, 0x3b, 0x01, 0x00,
		0x42, 0x82, 0x80, 0x80, 0x80, 0xc0, 0x0c,
		0x0b,
	})
	// Replace sandbot_alloc's body (i32.const 1024; end) by fib.
	old := wasmtest.Body(0x41, 0x80, 0x08, 0x0b)
	fib := wasmtest.Body(
		0x20, 0x00, 0x41, 0x02, 0x49, // local.get 0 < 2
		0x04, 0x7f, // if (result i32)
		0x20, 0x00,
		0x05,
		0x20, 0x00, 0x41, 0x01, 0x6b, 0x10, 0x00, // fib(n-1)
		0x20, 0x00, 0x41, 0x02, 0x6b, 0x10, 0x00, // fib(n-2)
		0x6a,
		0x0b,
		0x0b)
	out := make([]byte, 0, len(wasm)+len(fib))
	for i := 0; i+len(old) <= len(wasm); i++ {
		if string(wasm[i:i+len(old)]) == string(old) {
			out = append(append(append(out, wasm[:i]...), fib...), wasm[i+len(old):]...)
			break
		}
	}
	// The code section's size grew.
	return fixSectionSize(out, 10, len(fib)-len(old))
}

// fixSectionSize adds delta to the size of section id (sizes below 128
// bytes, one LEB128 byte, as wasmtest.Reactor makes them).
func fixSectionSize(wasm []byte, id byte, delta int) []byte {
	for off := 8; off < len(wasm); {
		sid, size := wasm[off], int(wasm[off+1])
		if sid == id {
			wasm[off+1] = byte(size + delta)
			return wasm
		}
		off += 2 + size
	}
	return wasm
}

func benchModule(b *testing.B, wasm []byte, unit string, units float64) {
	r := testRuntime(b)
	m, err := r.Compile(context.Background(), wasm)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`)})
		if err != nil || res.Envelope.Result != nil {
			b.Fatal(err, res.Envelope)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/units, "ns/"+unit)
}

func BenchmarkTightLoop(b *testing.B) { benchModule(b, wasmtest.Reactor(loopBody), "iteration", 1e6) }

func BenchmarkCallHeavy(b *testing.B) { benchModule(b, fibModule(), "call", 242785) }

// BenchmarkDataSegment executes a module with a 30 MiB data segment (a
// trivial handler): from an image mapped copy-on-write, and copied in by
// wazero at every instantiation, as before.
func BenchmarkDataSegment(b *testing.B) {
	wasm := wasmtest.DataSegment(30 << 20)
	for _, c := range []struct {
		name string
		min  uint64
	}{{"image", dataImageMin}, {"copy", 1 << 40}} {
		b.Run(c.name, func(b *testing.B) {
			defer func(old uint64) { dataImageMin = old }(dataImageMin)
			dataImageMin = c.min
			r, err := New(context.Background(), Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close(context.Background())
			m, err := r.Compile(context.Background(), wasm)
			if err != nil {
				b.Fatal(err)
			}
			if (m.image != nil) != (c.name == "image") {
				b.Fatal("image not as expected")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`)}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
