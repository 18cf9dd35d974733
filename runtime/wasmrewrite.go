package runtime

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
)

// This file rewrites a module that passed the pre-parse (wasmparse.go) into
// what wazero compiles. The stored module is never changed.
//
//   - Instrumentation, so that no code shape outlives its deadline or holds
//     off the Go garbage collector. wazero's compiled code checks for a
//     closed module only at loop headers, and compiled WebAssembly is not
//     preemptible by the Go scheduler: a loop-free call tree ran 13 s past a
//     1 s deadline, and a garbage collection's stop-the-world waited for it,
//     freezing the whole process. So every function gets a fuel counter (a
//     mutable global the module cannot name): each function entry and each
//     loop header subtracts the number of instructions of its region (the
//     instructions directly in the function or loop body, not in a nested
//     loop: each runs at most once per entry of its region, so the charges
//     bound the instructions executed), and bulk memory and table
//     instructions subtract their length / 64. When the counter goes below
//     zero it is refilled and the code calls a host function, sandbot's
//     yield: there the goroutine is back in Go, where the garbage collector
//     and the scheduler can stop it, and the execution's deadline is checked
//     (a yield after the deadline stops the execution). Between two yields
//     runs at most yieldFuel instructions' worth of code.
//   - Call depth: every function that calls adds its estimated native frame
//     (frameSlots) to a second counter on entry and takes it off on exit;
//     past the stack limit the yield function stops the execution with a
//     clear message, long before wazero's own stack ceiling (about 50-100
//     MB per execution, outside the memory limit). `return` becomes a branch
//     to a block wrapping the body, so that every exit passes the
//     decrement.
//   - Host calls check the deadline: every WASI function the module
//     imports is reached through a wrapper appended to the module, which
//     yields (hostYield) and then calls the import; every reference to the
//     import (calls, ref.func, element segments, exports, the start
//     function) names the wrapper instead, so a table cannot reach the
//     import around it either. A loop of host calls that each do much work
//     for few guest instructions (random_get of 60 MiB, fd_write of a
//     million iovecs) therefore meets the deadline, and the CPU's turns,
//     at every call, not every yieldFuel instructions. (sandbot's own
//     functions check the context themselves.)
//   - memory.fill and memory.copy, which wazero runs as one uninterruptible
//     step (a 64 MiB fill held a core for 40 ms), become calls of functions
//     appended to the module that do the same a mebibyte at a time and
//     yield in between. Only a trap's partial writes differ, and a trapped
//     instance is never used again.
//   - Tables without a maximum get max = min (docs/decisions.md 14).
//   - Active data segments that are disjoint are merged (see mergeData).
//   - Custom sections (names, debug information) are dropped: nothing reads
//     them and wazero would parse them.
//
// The rewrite appends a type, an import, two globals, a local and the WASI
// wrappers (after the module's own functions), and shifts the module's
// defined functions by one; the pre-parse has checked that no index in the
// module's own code reaches past what the module defines, so none comes to
// name what the rewrite adds.

const (
	// yieldModule and yieldName are the host function the instrumented
	// code calls; a bot cannot import it (checkImportNames).
	yieldModule = "sandbot_internal"
	yieldName   = "yield"
	// yieldFuel is the fuel between two yields: about 2^20 WebAssembly
	// instructions, a few hundred microseconds of ordinary code.
	yieldFuel = 1 << 20
	// bulkFuelShift: a bulk instruction of n bytes costs n>>bulkFuelShift.
	bulkFuelShift = 6

	yieldPeriodic      = 0 // the fuel ran out
	yieldStackExceeded = 1 // the call depth passed the stack limit
	yieldHostCall      = 2 // a WASI function is about to be called

	// wasiModule is the import module whose functions get wrappers.
	wasiModule = "wasi_snapshot_preview1"
)

// instrumentation is what the emitter needs to know about the rewritten
// module.
type instrumentation struct {
	importedFuncs uint32 // the module's own imported functions
	yieldFunc     uint32 // index of the yield import
	fuelGlobal    uint32
	depthGlobal   uint32
	stackSlots    uint32 // the call depth limit, in 8-byte slots
	// wrapTypes maps a function type to the block type (as the s33 it is
	// encoded as) of the block that wraps its body: empty, a value type, or
	// for several results a type index appended to the type section.
	wrapTypes map[uint32]int64
	// shift maps a function index of the module to the rewritten module's.
	shift func(uint32) uint32
	// fillFunc and copyFunc are the chunked memory.fill and memory.copy
	// (valid when chunked).
	chunked            bool
	fillFunc, copyFunc uint32
}

// emitter writes one function's instrumented instructions as the scanner
// decodes them a second time.
type emitter struct {
	ins     *instrumentation
	fb      *funcBody
	code    []byte
	out     []byte
	copied  int    // bytes of code already copied or replaced
	wrap    bool   // the body is wrapped in a block for the depth decrement
	scratch uint32 // the appended i32 local of bulk instructions
}

func (e *emitter) begin(fb *funcBody, code []byte) {
	e.fb, e.code, e.copied = fb, code, 0
	e.wrap = fb.calls
	e.charge(fb.weight)
	if e.wrap {
		e.depthEnter()
		e.out = append(e.out, 0x02) // block
		e.out = append(e.out, e.blockType()...)
	}
}

func (e *emitter) blockType() []byte {
	return appendS64(nil, e.ins.wrapTypes[e.fb.typeIdx]) // set by rewrite for every wrapped function's type
}

// copyTo copies the original code up to off.
func (e *emitter) copyTo(off int) {
	e.out = append(e.out, e.code[e.copied:off]...)
	e.copied = off
}

// charge subtracts w from the fuel and yields when it runs out.
func (e *emitter) charge(w uint32) {
	w = min(w, yieldFuel)
	e.addToGlobal(e.ins.fuelGlobal, 0x6b, int32(w)) // i32.sub
	e.refuelIfEmpty()
}

// addToGlobal emits global[g] = global[g] op v, op being i32.add (0x6a) or
// i32.sub (0x6b): global.get g, i32.const v, op, global.set g.
func (e *emitter) addToGlobal(g uint32, op byte, v int32) {
	o := e.out
	o = append(o, 0x23)
	o = appendU32(o, g)
	o = append(o, 0x41)
	o = appendS32(o, v)
	o = append(o, op, 0x24)
	o = appendU32(o, g)
	e.out = o
}

// refuelIfEmpty: if fuel < 0 { fuel = yieldFuel; yield(periodic) }.
func (e *emitter) refuelIfEmpty() {
	g := e.ins.fuelGlobal
	o := e.out
	o = append(o, 0x23)
	o = appendU32(o, g)
	o = append(o, 0x41, 0x00, 0x48, 0x04, 0x40) // i32.const 0, i32.lt_s, if
	o = append(o, 0x41)
	o = appendS32(o, yieldFuel)
	o = append(o, 0x24)
	o = appendU32(o, g)
	o = append(o, 0x41, yieldPeriodic, 0x10)
	o = appendU32(o, e.ins.yieldFunc)
	o = append(o, 0x0b)
	e.out = o
}

func (e *emitter) depthEnter() {
	g := e.ins.depthGlobal
	e.addToGlobal(g, 0x6a, int32(e.fb.frameSlots)) // i32.add
	o := e.out
	o = append(o, 0x23)
	o = appendU32(o, g)
	o = append(o, 0x41)
	o = appendS32(o, int32(e.ins.stackSlots))
	o = append(o, 0x4b, 0x04, 0x40) // i32.gt_u, if
	o = append(o, 0x41, yieldStackExceeded, 0x10)
	o = appendU32(o, e.ins.yieldFunc)
	o = append(o, 0x0b)
	e.out = o
}

func (e *emitter) depthExit() {
	e.addToGlobal(e.ins.depthGlobal, 0x6b, int32(e.fb.frameSlots)) // i32.sub
}

// loopHeader is called with the offset just past a loop's block type.
func (e *emitter) loopHeader(off int, region int) {
	e.copyTo(off)
	e.charge(e.fb.loopWeights[region-1])
}

// ret replaces a return at off, at nesting depth depth, by a branch to the
// wrapping block.
func (e *emitter) ret(off int, depth int) {
	if !e.wrap {
		return
	}
	e.copyTo(off)
	e.out = append(e.out, 0x0c)
	e.out = appendU32(e.out, uint32(depth))
	e.copied = off + 1
}

// funcIndex rewrites the function index encoded at [off, end).
func (e *emitter) funcIndex(off, end int, f uint32) {
	e.copyTo(off)
	e.out = appendU32(e.out, e.ins.shift(f))
	e.copied = end
}

// bulk charges the bulk instruction instr at [off, end) by its length,
// which is on top of the operand stack; memory.fill and memory.copy become
// calls of their chunked versions.
func (e *emitter) bulk(off, end int, instr []byte) {
	e.copyTo(off)
	g := e.ins.fuelGlobal
	o := e.out
	o = append(o, 0x22) // local.tee $scratch
	o = appendU32(o, e.scratch)
	o = append(o, 0x23)
	o = appendU32(o, g)
	o = append(o, 0x20) // local.get $scratch
	o = appendU32(o, e.scratch)
	o = append(o, 0x41, bulkFuelShift, 0x76, 0x6b, 0x24) // i32.const, i32.shr_u, i32.sub, global.set
	o = appendU32(o, g)
	e.out = o
	e.refuelIfEmpty()
	if !e.ins.chunked {
		return
	}
	switch string(instr) {
	case "\xfc\x0b\x00": // memory.fill of memory 0
		e.out = append(e.out, 0x10)
		e.out = appendU32(e.out, e.ins.fillFunc)
		e.copied = end
	case "\xfc\x0a\x00\x00": // memory.copy within memory 0
		e.out = append(e.out, 0x10)
		e.out = appendU32(e.out, e.ins.copyFunc)
		e.copied = end
	}
}

// bulkChunk is how many bytes a chunked memory.fill or memory.copy moves
// between two yields.
const bulkChunk = 1 << 20

// chunkedFill is the body of fill(d, v, n): memory.fill a chunk at a time.
func chunkedFill(yieldFunc uint32) []byte {
	c := appendS32(nil, bulkChunk)
	b := []byte{0x00, 0x03, 0x40, 0x20, 2, 0x41} // no locals; loop; n > C?
	b = append(b, c...)
	b = append(b, 0x4b, 0x04, 0x40, 0x20, 0, 0x20, 1, 0x41) // if; fill(d, v, C)
	b = append(b, c...)
	b = append(b, 0xfc, 0x0b, 0x00, 0x20, 0, 0x41) // d += C
	b = append(b, c...)
	b = append(b, 0x6a, 0x21, 0, 0x20, 2, 0x41) // n -= C
	b = append(b, c...)
	b = append(b, 0x6b, 0x21, 2, 0x41, yieldPeriodic, 0x10)
	b = appendU32(b, yieldFunc)
	b = append(b, 0x0c, 1, 0x0b, 0x0b)                               // br loop; end if; end loop
	b = append(b, 0x20, 0, 0x20, 1, 0x20, 2, 0xfc, 0x0b, 0x00, 0x0b) // fill(d, v, n); end
	return b
}

// chunkedCopy is the body of copy(d, s, n): memory.copy a chunk at a time,
// from the start when d <= s and from the end otherwise, so that
// overlapping ranges copy as one memory.copy would.
func chunkedCopy(yieldFunc uint32) []byte {
	c := appendS32(nil, bulkChunk)
	b := []byte{0x00, 0x20, 0, 0x20, 1, 0x4d, 0x04, 0x40} // no locals; if d <= s
	// loop: while n > C { copy(d, s, C); d += C; s += C; n -= C; yield }
	b = append(b, 0x03, 0x40, 0x20, 2, 0x41)
	b = append(b, c...)
	b = append(b, 0x4b, 0x04, 0x40, 0x20, 0, 0x20, 1, 0x41)
	b = append(b, c...)
	b = append(b, 0xfc, 0x0a, 0x00, 0x00)
	for _, l := range []byte{0, 1} {
		b = append(b, 0x20, l, 0x41)
		b = append(b, c...)
		b = append(b, 0x6a, 0x21, l)
	}
	b = append(b, 0x20, 2, 0x41)
	b = append(b, c...)
	b = append(b, 0x6b, 0x21, 2, 0x41, yieldPeriodic, 0x10)
	b = appendU32(b, yieldFunc)
	b = append(b, 0x0c, 1, 0x0b, 0x0b)
	// else loop: while n > C { n -= C; copy(d+n, s+n, C); yield }
	b = append(b, 0x05, 0x03, 0x40, 0x20, 2, 0x41)
	b = append(b, c...)
	b = append(b, 0x4b, 0x04, 0x40, 0x20, 2, 0x41)
	b = append(b, c...)
	b = append(b, 0x6b, 0x21, 2, 0x20, 0, 0x20, 2, 0x6a, 0x20, 1, 0x20, 2, 0x6a, 0x41)
	b = append(b, c...)
	b = append(b, 0xfc, 0x0a, 0x00, 0x00, 0x41, yieldPeriodic, 0x10)
	b = appendU32(b, yieldFunc)
	b = append(b, 0x0c, 1, 0x0b, 0x0b, 0x0b)                               // br loop; end if; end loop; end if/else
	b = append(b, 0x20, 0, 0x20, 1, 0x20, 2, 0xfc, 0x0a, 0x00, 0x00, 0x0b) // copy(d, s, n); end
	return b
}

// finalEnd is called with the offset of the body's final end.
func (e *emitter) finalEnd(off int) {
	e.copyTo(off)
	if e.wrap {
		e.out = append(e.out, 0x0b)
		e.depthExit()
	}
	e.out = append(e.out, 0x0b)
	e.copied = len(e.code)
}

// isBulk reports whether the 0xfc instruction b takes a length operand.
func isBulk(b []byte) bool {
	r := &reader{b: b, off: 1}
	sub, err := r.u32()
	if err != nil {
		return false
	}
	switch sub {
	case 8, 10, 11, 12, 14, 17: // memory.init, memory.copy, memory.fill, table.init, table.copy, table.fill
		return true
	}
	return false
}

// prepareModule checks wasm against the budget and returns its imports, the
// module to compile, and what the pre-parse learned. stackSlots is the call
// depth limit in 8-byte slots. A budget violation is a *ModuleError; a
// malformed module is any other error.
func prepareModule(wasm []byte, b *moduleBudget, stackSlots uint32) ([]wasmImport, []byte, *moduleInfo, error) {
	m, err := parseModule(wasm, b)
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := m.rewrite(b, rewriteOptions{stackSlots: stackSlots})
	if err != nil {
		return nil, nil, nil, err
	}
	return m.imports, out, m, nil
}

// Exports the JavaScript engine's rewrite adds (rewriteOptions.engine).
const (
	fuelExport  = "sandbot_fuel"
	depthExport = "sandbot_depth"
)

// engineBudget is the pre-parse's budget for the JavaScript engine: none to
// speak of. The budget protects the server from modules a user uploads; the
// engine ships inside the binary (pinned by its checksum in
// jsengine/package-lock.json), and holding it to the operator's bot module
// limits (SANDBOT_MODULE_*) would only let a lowered limit disable every
// JavaScript bot.
var engineBudget = moduleBudget{
	functions: math.MaxUint32, functionBytes: math.MaxUint32, functionLocals: math.MaxUint32, locals: math.MaxUint32,
	brTableTargets: math.MaxUint32, blockDepth: math.MaxUint32, tableElements: math.MaxUint32, types: math.MaxUint32,
	typeArity: math.MaxUint32, globals: math.MaxUint32, dataSegments: math.MaxUint32, dataBytes: math.MaxUint32,
}

// prepareEngine instruments the JavaScript engine as every bot module is:
// fuel and the call depth, whose limit (stackSlots) is the bots' own, since
// a bot's JavaScript recursion is the engine's. Its data segments are left
// as they are (its instances run over images of its memory, js.go), and it
// exports its fuel and depth globals so that an instance kept for another
// execution starts from fresh counters.
func prepareEngine(wasm []byte, stackSlots uint32) ([]byte, error) {
	b := engineBudget
	m, err := parseModule(wasm, &b)
	if err != nil {
		return nil, err
	}
	return m.rewrite(&b, rewriteOptions{stackSlots: stackSlots, engine: true})
}

// rewriteOptions: the call depth limit in 8-byte slots, and whether the
// module is the JavaScript engine (see prepareEngine).
type rewriteOptions struct {
	stackSlots uint32
	engine     bool
}

func (m *moduleInfo) rewrite(b *moduleBudget, opts rewriteOptions) ([]byte, error) {
	ins := &instrumentation{
		importedFuncs: m.importedFuncs,
		yieldFunc:     m.importedFuncs,
		fuelGlobal:    m.globals,
		depthGlobal:   m.globals + 1,
		stackSlots:    opts.stackSlots,
		wrapTypes:     map[uint32]int64{},
		shift:         m.shiftFunc,
	}
	m.wrapHostCalls()
	// Types: the module's, then the yield function's, then the block types
	// of wrapped bodies with several results.
	types := slices.Clone(m.types)
	yieldType := uint32(len(types))
	types = append(types, funcType{params: []byte{0x7f}})
	if m.chunked = m.hasMemory && slices.ContainsFunc(m.bodies, func(fb funcBody) bool { return fb.bulk }); m.chunked {
		m.bulkType = uint32(len(types))
		types = append(types, funcType{params: []byte{0x7f, 0x7f, 0x7f}})
		base := m.importedFuncs + 1 + uint32(len(m.funcTypes)) + uint32(len(m.wrapped))
		ins.chunked, ins.fillFunc, ins.copyFunc = true, base, base+1
	}
	for i := range m.bodies {
		fb := &m.bodies[i]
		if !fb.calls {
			continue
		}
		if _, ok := ins.wrapTypes[fb.typeIdx]; ok {
			continue
		}
		res := m.types[fb.typeIdx].results
		switch len(res) {
		case 0:
			ins.wrapTypes[fb.typeIdx] = -64 // the byte 0x40
		case 1:
			ins.wrapTypes[fb.typeIdx] = int64(res[0]) - 0x80 // the value type's byte
		default:
			ins.wrapTypes[fb.typeIdx] = int64(len(types))
			types = append(types, funcType{results: res})
		}
	}
	out := make([]byte, 0, m.size+m.size/4+1024)
	out = append(out, "\x00asm\x01\x00\x00\x00"...)

	var typeSec []byte
	typeSec = appendU32(typeSec, uint32(len(types)))
	for _, t := range types {
		typeSec = append(typeSec, 0x60)
		typeSec = appendU32(typeSec, uint32(len(t.params)))
		typeSec = append(typeSec, t.params...)
		typeSec = appendU32(typeSec, uint32(len(t.results)))
		typeSec = append(typeSec, t.results...)
	}
	out = appendSection(out, secType, typeSec)

	var imports []byte
	imports = appendU32(imports, uint32(len(m.imports))+1)
	if body := m.section(secImport); body != nil {
		r := &reader{b: body}
		_, _ = r.u32()
		imports = append(imports, body[r.off:]...)
	}
	imports = appendName(imports, yieldModule)
	imports = appendName(imports, yieldName)
	imports = append(imports, 0x00)
	imports = appendU32(imports, yieldType)
	out = appendSection(out, secImport, imports)

	shift := m.shiftFunc
	for _, s := range m.sections {
		switch s.id {
		case secCustom, secType, secImport:
		case secTable:
			nb, err := capTables(s.body)
			if err != nil {
				return nil, fmt.Errorf("table section: %w", err)
			}
			out = appendSection(out, secTable, nb)
		case secGlobal:
			// Written after the memory section, with the two globals
			// appended (see below).
		case secExport:
			out = m.appendGlobals(out)
			var counters []uint32
			if opts.engine {
				counters = []uint32{ins.fuelGlobal, ins.depthGlobal}
			}
			body, err := rewriteExports(s.body, shift, counters)
			if err != nil {
				return nil, fmt.Errorf("export section: %w", err)
			}
			out = appendSection(out, secExport, body)
		case secStart:
			r := &reader{b: s.body}
			f, _ := r.u32()
			out = m.appendGlobals(out)
			out = appendSection(out, secStart, appendU32(nil, shift(f)))
		case secElement:
			out = m.appendGlobals(out)
			nb, err := rewriteElements(s.body, shift)
			if err != nil {
				return nil, fmt.Errorf("element section: %w", err)
			}
			out = appendSection(out, secElement, nb)
		case secFunction:
			out = appendSection(out, secFunction, m.functionSection())
		case secCode:
			out = m.appendGlobals(out)
			code, err := m.rewriteCode(b, ins)
			if err != nil {
				return nil, err
			}
			out = appendSection(out, secCode, code)
		case secData:
			out = m.appendGlobals(out)
			if opts.engine {
				out = appendSection(out, secData, s.body)
			} else if nb, ok := m.dataImage(); ok {
				out = appendSection(out, secData, nb)
			} else if nb, ok := mergeData(s.body); ok && !m.dataCount {
				out = appendSection(out, secData, nb)
			} else {
				out = appendSection(out, secData, s.body)
			}
		case secDataCount:
			out = m.appendGlobals(out)
			out = appendSection(out, s.id, s.body)
		default: // function, memory
			out = appendSection(out, s.id, s.body)
		}
	}
	out = m.appendGlobals(out)
	if opts.engine && m.section(secExport) == nil {
		return nil, errors.New("the JavaScript engine has no export section")
	}
	return out, nil
}

// appendGlobals writes the global section, the module's globals and the
// instrumentation's two, once, at its place in the section order (before
// the first section that follows it).
func (m *moduleInfo) appendGlobals(out []byte) []byte {
	if m.globalsWritten {
		return out
	}
	m.globalsWritten = true
	var body []byte
	body = appendU32(body, m.globals+2)
	if g := m.section(secGlobal); g != nil {
		r := &reader{b: g}
		_, _ = r.u32()
		body = append(body, rewriteConstExprs(g[r.off:], m.globals, m.shiftFunc)...)
	}
	body = append(body, 0x7f, 0x01, 0x41) // i32, mutable: the fuel
	body = appendS32(body, yieldFuel)
	body = append(body, 0x0b)
	body = append(body, 0x7f, 0x01, 0x41, 0x00, 0x0b) // i32, mutable: the call depth
	return appendSection(out, secGlobal, body)
}

func (m *moduleInfo) shiftFunc(f uint32) uint32 {
	if f >= m.importedFuncs {
		return f + 1
	}
	if w, ok := m.wrapperOf[f]; ok {
		return w
	}
	return f
}

// wrapHostCalls chooses the imports that get a wrapper (the WASI
// functions) and the wrappers' indices, after the module's own functions
// and the yield import. A module that defines no function has no code
// that could call an import in a loop, and gets none.
func (m *moduleInfo) wrapHostCalls() {
	m.wrapped, m.wrapperOf = nil, map[uint32]uint32{}
	if len(m.funcTypes) == 0 {
		return
	}
	base := m.importedFuncs + 1 + uint32(len(m.funcTypes))
	for i := uint32(0); i < m.importedFuncs && int(i) < len(m.imports); i++ {
		if imp := m.imports[i]; imp.kind == 0 && imp.module == wasiModule {
			m.wrapperOf[i] = base + uint32(len(m.wrapped))
			m.wrapped = append(m.wrapped, i)
		}
	}
}

// functionSection is the function section with the wrappers' types
// appended.
func (m *moduleInfo) functionSection() []byte {
	body := appendU32(nil, uint32(len(m.funcTypes)+len(m.wrapped)+m.appended()))
	for _, t := range m.funcTypes {
		body = appendU32(body, t)
	}
	for _, i := range m.wrapped {
		body = appendU32(body, m.importTypes[i])
	}
	if m.chunked {
		body = appendU32(body, m.bulkType)
		body = appendU32(body, m.bulkType)
	}
	return body
}

// appended is how many functions the rewrite appends besides the wrappers:
// the chunked fill and copy.
func (m *moduleInfo) appended() int {
	if m.chunked {
		return 2
	}
	return 0
}

// appendWrappers appends the wrappers' bodies to a code section's: yield
// (the deadline, the CPU's turn), then call the import with the wrapper's
// own parameters.
func (m *moduleInfo) appendWrappers(out []byte, yieldFunc uint32) []byte {
	for _, i := range m.wrapped {
		body := []byte{0x00}                           // no locals
		body = append(body, 0x41, yieldHostCall, 0x10) // i32.const, call
		body = appendU32(body, yieldFunc)
		for p := range m.types[m.importTypes[i]].params {
			body = append(body, 0x20) // local.get
			body = appendU32(body, uint32(p))
		}
		body = append(body, 0x10) // call the import itself
		body = appendU32(body, i)
		body = append(body, 0x0b)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	if m.chunked {
		for _, body := range [][]byte{chunkedFill(yieldFunc), chunkedCopy(yieldFunc)} {
			out = appendU32(out, uint32(len(body)))
			out = append(out, body...)
		}
	}
	return out
}

func (m *moduleInfo) section(id byte) []byte {
	for _, s := range m.sections {
		if s.id == id {
			return s.body
		}
	}
	return nil
}

func appendName(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}

// rewriteConstExprs copies n globals (type, mutability, initializer) with
// the function indices of ref.func shifted.
func rewriteConstExprs(body []byte, n uint32, shift func(uint32) uint32) []byte {
	r := &reader{b: body}
	var out []byte
	for i := uint32(0); i < n; i++ {
		out = append(out, body[r.off:r.off+2]...)
		r.off += 2
		out = copyConstExpr(r, out, shift)
	}
	return out
}

// copyConstExpr copies a constant expression the pre-parse accepted,
// shifting ref.func indices.
func copyConstExpr(r *reader, out []byte, shift func(uint32) uint32) []byte {
	for {
		start := r.off
		op, _ := r.byte()
		switch op {
		case 0x0b:
			return append(out, op)
		case 0xd2:
			f, _ := r.u32()
			out = append(out, op)
			out = appendU32(out, shift(f))
			continue
		case 0x41:
			_, _ = r.sleb(32)
		case 0x42:
			_, _ = r.sleb(64)
		case 0x43:
			_ = r.skip(4)
		case 0x44:
			_ = r.skip(8)
		case 0xd0:
			_ = r.skip(1)
		case 0x23:
			_, _ = r.u32()
		case 0xfd:
			_ = r.skip(17)
		}
		out = append(out, r.b[start:r.off]...)
	}
}

// rewriteExports shifts the function indices of the exports, and exports
// the globals counters, if any, as fuelExport and depthExport.
func rewriteExports(body []byte, shift func(uint32) uint32, counters []uint32) ([]byte, error) {
	r := &reader{b: body}
	n, _ := r.u32()
	out := appendU32(nil, n+uint32(len(counters)))
	names := []string{fuelExport, depthExport}
	for i := uint32(0); i < n; i++ {
		start := r.off
		name, _ := r.name()
		if len(counters) > 0 && slices.Contains(names, name) {
			return nil, fmt.Errorf("the module already exports %q", name)
		}
		kind, _ := r.byte()
		out = append(out, body[start:r.off]...)
		idx, _ := r.u32()
		if kind == 0 {
			idx = shift(idx)
		}
		out = appendU32(out, idx)
	}
	for i, g := range counters {
		out = appendName(out, names[i])
		out = append(out, 0x03) // a global
		out = appendU32(out, g)
	}
	return out, nil
}

func rewriteElements(body []byte, shift func(uint32) uint32) ([]byte, error) {
	r := &reader{b: body}
	n, _ := r.u32()
	out := appendU32(nil, n)
	for i := uint32(0); i < n; i++ {
		flag, _ := r.u32()
		out = appendU32(out, flag)
		if flag&3 == 2 {
			t, _ := r.u32()
			out = appendU32(out, t)
		}
		if flag&1 == 0 {
			out = copyConstExpr(r, out, shift)
		}
		exprs := flag&4 != 0
		if flag&3 != 0 {
			t, _ := r.byte()
			out = append(out, t)
		}
		c, _ := r.u32()
		out = appendU32(out, c)
		for k := uint32(0); k < c; k++ {
			if exprs {
				out = copyConstExpr(r, out, shift)
				continue
			}
			f, _ := r.u32()
			out = appendU32(out, shift(f))
		}
	}
	if !r.done() {
		return nil, fmt.Errorf("trailing bytes")
	}
	return out, nil
}

// rewriteCode instruments every function body.
func (m *moduleInfo) rewriteCode(b *moduleBudget, ins *instrumentation) ([]byte, error) {
	out := appendU32(nil, uint32(len(m.bodies)+len(m.wrapped)+m.appended()))
	sc := &scanner{m: m, b: b}
	em := &emitter{ins: ins}
	var total uint64
	for i := range m.bodies {
		fb := &m.bodies[i]
		em.out = em.out[:0]
		// Locals: the module's, and a scratch i32 for bulk lengths.
		ft := &m.types[fb.typeIdx]
		r := &reader{b: fb.locals}
		groups, _ := r.u32()
		if fb.bulk {
			em.out = appendU32(em.out, groups+1)
			em.out = append(em.out, fb.locals[r.off:]...)
			em.out = append(em.out, 0x01, 0x7f)
			em.scratch = uint32(len(ft.params)) + fb.numLocals
		} else {
			em.out = append(em.out, fb.locals...)
		}
		if err := sc.scan(fb, fb.raw, uint64(i)+uint64(m.importedFuncs), &total, em); err != nil {
			return nil, err
		}
		out = appendU32(out, uint32(len(em.out)))
		out = append(out, em.out...)
	}
	return m.appendWrappers(out, ins.yieldFunc), nil
}

func capTables(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	out := appendU32(make([]byte, 0, len(body)+int(n)*5), n)
	for i := uint32(0); i < n; i++ {
		ref, err := r.byte()
		if err != nil {
			return nil, err
		}
		min, max, hasMax, err := readLimits(r)
		if err != nil {
			return nil, err
		}
		if !hasMax {
			max = min
		}
		out = append(out, ref, 1)
		out = appendU32(out, min)
		out = appendU32(out, max)
	}
	if r.off != len(body) {
		return nil, fmt.Errorf("trailing bytes")
	}
	return out, nil
}

// dataImageMin is the active data from which a module's initial memory is
// kept as an image mapped copy-on-write into each instance's memory,
// rather than copied in by every instantiation.
var dataImageMin uint64 = 1 << 20 // a variable for BenchmarkDataSegment

// dataImage builds m.image, the bytes the active data segments put at the
// start of the initial memory, when they hold at least dataImageMin bytes,
// all at constant offsets, all within the initial memory; it returns the data
// section with every active segment emptied (an empty active segment is
// dropped at instantiation like a full one, so memory.init and data.drop
// on it, and the indices of passive ones, are unchanged), and false when
// the data is left to wazero.
func (m *moduleInfo) dataImage() ([]byte, bool) {
	if !m.constData || !m.hasMemory {
		return nil, false
	}
	var active, end uint64
	for _, d := range m.data {
		if d.active {
			active += uint64(len(d.data))
			end = max(end, uint64(d.offset)+uint64(len(d.data)))
		}
	}
	if active < dataImageMin || end > uint64(m.memMin)<<16 {
		return nil, false
	}
	const page = 64 << 10
	img := make([]byte, (end+page-1)/page*page)
	out := appendU32(nil, uint32(len(m.data)))
	for _, d := range m.data {
		if !d.active {
			out = append(out, d.raw...)
			continue
		}
		copy(img[d.offset:], d.data) // in order: a later segment wins, as at instantiation
		out = append(out, 0x00, 0x41)
		out = appendS32(out, int32(d.offset))
		out = append(out, 0x0b, 0x00)
	}
	m.image = img
	return out, true
}

// maxDataGap is the longest run of zero bytes mergeData fills to join two
// data segments.
const maxDataGap = 256

type dataSegment struct {
	offset uint64
	data   []byte
}

// mergeData rewrites a data section whose segments are all active, for
// memory 0, at constant offsets, and pairwise disjoint. Go's linker emits
// tens of thousands of small data segments (it skips runs of zeros), and
// wazero evaluates and copies each one at every instantiation. Disjoint
// writes commute, so the segments may be sorted by offset; then each is
// joined to the previous one when the gap between them is at most
// maxDataGap bytes, filled with zeros (no segment writes there, and memory
// starts zeroed). It reports false when the section is left alone.
func mergeData(body []byte) ([]byte, bool) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil || n < 2 {
		return nil, false
	}
	segs := make([]dataSegment, 0, n)
	for i := uint32(0); i < n; i++ {
		flag, err := r.u32()
		if err != nil || flag != 0 {
			return nil, false
		}
		if op, err := r.byte(); err != nil || op != 0x41 { // i32.const
			return nil, false
		}
		off, err := r.s32()
		if err != nil {
			return nil, false
		}
		if end, err := r.byte(); err != nil || end != 0x0b {
			return nil, false
		}
		size, err := r.u32()
		if err != nil {
			return nil, false
		}
		data, err := r.bytes(size)
		if err != nil {
			return nil, false
		}
		segs = append(segs, dataSegment{offset: uint64(uint32(off)), data: data})
	}
	if r.off != len(body) {
		return nil, false
	}
	slices.SortStableFunc(segs, func(a, b dataSegment) int { return cmp.Compare(a.offset, b.offset) })
	for i := 1; i < len(segs); i++ {
		if segs[i-1].offset+uint64(len(segs[i-1].data)) > segs[i].offset {
			return nil, false // overlapping segments: order matters
		}
	}
	var merged []dataSegment
	for _, seg := range segs {
		if k := len(merged) - 1; k >= 0 {
			cur := &merged[k]
			curEnd := cur.offset + uint64(len(cur.data))
			if seg.offset-curEnd <= maxDataGap {
				cur.data = append(cur.data, make([]byte, seg.offset-curEnd)...)
				cur.data = append(cur.data, seg.data...)
				continue
			}
		}
		merged = append(merged, dataSegment{offset: seg.offset, data: append([]byte(nil), seg.data...)})
	}
	if len(merged) == int(n) {
		return nil, false
	}
	out := appendU32(make([]byte, 0, len(body)), uint32(len(merged)))
	for _, seg := range merged {
		out = append(out, 0x00, 0x41)
		out = appendS32(out, int32(uint32(seg.offset)))
		out = append(out, 0x0b)
		out = appendU32(out, uint32(len(seg.data)))
		out = append(out, seg.data...)
	}
	return out, true
}
