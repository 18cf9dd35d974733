package runtime

// Hand-assembled modules for the shapes a C or Go compiler will not easily
// produce (a bare infinite loop, a raw memory.grow loop, forbidden imports).

func uleb(v uint32) []byte { return appendU32(nil, v) }

func wvec(items ...[]byte) []byte {
	b := uleb(uint32(len(items)))
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

func wname(s string) []byte { return append(uleb(uint32(len(s))), s...) }

func wsection(id byte, body []byte) []byte {
	return append(append([]byte{id}, uleb(uint32(len(body)))...), body...)
}

func wcat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

const (
	tI32 = 0x7f
	tI64 = 0x7e
)

func functype(params, results []byte) []byte {
	return wcat([]byte{0x60}, uleb(uint32(len(params))), params, uleb(uint32(len(results))), results)
}

func wbody(code ...byte) []byte {
	b := append([]byte{0}, code...) // no locals
	return append(uleb(uint32(len(b))), b...)
}

var wasmHeader = []byte("\x00asm\x01\x00\x00\x00")

// reactorModule builds a reactor whose sandbot_alloc returns 1024 and whose
// sandbot_handle has the given body (without the locals declaration).
// imports are extra import entries (each a full import entry), all of
// type 2: () -> ().
func reactorModule(handle []byte, imports ...[]byte) []byte {
	types := wsection(1, wvec(
		functype([]byte{tI32}, []byte{tI32}),
		functype([]byte{tI32, tI32}, []byte{tI64}),
		functype(nil, nil),
	))
	var imp []byte
	if len(imports) > 0 {
		imp = wsection(2, wvec(imports...))
	}
	n := uint32(len(imports))
	funcs := wsection(3, wvec([]byte{0}, []byte{1}))
	table := wsection(4, wvec([]byte{0x70, 0x00, 0x01})) // funcref, min 1, no max
	mem := wsection(5, wvec([]byte{0x00, 0x01}))
	exports := wsection(7, wvec(
		wcat(wname("memory"), []byte{2, 0}),
		wcat(wname("sandbot_alloc"), []byte{0}, uleb(n)),
		wcat(wname("sandbot_handle"), []byte{0}, uleb(n+1)),
	))
	code := wsection(10, wvec(
		wbody(0x41, 0x80, 0x08, 0x0b), // i32.const 1024; end
		wbody(handle...),
	))
	return wcat(wasmHeader, types, imp, funcs, table, mem, exports, code)
}

var (
	// loop br 0 end; unreachable; end
	tightLoopBody = []byte{0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b}
	// loop (if (i32.eq (memory.grow (i32.const 16)) (i32.const -1)) unreachable) br 0 end; unreachable; end
	growBody = []byte{0x03, 0x40, 0x41, 0x10, 0x40, 0x00, 0x41, 0x7f, 0x46, 0x04, 0x40, 0x00, 0x0b, 0x0c, 0x00, 0x0b, 0x00, 0x0b}
	// i64.const 0; end
	emptyBody = []byte{0x42, 0x00, 0x0b}
)

func funcImport(module, name string) []byte {
	return wcat(wname(module), wname(name), []byte{0x00, 0x02})
}

// memoryOnlyModule exports only its memory.
func memoryOnlyModule() []byte {
	return wcat(wasmHeader,
		wsection(5, wvec([]byte{0x00, 0x01})),
		wsection(7, wvec(wcat(wname("memory"), []byte{2, 0}))),
	)
}
