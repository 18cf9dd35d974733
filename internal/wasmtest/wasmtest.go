// Package wasmtest builds small WebAssembly modules byte by byte for tests:
// reactors following the bot ABI with chosen function bodies, and the
// hostile shapes (huge declarations, call trees, floods, compiler blow-ups)
// that the runtime must refuse or contain. It is shared by the runtime's
// tests and the server-level ones. Shapes a C or Go compiler would not
// easily produce are built here rather than compiled.
package wasmtest

// ULEB is v as an unsigned LEB128.
func ULEB(v uint32) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// SLEB is v as a signed LEB128.
func SLEB(v int64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// Vec is a vector: its length, then its items.
func Vec(items ...[]byte) []byte {
	b := ULEB(uint32(len(items)))
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

// Name is a name: its length, then its bytes.
func Name(s string) []byte { return append(ULEB(uint32(len(s))), s...) }

// Section is a section with its id and size.
func Section(id byte, body []byte) []byte {
	return append(append([]byte{id}, ULEB(uint32(len(body)))...), body...)
}

// Cat concatenates.
func Cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// Value types.
const (
	I32 = 0x7f
	I64 = 0x7e
)

// FuncType is a function type.
func FuncType(params, results []byte) []byte {
	return Cat([]byte{0x60}, ULEB(uint32(len(params))), params, ULEB(uint32(len(results))), results)
}

// Body is a function body with no locals, with its size.
func Body(code ...byte) []byte {
	b := append([]byte{0}, code...)
	return append(ULEB(uint32(len(b))), b...)
}

// Header is a module's magic number and version.
var Header = []byte("\x00asm\x01\x00\x00\x00")

// Reactor builds a reactor whose sandbot_alloc returns 1024 and whose
// sandbot_handle has the given body (without the locals declaration).
// imports are extra import entries (each a full import entry), all of
// type 2: () -> ().
func Reactor(handle []byte, imports ...[]byte) []byte {
	types := Section(1, Vec(
		FuncType([]byte{I32}, []byte{I32}),
		FuncType([]byte{I32, I32}, []byte{I64}),
		FuncType(nil, nil),
	))
	var imp []byte
	if len(imports) > 0 {
		imp = Section(2, Vec(imports...))
	}
	n := uint32(len(imports))
	funcs := Section(3, Vec([]byte{0}, []byte{1}))
	table := Section(4, Vec([]byte{0x70, 0x00, 0x01})) // funcref, min 1, no max
	mem := Section(5, Vec([]byte{0x00, 0x01}))
	exports := Section(7, Vec(
		Cat(Name("memory"), []byte{2, 0}),
		Cat(Name("sandbot_alloc"), []byte{0}, ULEB(n)),
		Cat(Name("sandbot_handle"), []byte{0}, ULEB(n+1)),
	))
	code := Section(10, Vec(
		Body(0x41, 0x80, 0x08, 0x0b), // i32.const 1024; end
		Body(handle...),
	))
	return Cat(Header, types, imp, funcs, table, mem, exports, code)
}

var (
	// TightLoopBody is loop br 0 end; unreachable; end.
	TightLoopBody = []byte{0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b}
	// GrowBody is loop (if (i32.eq (memory.grow (i32.const 16))
	// (i32.const -1)) unreachable) br 0 end; unreachable; end.
	GrowBody = []byte{0x03, 0x40, 0x41, 0x10, 0x40, 0x00, 0x41, 0x7f, 0x46, 0x04, 0x40, 0x00, 0x0b, 0x0c, 0x00, 0x0b, 0x00, 0x0b}
	// EmptyBody is i64.const 0; end.
	EmptyBody = []byte{0x42, 0x00, 0x0b}
)

// FuncImport is an import entry of a function of type 2, () -> ().
func FuncImport(module, name string) []byte {
	return Cat(Name(module), Name(name), []byte{0x00, 0x02})
}

// TypedImport is an import entry of a function of type typ.
func TypedImport(module, name string, typ uint32) []byte {
	return Cat(Name(module), Name(name), []byte{0x00}, ULEB(typ))
}

// MemoryOnly exports only its memory.
func MemoryOnly() []byte {
	return Cat(Header,
		Section(5, Vec([]byte{0x00, 0x01})),
		Section(7, Vec(Cat(Name("memory"), []byte{2, 0}))),
	)
}

// Func is a function of a built module: its type index, its encoded
// locals declarations (nil: none) and its instructions (final end included).
type Func struct {
	Type   uint32
	Locals []byte
	Code   []byte
}

// Module builds a reactor: types 0 (i32) -> i32, 1 (i32, i32) -> i64 and
// 2 () -> () come first; sandbot_alloc (type 0, returns 1024) and
// sandbot_handle (type 1) are the first functions after the imports, and
// Funcs follow them.
type Module struct {
	Types [][]byte // extra types, from index 3 (FuncType encodings)
	// Imports are import entries; they come first in the function index
	// space, so sandbot_alloc and sandbot_handle are then len(Imports) and
	// len(Imports)+1.
	Imports [][]byte
	Handle  []byte // sandbot_handle's code; nil: EmptyBody
	Funcs   []Func
	Tables  [][]byte // table types (reftype + limits)
	Memory  []byte   // limits; nil: min 1, no max
	Globals [][]byte // global entries (type, mut, init expr)
	Elems   []byte   // element section body
	Data    []byte   // data section body
	Start   *uint32
}

// Build encodes the module.
func (m Module) Build() []byte {
	types := [][]byte{
		FuncType([]byte{I32}, []byte{I32}),
		FuncType([]byte{I32, I32}, []byte{I64}),
		FuncType(nil, nil),
	}
	types = append(types, m.Types...)
	fidx := [][]byte{{0}, {1}}
	handle := m.Handle
	if handle == nil {
		handle = EmptyBody
	}
	bodies := [][]byte{
		Body(0x41, 0x80, 0x08, 0x0b),
		Body(handle...),
	}
	for _, f := range m.Funcs {
		fidx = append(fidx, ULEB(f.Type))
		locals := f.Locals
		if locals == nil {
			locals = []byte{0}
		}
		b := Cat(locals, f.Code)
		bodies = append(bodies, Cat(ULEB(uint32(len(b))), b))
	}
	mem := m.Memory
	if mem == nil {
		mem = []byte{0x00, 0x01}
	}
	out := Cat(Header, Section(1, Vec(types...)))
	if len(m.Imports) > 0 {
		out = Cat(out, Section(2, Vec(m.Imports...)))
	}
	out = Cat(out, Section(3, Vec(fidx...)))
	if len(m.Tables) > 0 {
		out = Cat(out, Section(4, Vec(m.Tables...)))
	}
	out = Cat(out, Section(5, Vec(mem)))
	if len(m.Globals) > 0 {
		out = Cat(out, Section(6, Vec(m.Globals...)))
	}
	out = Cat(out, Section(7, Vec(
		Cat(Name("memory"), []byte{2, 0}),
		Cat(Name("sandbot_alloc"), []byte{0}, ULEB(uint32(len(m.Imports)))),
		Cat(Name("sandbot_handle"), []byte{0}, ULEB(uint32(len(m.Imports)+1))),
	)))
	if m.Start != nil {
		out = Cat(out, Section(8, ULEB(*m.Start)))
	}
	if m.Elems != nil {
		out = Cat(out, Section(9, m.Elems))
	}
	out = Cat(out, Section(10, Vec(bodies...)))
	if m.Data != nil {
		out = Cat(out, Section(11, m.Data))
	}
	return out
}

// Locals declares locals in groups of (count, value type).
func Locals(groups ...[2]uint32) []byte {
	b := ULEB(uint32(len(groups)))
	for _, g := range groups {
		b = append(b, ULEB(g[0])...)
		b = append(b, byte(g[1]))
	}
	return b
}

// Nested is depth empty blocks nested in each other, and the final end.
func Nested(depth int) []byte {
	var b []byte
	for range depth {
		b = append(b, 0x02, 0x40)
	}
	for range depth {
		b = append(b, 0x0b)
	}
	return append(b, 0x0b)
}

// BrTable is a br_table of targets targets (all to label 0) in a block,
// and the final end.
func BrTable(targets int) []byte {
	b := []byte{0x02, 0x40, 0x41, 0x00, 0x0e}
	b = append(b, ULEB(uint32(targets-1))...)
	for range targets {
		b = append(b, 0x00)
	}
	return append(b, 0x0b, 0x0b)
}

// CallTree is a loop-free call tree: sandbot_handle calls function 2, and
// each function k of n calls function k+1 twice; the last returns. It makes
// 2^n calls.
func CallTree(n int) Module {
	var m Module
	m.Handle = []byte{0x10, 2, 0x42, 0x00, 0x0b} // call 2; i64.const 0
	for k := 0; k < n; k++ {
		code := []byte{0x0b}
		if k < n-1 {
			next := ULEB(uint32(k + 3))
			code = Cat([]byte{0x10}, next, []byte{0x10}, next, []byte{0x0b})
		}
		m.Funcs = append(m.Funcs, Func{Type: 2, Code: code})
	}
	return m
}

// ExpensiveToCompile is within sandbot's module budget (119 KB, 50,000
// locals, one br_table of 60,000 targets into 200 nested blocks, 5,000
// locals moved around in a loop) and costs wazero's compiler about 8 s of
// CPU and 165 MB.
func ExpensiveToCompile() []byte {
	const depth, targets = 200, 60_000
	code := []byte{0x03, 0x40} // loop
	for range depth {
		code = append(code, 0x02, 0x40)
	}
	for i := range 5000 {
		code = append(code, 0x20)
		code = append(code, ULEB(uint32(i*10))...)
		code = append(code, 0x21)
		code = append(code, ULEB(uint32(i*10+1))...)
	}
	code = append(code, 0x41, 0x00, 0x0e)
	code = append(code, ULEB(targets-1)...)
	for i := range targets {
		code = append(code, ULEB(uint32(i%(depth+1)))...)
	}
	for range depth + 2 {
		code = append(code, 0x0b)
	}
	return Module{Funcs: []Func{{Type: 2, Locals: Locals([2]uint32{50_000, I64}), Code: code}}}.Build()
}

// LogFlood logs empty lines through sandbot.log forever.
func LogFlood() []byte {
	return Module{
		Types:   [][]byte{FuncType([]byte{I32, I32, I32}, nil)},
		Imports: [][]byte{TypedImport("sandbot", "log", 3)},
		// loop: log(1, 0, 0); br 0
		Handle: []byte{0x03, 0x40, 0x41, 0x01, 0x41, 0x00, 0x41, 0x00, 0x10, 0x00, 0x0c, 0x00, 0x0b, 0x42, 0x00, 0x0b},
	}.Build()
}

// IovecFlood writes a million empty iovecs to stderr with WASI's fd_write,
// forever.
func IovecFlood() []byte {
	return Module{
		Types:   [][]byte{FuncType([]byte{I32, I32, I32, I32}, []byte{I32})},
		Imports: [][]byte{TypedImport("wasi_snapshot_preview1", "fd_write", 3)},
		Memory:  []byte{0x00, 0x80, 0x01}, // 128 pages: a million zero iovecs at 0
		// loop: drop(fd_write(2, 0, 1000000, 8000000)); br 0
		Handle: Cat([]byte{0x03, 0x40, 0x41, 0x02, 0x41, 0x00, 0x41}, SLEB(1_000_000), []byte{0x41}, SLEB(8_000_000),
			[]byte{0x10, 0x00, 0x1a, 0x0c, 0x00, 0x0b, 0x42, 0x00, 0x0b}),
	}.Build()
}

// MemoryToucher grows its memory to pages 64 KiB pages, writes every byte
// of it (memory.fill), then loops until its deadline.
func MemoryToucher(pages uint32) []byte {
	return Module{Handle: Cat(
		[]byte{0x41}, SLEB(int64(pages-1)), []byte{0x40, 0x00, 0x1a}, // drop(memory.grow(pages-1))
		[]byte{0x41, 0x00, 0x41, 0x01, 0x41}, SLEB(int64(pages)<<16), []byte{0xfc, 11, 0x00}, // memory.fill(0, 1, pages*64Ki)
		TightLoopBody,
	)}.Build()
}

// DenseCode is one function of about size bytes of straight-line code
// (i32.const 1; i32.const 1; i32.add; drop, over and over).
func DenseCode(size int) []byte {
	unit := []byte{0x41, 0x01, 0x41, 0x01, 0x6a, 0x1a}
	code := make([]byte, 0, size+1)
	for len(code)+len(unit) <= size {
		code = append(code, unit...)
	}
	return Module{Funcs: []Func{{Type: 2, Code: append(code, 0x0b)}}}.Build()
}

// HugeTables declares n funcref tables of initial size each.
func HugeTables(n int, size uint32) []byte {
	var m Module
	for range n {
		m.Tables = append(m.Tables, Cat([]byte{0x70, 0x00}, ULEB(size)))
	}
	return m.Build()
}

// DataSegment has one active data segment of size bytes at offset 0 and a
// memory just large enough for it; the segment starts with "{}", which its
// handler returns as its result envelope.
func DataSegment(size int) []byte {
	pages := uint32((size + 0xffff) >> 16)
	data := make([]byte, size)
	for i := range data {
		data[i] = 0x5a
	}
	copy(data, "{}")
	return Module{
		Memory: Cat([]byte{0x00}, ULEB(pages)),
		Data:   Vec(Cat([]byte{0x00, 0x41, 0x00, 0x0b}, ULEB(uint32(size)), data)),
		Handle: []byte{0x42, 0x02, 0x0b}, // i64.const 2: the envelope at 0, 2 bytes
	}.Build()
}

// RandomGetFlood asks WASI's random_get for n bytes at address 0, forever;
// its memory is just large enough.
func RandomGetFlood(n int) []byte {
	pages := uint32((n + 0xffff) >> 16)
	return Module{
		Types:   [][]byte{FuncType([]byte{I32, I32}, []byte{I32})},
		Imports: [][]byte{TypedImport("wasi_snapshot_preview1", "random_get", 3)},
		Memory:  Cat([]byte{0x00}, ULEB(pages)),
		// loop: drop(random_get(0, n)); br 0
		Handle: Cat([]byte{0x03, 0x40, 0x41, 0x00, 0x41}, SLEB(int64(n)), []byte{0x10, 0x00, 0x1a, 0x0c, 0x00, 0x0b, 0x42, 0x00, 0x0b}),
	}.Build()
}

// RandomGetThroughTable is RandomGetFlood with random_get reached through a
// table (call_indirect), not by name.
func RandomGetThroughTable(n int) []byte {
	pages := uint32((n + 0xffff) >> 16)
	return Module{
		Types:   [][]byte{FuncType([]byte{I32, I32}, []byte{I32})},
		Imports: [][]byte{TypedImport("wasi_snapshot_preview1", "random_get", 3)},
		Memory:  Cat([]byte{0x00}, ULEB(pages)),
		Tables:  [][]byte{{0x70, 0x00, 0x01}},
		// table 0 at 0: the import (function 0).
		Elems: Vec(Cat([]byte{0x00, 0x41, 0x00, 0x0b}, Vec([]byte{0x00}))),
		// loop: drop(call_indirect type 3 (0, n, 0)); br 0
		Handle: Cat([]byte{0x03, 0x40, 0x41, 0x00, 0x41}, SLEB(int64(n)), []byte{0x41, 0x00, 0x11, 0x03, 0x00, 0x1a, 0x0c, 0x00, 0x0b, 0x42, 0x00, 0x0b}),
	}.Build()
}

// ManyDenseFunctions is n functions of about size bytes of straight-line
// code each (see DenseCode): each under a per-function limit, together as
// costly to compile as one function of their total size.
func ManyDenseFunctions(n, size int) []byte {
	unit := []byte{0x41, 0x01, 0x41, 0x01, 0x6a, 0x1a}
	code := make([]byte, 0, size+1)
	for len(code)+len(unit) <= size {
		code = append(code, unit...)
	}
	code = append(code, 0x0b)
	funcs := make([]Func, n)
	for i := range funcs {
		funcs[i] = Func{Type: 2, Code: code}
	}
	return Module{Funcs: funcs}.Build()
}

// LargeIovecFlood writes one iovec of n bytes (its memory, from address 16)
// to stderr with WASI's fd_write, forever.
func LargeIovecFlood(n int) []byte {
	pages := uint32((n + 16 + 0xffff) >> 16)
	// The iovec at 0: {16, n}.
	iov := Cat([]byte{16, 0, 0, 0}, []byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)})
	return Module{
		Types:   [][]byte{FuncType([]byte{I32, I32, I32, I32}, []byte{I32})},
		Imports: [][]byte{TypedImport("wasi_snapshot_preview1", "fd_write", 3)},
		Memory:  Cat([]byte{0x00}, ULEB(pages)),
		Data:    Vec(Cat([]byte{0x00, 0x41, 0x00, 0x0b}, ULEB(uint32(len(iov))), iov)),
		// loop: drop(fd_write(2, 0, 1, 8)); br 0
		Handle: []byte{0x03, 0x40, 0x41, 0x02, 0x41, 0x00, 0x41, 0x01, 0x41, 0x08, 0x10, 0x00, 0x1a, 0x0c, 0x00, 0x0b, 0x42, 0x00, 0x0b},
	}.Build()
}
