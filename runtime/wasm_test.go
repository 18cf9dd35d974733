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

// testFunc is a function of a built module: its type index, its encoded
// locals declarations (nil: none) and its instructions (final end included).
type testFunc struct {
	typ    uint32
	locals []byte
	code   []byte
}

// testModule builds reactors (sandbot_alloc is function 0 of type 0,
// sandbot_handle function 1 of type 1) with extra functions, tables, globals
// and sections for the hostile shapes of the module budget tests.
type testModule struct {
	types   [][]byte // extra types after the reactor's three (functype encodings)
	handle  []byte   // sandbot_handle's code; nil: emptyBody
	funcs   []testFunc
	tables  [][]byte // table types (reftype + limits)
	memory  []byte   // limits; nil: min 1, no max
	globals [][]byte // global entries (type, mut, init expr)
	elems   []byte   // element section body
	data    []byte   // data section body
	start   *uint32
	raw     [][]byte // extra sections appended as they are
}

func (tm testModule) build() []byte {
	types := [][]byte{
		functype([]byte{tI32}, []byte{tI32}),
		functype([]byte{tI32, tI32}, []byte{tI64}),
		functype(nil, nil),
	}
	types = append(types, tm.types...)
	fidx := [][]byte{{0}, {1}}
	handle := tm.handle
	if handle == nil {
		handle = emptyBody
	}
	bodies := [][]byte{
		wbody(0x41, 0x80, 0x08, 0x0b),
		wbody(handle...),
	}
	for _, f := range tm.funcs {
		fidx = append(fidx, uleb(f.typ))
		locals := f.locals
		if locals == nil {
			locals = []byte{0}
		}
		b := wcat(locals, f.code)
		bodies = append(bodies, wcat(uleb(uint32(len(b))), b))
	}
	mem := tm.memory
	if mem == nil {
		mem = []byte{0x00, 0x01}
	}
	out := wcat(wasmHeader, wsection(1, wvec(types...)), wsection(3, wvec(fidx...)))
	if len(tm.tables) > 0 {
		out = wcat(out, wsection(4, wvec(tm.tables...)))
	}
	out = wcat(out, wsection(5, wvec(mem)))
	if len(tm.globals) > 0 {
		out = wcat(out, wsection(6, wvec(tm.globals...)))
	}
	out = wcat(out, wsection(7, wvec(
		wcat(wname("memory"), []byte{2, 0}),
		wcat(wname("sandbot_alloc"), []byte{0, 0}),
		wcat(wname("sandbot_handle"), []byte{0, 1}),
	)))
	if tm.start != nil {
		out = wcat(out, wsection(8, uleb(*tm.start)))
	}
	if tm.elems != nil {
		out = wcat(out, wsection(9, tm.elems))
	}
	out = wcat(out, wsection(10, wvec(bodies...)))
	if tm.data != nil {
		out = wcat(out, wsection(11, tm.data))
	}
	for _, r := range tm.raw {
		out = wcat(out, r)
	}
	return out
}

// callTree is a loop-free call tree: sandbot_handle calls function 2, and
// each function k of n calls function k+1 twice; the last returns. It makes
// 2^n calls.
func callTree(n int) testModule {
	var tm testModule
	tm.handle = []byte{0x10, 2, 0x42, 0x00, 0x0b} // call 2; i64.const 0
	for k := 0; k < n; k++ {
		code := []byte{0x0b}
		if k < n-1 {
			next := uleb(uint32(k + 3))
			code = wcat([]byte{0x10}, next, []byte{0x10}, next, []byte{0x0b})
		}
		tm.funcs = append(tm.funcs, testFunc{typ: 2, code: code})
	}
	return tm
}
