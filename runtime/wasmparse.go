package runtime

import (
	"errors"
	"fmt"
	"math"
)

// This file is the deploy-time pre-parse: before wazero decodes, validates or
// compiles a module, the whole binary is read once, every section and every
// instruction of every function body, and held against a budget
// (moduleBudget). What wazero spends on a module, decoding it and compiling
// it once, and instantiating it at every execution, grows with what is
// counted here: locals (wazero allocates them at decode and the compiler
// tracks each one through every block), br_table targets, block nesting,
// functions, body sizes, types, globals, table elements and data bytes. A
// module within the budget costs time and memory roughly linear in its size;
// one beyond it is refused with a *ModuleError naming the limit.
//
// The pre-parse itself is bounded by construction: it makes one pass, its
// allocations are proportional to counts that the module's own bytes must
// back (reader.count), and its control stack is bounded by the nesting
// limit.
//
// It decodes the features sandbot's wazero runtime enables (WebAssembly 2.0:
// bulk memory, reference types, multi-value, mutable globals, non-trapping
// conversions, sign extension, SIMD) and refuses any other opcode, so that
// the instrumentation (wasmrewrite.go) never misreads an instruction.

// moduleBudget is the part of the limits a module's structure is checked
// against.
type moduleBudget struct {
	functions      uint64 // imported and defined
	functionBytes  uint64 // one function body
	codeBytes      uint64 // all function bodies: compile time grows with them
	functionLocals uint64 // locals of one function, parameters excluded
	locals         uint64 // locals of all functions
	brTableTargets uint64 // targets of one br_table
	blockDepth     uint64 // nesting of block, loop and if
	tableElements  uint64 // sum of every table's initial and maximum sizes; also element segment entries
	types          uint64
	typeArity      uint64 // parameters, or results, of one type
	globals        uint64
	dataSegments   uint64
	dataBytes      uint64 // bytes of all data segments (the memory limit)
}

// Per-item costs used to estimate what an instance of a module allocates
// outside its linear memory (moduleInfo.instanceBytes): wazero allocates a
// global instance per global, a reference per table element and per entry of
// a passive element segment, and a slice header per data segment.
const (
	globalInstanceBytes = 48
	referenceBytes      = 8
	dataInstanceBytes   = 24
)

type funcType struct {
	params, results []byte // value types
}

type tableType struct {
	ref      byte
	min, max uint32
	hasMax   bool
}

// funcBody is one defined function as the pre-parse found it.
type funcBody struct {
	typeIdx   uint32
	raw       []byte // the body: locals declarations, then code
	locals    []byte // the encoded locals declarations
	numLocals uint32 // declared locals, parameters excluded
	code      []byte // the instructions, final end included
	// weight is the number of instructions directly in the function body
	// (not inside a loop); loopWeights are the same for each loop, in the
	// order the loops begin. Each is charged when its region is entered
	// (see wasmrewrite.go).
	weight      uint32
	loopWeights []uint32
	calls       bool   // has call or call_indirect
	bulk        bool   // has a bulk memory or table instruction
	maxHeight   uint32 // an upper bound of the operand stack height
	frameSlots  uint32 // estimated native frame size, in 8-byte slots
	instrCount  uint32
	bodyOffset  int // in the module, for error messages
}

// moduleInfo is what the pre-parse learned about a module.
type moduleInfo struct {
	sections      []section
	types         []funcType
	imports       []wasmImport
	importedFuncs uint32
	importTypes   []uint32 // type index per imported function
	funcTypes     []uint32 // type index per defined function
	tables        []tableType
	hasMemory     bool
	memMin        uint32 // pages
	memMax        uint32
	memHasMax     bool
	globals       uint32 // defined (imports of globals are refused)
	bodies        []funcBody
	dataCount     bool
	dataCountN    uint32 // the data count section's value
	data          []dataSeg
	constData     bool   // every active data segment has a constant offset
	image         []byte // the initial memory the active data segments make (wasmrewrite.go), or nil
	elemSegments  uint32
	dataBytes     uint64
	dataSegments  uint32
	elemEntries   uint64
	hasStart      bool
	size          int // of the module
	// globalsWritten: the rewrite has written the global section.
	globalsWritten bool
	// wrapped are the imported functions the rewrite reaches through a
	// wrapper, and wrapperOf their wrappers' indices (wasmrewrite.go).
	wrapped   []uint32
	wrapperOf map[uint32]uint32
	// chunked says the rewrite appended the chunked memory.fill and
	// memory.copy (wasmrewrite.go), of type bulkType.
	chunked  bool
	bulkType uint32
	// instanceBytes estimates what one instance allocates outside its
	// linear memory: tables, globals, element and data instances.
	instanceBytes uint64
}

type section struct {
	id   byte
	body []byte
}

func (m *moduleInfo) numFuncs() uint64 { return uint64(m.importedFuncs) + uint64(len(m.funcTypes)) }

// limitError is a budget violation: a *ModuleError whose message names the
// limit.
func limitError(format string, args ...any) error {
	return &ModuleError{Reason: fmt.Sprintf(format, args...)}
}

// parseModule reads the whole module and checks it against b. A malformed
// module is a plain error (the caller wraps it as an invalid module); a
// budget violation is a *ModuleError.
func parseModule(wasm []byte, b *moduleBudget) (*moduleInfo, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, errors.New("not a WebAssembly module (bad magic number)")
	}
	if string(wasm[4:8]) != "\x01\x00\x00\x00" {
		return nil, errors.New("unsupported WebAssembly binary version")
	}
	m := &moduleInfo{size: len(wasm)}
	r := &reader{b: wasm, off: 8}
	var last byte // order of the non-custom sections
	order := map[byte]int{secType: 1, secImport: 2, secFunction: 3, secTable: 4, secMemory: 5, secGlobal: 6,
		secExport: 7, secStart: 8, secElement: 9, secDataCount: 10, secCode: 11, secData: 12}
	for !r.done() {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		size, err := r.u32()
		if err != nil {
			return nil, err
		}
		start := r.off
		body, err := r.bytes(size)
		if err != nil {
			return nil, fmt.Errorf("section %d: %w", id, err)
		}
		if id != secCustom {
			o, ok := order[id]
			if !ok {
				return nil, fmt.Errorf("unknown section id %d", id)
			}
			if byte(o) <= last {
				return nil, fmt.Errorf("section %d out of order or repeated", id)
			}
			last = byte(o)
		}
		sr := &reader{b: body}
		switch id {
		case secCustom:
			_, err = sr.name()
		case secType:
			err = m.parseTypes(sr, b)
		case secImport:
			err = m.parseImports(sr, b)
		case secFunction:
			err = m.parseFunctions(sr, b)
		case secTable:
			err = m.parseTables(sr)
		case secMemory:
			err = m.parseMemory(sr)
		case secGlobal:
			err = m.parseGlobals(sr, b)
		case secExport:
			err = m.parseExports(sr)
		case secStart:
			var idx uint32
			if idx, err = sr.u32(); err == nil && uint64(idx) >= m.numFuncs() {
				err = fmt.Errorf("start function %d out of range", idx)
			}
			m.hasStart = true
		case secElement:
			err = m.parseElements(sr, b)
		case secDataCount:
			m.dataCountN, err = sr.u32()
			m.dataCount = true
		case secCode:
			err = m.parseCode(sr, b, start)
		case secData:
			err = m.parseData(sr, b)
		}
		if err != nil {
			var me *ModuleError
			if errors.As(err, &me) {
				return nil, err
			}
			return nil, fmt.Errorf("%s section: %w", sectionName(id), err)
		}
		if id != secCustom && !sr.done() {
			return nil, fmt.Errorf("%s section: trailing bytes", sectionName(id))
		}
		m.sections = append(m.sections, section{id: id, body: body})
	}
	if len(m.bodies) != len(m.funcTypes) {
		return nil, fmt.Errorf("function section declares %d functions, code section has %d", len(m.funcTypes), len(m.bodies))
	}
	if m.numFuncs() > b.functions {
		return nil, limitError("module has %d functions, over the limit of %d", m.numFuncs(), b.functions)
	}
	var tableElems uint64
	for _, t := range m.tables {
		tableElems += uint64(t.min)
		if t.hasMax {
			tableElems += uint64(t.max)
		}
	}
	if tableElems > b.tableElements {
		return nil, limitError("tables declare %d elements (initial and maximum sizes together), over the limit of %d", tableElems, b.tableElements)
	}
	if m.elemEntries > b.tableElements {
		return nil, limitError("element segments have %d entries, over the limit of %d", m.elemEntries, b.tableElements)
	}
	if m.dataBytes > b.dataBytes {
		return nil, limitError("data segments hold %d bytes, over the memory limit of %d bytes", m.dataBytes, b.dataBytes)
	}
	// Tables without a maximum get max = min (wasmrewrite.go): each holds
	// at most its maximum, and a table of an instance is allocated at its
	// initial size.
	var tableBytes uint64
	for _, t := range m.tables {
		n := uint64(t.min)
		if t.hasMax {
			n = uint64(t.max)
		}
		tableBytes += n * referenceBytes
	}
	m.instanceBytes = tableBytes + m.elemEntries*referenceBytes +
		uint64(m.globals)*globalInstanceBytes + uint64(m.dataSegments)*dataInstanceBytes
	return m, nil
}

func sectionName(id byte) string {
	names := [...]string{"custom", "type", "import", "function", "table", "memory", "global", "export", "start",
		"element", "code", "data", "data count"}
	if int(id) < len(names) {
		return names[id]
	}
	return fmt.Sprintf("%d", id)
}

func isValType(t byte) bool {
	switch t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		return true
	}
	return false
}

func isRefType(t byte) bool { return t == 0x70 || t == 0x6f }

func (m *moduleInfo) parseTypes(r *reader, b *moduleBudget) error {
	n, err := r.count(3)
	if err != nil {
		return err
	}
	if uint64(n) > b.types {
		return limitError("module has %d types, over the limit of %d", n, b.types)
	}
	m.types = make([]funcType, 0, n)
	for i := uint32(0); i < n; i++ {
		form, err := r.byte()
		if err != nil {
			return err
		}
		if form != 0x60 {
			return fmt.Errorf("type %d: unsupported form 0x%x", i, form)
		}
		var ft funcType
		for k := 0; k < 2; k++ {
			c, err := r.count(1)
			if err != nil {
				return err
			}
			if uint64(c) > b.typeArity {
				return limitError("type %d has %d %s, over the limit of %d", i, c, [2]string{"parameters", "results"}[k], b.typeArity)
			}
			vt, _ := r.bytes(c)
			for _, t := range vt {
				if !isValType(t) {
					return fmt.Errorf("type %d: invalid value type 0x%x", i, t)
				}
			}
			if k == 0 {
				ft.params = vt
			} else {
				ft.results = vt
			}
		}
		m.types = append(m.types, ft)
	}
	return nil
}

func (m *moduleInfo) parseImports(r *reader, b *moduleBudget) error {
	n, err := r.count(4)
	if err != nil {
		return err
	}
	if uint64(n) > b.functions {
		return limitError("module has %d imports, over the limit of %d functions", n, b.functions)
	}
	for i := uint32(0); i < n; i++ {
		var imp wasmImport
		if imp.module, err = r.name(); err != nil {
			return err
		}
		if imp.name, err = r.name(); err != nil {
			return err
		}
		if imp.kind, err = r.byte(); err != nil {
			return err
		}
		switch imp.kind {
		case 0:
			idx, err := r.u32()
			if err != nil {
				return err
			}
			if uint64(idx) >= uint64(len(m.types)) {
				return fmt.Errorf("import %d: type %d out of range", i, idx)
			}
			m.importedFuncs++
			m.importTypes = append(m.importTypes, idx)
		default:
			// Only function imports are allowed (checkImportNames says
			// so by name); nothing after this entry is needed.
			m.imports = append(m.imports, imp)
			r.off = len(r.b)
			return nil
		}
		m.imports = append(m.imports, imp)
	}
	return nil
}

func (m *moduleInfo) parseFunctions(r *reader, b *moduleBudget) error {
	n, err := r.count(1)
	if err != nil {
		return err
	}
	if uint64(n)+uint64(m.importedFuncs) > b.functions {
		return limitError("module has %d functions, over the limit of %d", uint64(n)+uint64(m.importedFuncs), b.functions)
	}
	m.funcTypes = make([]uint32, n)
	for i := range m.funcTypes {
		idx, err := r.u32()
		if err != nil {
			return err
		}
		if uint64(idx) >= uint64(len(m.types)) {
			return fmt.Errorf("function %d: type %d out of range", i, idx)
		}
		m.funcTypes[i] = idx
	}
	return nil
}

// limits reads a table's or memory's limits: flag 0 (min) or 1 (min, max).
// Shared (threads) and 64-bit limits are not enabled.
func readLimits(r *reader) (min, max uint32, hasMax bool, err error) {
	flag, err := r.byte()
	if err != nil {
		return 0, 0, false, err
	}
	if flag > 1 {
		return 0, 0, false, fmt.Errorf("unsupported limits flag 0x%x", flag)
	}
	if min, err = r.u32(); err != nil {
		return 0, 0, false, err
	}
	if flag == 1 {
		if max, err = r.u32(); err != nil {
			return 0, 0, false, err
		}
		if max < min {
			return 0, 0, false, errors.New("maximum below minimum")
		}
		hasMax = true
	}
	return min, max, hasMax, nil
}

func (m *moduleInfo) parseTables(r *reader) error {
	n, err := r.count(3)
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		var t tableType
		if t.ref, err = r.byte(); err != nil {
			return err
		}
		if !isRefType(t.ref) {
			return fmt.Errorf("table %d: unsupported type 0x%x", i, t.ref)
		}
		if t.min, t.max, t.hasMax, err = readLimits(r); err != nil {
			return fmt.Errorf("table %d: %w", i, err)
		}
		m.tables = append(m.tables, t)
	}
	return nil
}

func (m *moduleInfo) parseMemory(r *reader) error {
	n, err := r.count(2)
	if err != nil {
		return err
	}
	if n > 1 {
		return errors.New("more than one memory")
	}
	if n == 1 {
		m.hasMemory = true
		if m.memMin, m.memMax, m.memHasMax, err = readLimits(r); err != nil {
			return err
		}
		if m.memMin > wasm32MaxPages || (m.memHasMax && m.memMax > wasm32MaxPages) {
			return errors.New("memory over 4 GiB")
		}
	}
	return nil
}

func (m *moduleInfo) parseGlobals(r *reader, b *moduleBudget) error {
	n, err := r.count(4)
	if err != nil {
		return err
	}
	if uint64(n) > b.globals {
		return limitError("module has %d globals, over the limit of %d", n, b.globals)
	}
	for i := uint32(0); i < n; i++ {
		t, err := r.byte()
		if err != nil {
			return err
		}
		if !isValType(t) {
			return fmt.Errorf("global %d: invalid type 0x%x", i, t)
		}
		mut, err := r.byte()
		if err != nil {
			return err
		}
		if mut > 1 {
			return fmt.Errorf("global %d: invalid mutability", i)
		}
		// A global's initializer may read only imported globals, and
		// there are none; a defined global's index is checked against
		// those defined before it.
		if err := m.constExpr(r, i); err != nil {
			return fmt.Errorf("global %d: %w", i, err)
		}
		m.globals++
	}
	return nil
}

// constExpr reads a constant expression up to its end. globals is how many
// globals it may read.
func (m *moduleInfo) constExpr(r *reader, globals uint32) error {
	for n := 0; ; n++ {
		if n > 64 {
			return errors.New("constant expression too long")
		}
		op, err := r.byte()
		if err != nil {
			return err
		}
		switch op {
		case 0x0b:
			return nil
		case 0x41:
			_, err = r.sleb(32)
		case 0x42:
			_, err = r.sleb(64)
		case 0x43:
			err = r.skip(4)
		case 0x44:
			err = r.skip(8)
		case 0xd0:
			var t byte
			if t, err = r.byte(); err == nil && !isRefType(t) {
				err = fmt.Errorf("invalid reference type 0x%x", t)
			}
		case 0xd2:
			var idx uint32
			if idx, err = r.u32(); err == nil && uint64(idx) >= m.numFuncs() {
				err = fmt.Errorf("function %d out of range", idx)
			}
		case 0x23:
			var idx uint32
			if idx, err = r.u32(); err == nil && idx >= globals {
				err = fmt.Errorf("global %d out of range", idx)
			}
		case 0xfd:
			var sub byte
			if sub, err = r.byte(); err == nil {
				if sub != 12 {
					err = fmt.Errorf("instruction 0xfd %d not allowed in a constant expression", sub)
				} else {
					err = r.skip(16)
				}
			}
		default:
			return fmt.Errorf("instruction 0x%x not allowed in a constant expression", op)
		}
		if err != nil {
			return err
		}
	}
}

func (m *moduleInfo) parseExports(r *reader) error {
	n, err := r.count(3)
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		if _, err := r.name(); err != nil {
			return err
		}
		kind, err := r.byte()
		if err != nil {
			return err
		}
		idx, err := r.u32()
		if err != nil {
			return err
		}
		var count uint64
		switch kind {
		case 0:
			count = m.numFuncs()
		case 1:
			count = uint64(len(m.tables))
		case 2:
			if m.hasMemory {
				count = 1
			}
		case 3:
			count = uint64(m.globals)
		default:
			return fmt.Errorf("export %d: unsupported kind %d", i, kind)
		}
		if uint64(idx) >= count {
			return fmt.Errorf("export %d: index %d out of range", i, idx)
		}
	}
	return nil
}

func (m *moduleInfo) parseElements(r *reader, b *moduleBudget) error {
	n, err := r.count(2)
	if err != nil {
		return err
	}
	m.elemSegments = n
	for i := uint32(0); i < n; i++ {
		flag, err := r.u32()
		if err != nil {
			return err
		}
		if flag > 7 {
			return fmt.Errorf("element segment %d: unsupported flag %d", i, flag)
		}
		if flag&3 == 2 { // explicit table index
			idx, err := r.u32()
			if err != nil {
				return err
			}
			if uint64(idx) >= uint64(len(m.tables)) {
				return fmt.Errorf("element segment %d: table %d out of range", i, idx)
			}
		}
		if flag&1 == 0 { // active: offset
			if err := m.constExpr(r, m.globals); err != nil {
				return fmt.Errorf("element segment %d offset: %w", i, err)
			}
		}
		exprs := flag&4 != 0
		if flag&3 != 0 { // elemkind or reftype
			t, err := r.byte()
			if err != nil {
				return err
			}
			if exprs && !isRefType(t) || !exprs && t != 0 {
				return fmt.Errorf("element segment %d: invalid element type 0x%x", i, t)
			}
		}
		c, err := r.count(1)
		if err != nil {
			return err
		}
		m.elemEntries += uint64(c)
		if m.elemEntries > b.tableElements {
			return limitError("element segments have more than %d entries, over the limit of %d", m.elemEntries, b.tableElements)
		}
		for k := uint32(0); k < c; k++ {
			if exprs {
				if err := m.constExpr(r, m.globals); err != nil {
					return fmt.Errorf("element segment %d: %w", i, err)
				}
				continue
			}
			idx, err := r.u32()
			if err != nil {
				return err
			}
			if uint64(idx) >= m.numFuncs() {
				return fmt.Errorf("element segment %d: function %d out of range", i, idx)
			}
		}
	}
	return nil
}

func (m *moduleInfo) parseData(r *reader, b *moduleBudget) error {
	n, err := r.count(2)
	if err != nil {
		return err
	}
	if uint64(n) > b.dataSegments {
		return limitError("module has %d data segments, over the limit of %d", n, b.dataSegments)
	}
	if m.dataCount && n != m.dataCountN {
		return fmt.Errorf("%d segments, the data count section says %d", n, m.dataCountN)
	}
	m.dataSegments = n
	m.constData = true
	for i := uint32(0); i < n; i++ {
		start := r.off
		flag, err := r.u32()
		if err != nil {
			return err
		}
		seg := dataSeg{active: flag != 1}
		switch flag {
		case 0:
			err = m.offsetExpr(r, &seg)
		case 1:
		case 2:
			var idx uint32
			if idx, err = r.u32(); err == nil && idx != 0 {
				err = fmt.Errorf("memory %d out of range", idx)
			}
			if err == nil {
				err = m.offsetExpr(r, &seg)
			}
		default:
			err = fmt.Errorf("unsupported flag %d", flag)
		}
		if err != nil {
			return fmt.Errorf("data segment %d: %w", i, err)
		}
		size, err := r.u32()
		if err != nil {
			return err
		}
		if seg.data, err = r.bytes(size); err != nil {
			return err
		}
		seg.raw = r.b[start:r.off]
		m.data = append(m.data, seg)
		m.dataBytes += uint64(size)
	}
	return nil
}

// dataSeg is a data segment: active (with its offset when that is an
// i32.const) or passive, and its encoding.
type dataSeg struct {
	active   bool
	constOff bool
	offset   uint32
	data     []byte
	raw      []byte
}

// offsetExpr reads an active data segment's offset expression, noting a
// constant offset (a global.get offset keeps the module off a data image).
func (m *moduleInfo) offsetExpr(r *reader, seg *dataSeg) error {
	start := r.off
	if err := m.constExpr(r, m.globals); err != nil {
		return err
	}
	e := &reader{b: r.b[start:r.off]}
	if op, _ := e.byte(); op == 0x41 {
		if v, err := e.s32(); err == nil {
			if end, _ := e.byte(); end == 0x0b && e.done() {
				seg.constOff, seg.offset = true, uint32(v)
				return nil
			}
		}
	}
	m.constData = false
	return nil
}

func (m *moduleInfo) parseCode(r *reader, b *moduleBudget, sectionOffset int) error {
	n, err := r.count(2)
	if err != nil {
		return err
	}
	if n != uint32(len(m.funcTypes)) {
		return fmt.Errorf("code section has %d bodies, function section declares %d", n, len(m.funcTypes))
	}
	m.bodies = make([]funcBody, n)
	var totalLocals, totalCode uint64
	sc := &scanner{m: m, b: b}
	for i := range m.bodies {
		size, err := r.u32()
		if err != nil {
			return err
		}
		if uint64(size) > b.functionBytes {
			return limitError("function %d is %d bytes, over the limit of %d bytes per function", uint64(i)+uint64(m.importedFuncs), size, b.functionBytes)
		}
		// Checked before the bodies are scanned: ten thousand functions
		// each under the per-function limit take as long to compile as
		// one of their total size.
		if totalCode += uint64(size); b.codeBytes > 0 && totalCode > b.codeBytes {
			return limitError("the module's code is over the limit of %d bytes for all functions together", b.codeBytes)
		}
		off := r.off
		raw, err := r.bytes(size)
		if err != nil {
			return err
		}
		fb := &m.bodies[i]
		fb.typeIdx = m.funcTypes[i]
		fb.bodyOffset = sectionOffset + off
		if err := sc.scan(fb, raw, uint64(i)+uint64(m.importedFuncs), &totalLocals, nil); err != nil {
			return err
		}
	}
	return nil
}

// scanner decodes function bodies; its control stack is reused.
type scanner struct {
	m    *moduleInfo
	b    *moduleBudget
	ctrl []ctrlFrame
}

type ctrlFrame struct {
	region  int    // index into the weights: 0 the function, k the k-th loop
	base    uint32 // operand height below the block's parameters
	params  uint32
	results uint32
	isLoop  bool
}

// Instruction classes of the one-byte opcodes with no immediates, by their
// stack effect: pop, then push.
func simpleEffect(op byte) (pop, push uint32, ok bool) {
	switch {
	case op == 0x01: // nop
		return 0, 0, true
	case op == 0x1a: // drop
		return 1, 0, true
	case op == 0x1b: // select
		return 3, 1, true
	case op == 0x45 || op == 0x50: // eqz
		return 1, 1, true
	case op >= 0x46 && op <= 0x4f, op >= 0x51 && op <= 0x66: // comparisons
		return 2, 1, true
	case op >= 0x67 && op <= 0x69, op >= 0x79 && op <= 0x7b, op >= 0x8b && op <= 0x91, op >= 0x99 && op <= 0x9f:
		return 1, 1, true // unary
	case op >= 0x6a && op <= 0x78, op >= 0x7c && op <= 0x8a, op >= 0x92 && op <= 0x98, op >= 0xa0 && op <= 0xa6:
		return 2, 1, true // binary
	case op >= 0xa7 && op <= 0xc4: // conversions, sign extension
		return 1, 1, true
	case op == 0xd1: // ref.is_null
		return 1, 1, true
	}
	return 0, 0, false
}

// scan decodes one function body: its locals against the budget, then every
// instruction, checking each index against what the module defines (the
// rewrite appends a function, globals, types and a local, and an index past
// the module's own must not come to name them), nesting and br_table sizes
// against the budget, and collecting the weights and the frame estimate
// the instrumentation needs.
func (s *scanner) scan(fb *funcBody, raw []byte, funcIdx uint64, totalLocals *uint64, em *emitter) error {
	m, b := s.m, s.b
	r := &reader{b: raw}
	groups, err := r.count(2)
	if err != nil {
		return fmt.Errorf("function %d: %w", funcIdx, err)
	}
	var locals uint64
	for g := uint32(0); g < groups; g++ {
		c, err := r.u32()
		if err != nil {
			return fmt.Errorf("function %d: %w", funcIdx, err)
		}
		t, err := r.byte()
		if err != nil {
			return fmt.Errorf("function %d: %w", funcIdx, err)
		}
		if !isValType(t) {
			return fmt.Errorf("function %d: invalid local type 0x%x", funcIdx, t)
		}
		locals += uint64(c)
		if locals > b.functionLocals {
			return limitError("function %d declares more than %d locals, over the limit of %d per function", funcIdx, locals-1, b.functionLocals)
		}
	}
	ft := &m.types[fb.typeIdx]
	numLocalsAll := uint64(len(ft.params)) + locals
	codeStart := r.off
	if em != nil {
		em.begin(fb, raw[codeStart:])
	} else {
		*totalLocals += locals
		if *totalLocals > b.locals {
			return limitError("functions declare %d locals in all, over the limit of %d per module", *totalLocals, b.locals)
		}
		fb.raw = raw
		fb.locals = raw[:codeStart]
		fb.numLocals = uint32(locals)
		fb.code = raw[codeStart:]
	}
	weights := []uint32{0}
	s.ctrl = append(s.ctrl[:0], ctrlFrame{region: 0, results: uint32(len(ft.results))})
	var height, maxHeight uint32
	pop := func(n uint32) {
		base := s.ctrl[len(s.ctrl)-1].base
		if height-base < n {
			height = base // polymorphic stack after unreachable code
		} else {
			height -= n
		}
	}
	push := func(n uint32) {
		height += n
		if height > maxHeight {
			maxHeight = height
		}
	}
	blockType := func() (params, results uint32, err error) {
		c, err := r.sleb(33)
		if err != nil {
			return 0, 0, err
		}
		switch {
		case c == -64: // 0x40: empty
			return 0, 0, nil
		case c < 0:
			if !isValType(byte(c & 0x7f)) {
				return 0, 0, fmt.Errorf("invalid block type 0x%x", byte(c&0x7f))
			}
			return 0, 1, nil
		case uint64(c) >= uint64(len(m.types)):
			return 0, 0, fmt.Errorf("block type %d out of range", c)
		}
		t := &m.types[c]
		return uint32(len(t.params)), uint32(len(t.results)), nil
	}
	label := func() error {
		l, err := r.u32()
		if err != nil {
			return err
		}
		if uint64(l) >= uint64(len(s.ctrl)) {
			return fmt.Errorf("branch depth %d out of range", l)
		}
		return nil
	}
	idx := func(limit uint64, what string) (uint32, error) {
		v, err := r.u32()
		if err == nil && uint64(v) >= limit {
			err = fmt.Errorf("%s %d out of range", what, v)
		}
		return v, err
	}
	memarg := func() error {
		align, err := r.u32()
		if err != nil {
			return err
		}
		if align >= 32 {
			// Bit 6 would announce a memory index (multiple memories,
			// not enabled); wazero refuses 32 and above.
			return fmt.Errorf("invalid alignment %d", align)
		}
		if !m.hasMemory {
			return errors.New("memory instruction without a memory")
		}
		_, err = r.u32()
		return err
	}
	memZero := func() error {
		c, err := r.byte()
		if err == nil && c != 0 {
			err = fmt.Errorf("memory index %d out of range", c)
		}
		if err == nil && !m.hasMemory {
			err = errors.New("memory instruction without a memory")
		}
		return err
	}
	ntables := uint64(len(m.tables))

	for {
		if r.done() {
			return fmt.Errorf("function %d: body does not end with end", funcIdx)
		}
		start := r.off - codeStart
		if em == nil {
			fb.instrCount++
		}
		weights[s.ctrl[len(s.ctrl)-1].region]++
		op, _ := r.byte()
		var err error
		if pp, pu, ok := simpleEffect(op); ok {
			pop(pp)
			push(pu)
			continue
		}
		switch {
		case op == 0x00: // unreachable
			height = s.ctrl[len(s.ctrl)-1].base
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
			if op == 0x04 {
				pop(1)
			}
			var p, res uint32
			if p, res, err = blockType(); err != nil {
				break
			}
			if uint64(len(s.ctrl)) >= b.blockDepth {
				return limitError("function %d nests blocks deeper than the limit of %d", funcIdx, b.blockDepth)
			}
			pop(p)
			f := ctrlFrame{region: s.ctrl[len(s.ctrl)-1].region, base: height, params: p, results: res}
			if op == 0x03 {
				f.isLoop = true
				f.region = len(weights)
				weights = append(weights, 0)
				if em != nil {
					em.loopHeader(r.off-codeStart, f.region)
				}
			}
			s.ctrl = append(s.ctrl, f)
			push(p)
		case op == 0x05: // else
			f := s.ctrl[len(s.ctrl)-1]
			if len(s.ctrl) == 1 {
				return fmt.Errorf("function %d: else outside if", funcIdx)
			}
			height = f.base
			push(f.params)
		case op == 0x0b: // end
			f := s.ctrl[len(s.ctrl)-1]
			s.ctrl = s.ctrl[:len(s.ctrl)-1]
			height = f.base
			push(f.results)
			if len(s.ctrl) == 0 {
				if !r.done() {
					return fmt.Errorf("function %d: instructions after the final end", funcIdx)
				}
				if em != nil {
					em.finalEnd(start)
					return nil
				}
				fb.weight = weights[0]
				fb.loopWeights = weights[1:]
				fb.maxHeight = maxHeight
				fb.frameSlots = frameSlots(numLocalsAll, maxHeight)
				return nil
			}
		case op == 0x0c: // br
			err = label()
			height = s.ctrl[len(s.ctrl)-1].base
		case op == 0x0d: // br_if
			err = label()
			pop(1)
		case op == 0x0e: // br_table
			var n uint32
			if n, err = r.u32(); err != nil {
				break
			}
			if uint64(n) >= b.brTableTargets {
				return limitError("function %d has a br_table of %d targets, over the limit of %d", funcIdx, uint64(n)+1, b.brTableTargets)
			}
			for k := uint32(0); k <= n && err == nil; k++ {
				err = label()
			}
			height = s.ctrl[len(s.ctrl)-1].base
		case op == 0x0f: // return
			if em != nil {
				em.ret(start, len(s.ctrl)-1)
			}
			height = s.ctrl[len(s.ctrl)-1].base
		case op == 0x10: // call
			var f uint32
			immStart := r.off - codeStart
			if f, err = idx(m.numFuncs(), "function"); err != nil {
				break
			}
			if em != nil {
				em.funcIndex(immStart, r.off-codeStart, f)
			}
			fb.calls = true
			t := &m.types[m.funcType(f)]
			pop(uint32(len(t.params)))
			push(uint32(len(t.results)))
		case op == 0x11: // call_indirect
			var ti uint32
			if ti, err = idx(uint64(len(m.types)), "type"); err != nil {
				break
			}
			if _, err = idx(ntables, "table"); err != nil {
				break
			}
			fb.calls = true
			t := &m.types[ti]
			pop(1 + uint32(len(t.params)))
			push(uint32(len(t.results)))
		case op == 0x1c: // select t
			var n uint32
			if n, err = r.u32(); err == nil && n != 1 {
				err = errors.New("select with more than one type")
			}
			if err == nil {
				var t byte
				if t, err = r.byte(); err == nil && !isValType(t) {
					err = fmt.Errorf("invalid value type 0x%x", t)
				}
			}
			pop(3)
			push(1)
		case op == 0x20: // local.get
			_, err = idx(numLocalsAll, "local")
			push(1)
		case op == 0x21: // local.set
			_, err = idx(numLocalsAll, "local")
			pop(1)
		case op == 0x22: // local.tee
			_, err = idx(numLocalsAll, "local")
		case op == 0x23: // global.get
			_, err = idx(uint64(m.globals), "global")
			push(1)
		case op == 0x24: // global.set
			_, err = idx(uint64(m.globals), "global")
			pop(1)
		case op == 0x25: // table.get
			_, err = idx(ntables, "table")
			pop(1)
			push(1)
		case op == 0x26: // table.set
			_, err = idx(ntables, "table")
			pop(2)
		case op >= 0x28 && op <= 0x35: // loads
			err = memarg()
			pop(1)
			push(1)
		case op >= 0x36 && op <= 0x3e: // stores
			err = memarg()
			pop(2)
		case op == 0x3f: // memory.size
			err = memZero()
			push(1)
		case op == 0x40: // memory.grow
			err = memZero()
			pop(1)
			push(1)
		case op == 0x41:
			_, err = r.sleb(32)
			push(1)
		case op == 0x42:
			_, err = r.sleb(64)
			push(1)
		case op == 0x43:
			err = r.skip(4)
			push(1)
		case op == 0x44:
			err = r.skip(8)
			push(1)
		case op == 0xd0: // ref.null
			var t byte
			if t, err = r.byte(); err == nil && !isRefType(t) {
				err = fmt.Errorf("invalid reference type 0x%x", t)
			}
			push(1)
		case op == 0xd2: // ref.func
			immStart := r.off - codeStart
			var f uint32
			if f, err = idx(m.numFuncs(), "function"); err == nil && em != nil {
				em.funcIndex(immStart, r.off-codeStart, f)
			}
			push(1)
		case op == 0xfc:
			err = s.scanMisc(r, fb, pop, push, memZero, idx)
			if fb.bulk && em != nil && isBulk(raw[codeStart+start:r.off]) {
				em.bulk(start, r.off-codeStart, raw[codeStart+start:r.off])
			}
		case op == 0xfd:
			err = scanSIMD(r, pop, push, memarg)
		default:
			return fmt.Errorf("function %d: unsupported instruction 0x%x", funcIdx, op)
		}
		if err != nil {
			return fmt.Errorf("function %d: %w", funcIdx, err)
		}
	}
}

// funcType returns the type index of function f (imported or defined).
func (m *moduleInfo) funcType(f uint32) uint32 {
	if f < m.importedFuncs {
		return m.importTypes[f]
	}
	return m.funcTypes[f-m.importedFuncs]
}

func (s *scanner) scanMisc(r *reader, fb *funcBody, pop, push func(uint32), memZero func() error, idx func(uint64, string) (uint32, error)) error {
	m := s.m
	sub, err := r.u32()
	if err != nil {
		return err
	}
	ntables := uint64(len(m.tables))
	// memory.init and data.drop need a data count section (the data
	// section comes after the code).
	var dataLimit uint64
	if m.dataCount {
		dataLimit = uint64(m.dataCountN)
	}
	elems := uint64(m.elemSegments)
	switch {
	case sub <= 7: // trunc_sat
		pop(1)
		push(1)
	case sub == 8: // memory.init
		if _, err = idx(dataLimit, "data segment"); err == nil {
			err = memZero()
		}
		fb.bulk = true
		pop(3)
	case sub == 9: // data.drop
		_, err = idx(dataLimit, "data segment")
	case sub == 10: // memory.copy
		if err = memZero(); err == nil {
			err = memZero()
		}
		fb.bulk = true
		pop(3)
	case sub == 11: // memory.fill
		err = memZero()
		fb.bulk = true
		pop(3)
	case sub == 12: // table.init
		if _, err = idx(elems, "element segment"); err == nil {
			_, err = idx(ntables, "table")
		}
		fb.bulk = true
		pop(3)
	case sub == 13: // elem.drop
		_, err = idx(elems, "element segment")
	case sub == 14: // table.copy
		if _, err = idx(ntables, "table"); err == nil {
			_, err = idx(ntables, "table")
		}
		fb.bulk = true
		pop(3)
	case sub == 15: // table.grow
		_, err = idx(ntables, "table")
		pop(2)
		push(1)
	case sub == 16: // table.size
		_, err = idx(ntables, "table")
		push(1)
	case sub == 17: // table.fill
		_, err = idx(ntables, "table")
		fb.bulk = true
		pop(3)
	default:
		return fmt.Errorf("unsupported instruction 0xfc %d", sub)
	}
	return err
}

// scanSIMD reads a 0xfd instruction. wazero reads the sub-opcode as one
// byte where the format has a LEB128, so only the encodings on which both
// agree are accepted: one byte below 0x80, or two bytes (op, 0x01) for the
// opcodes from 0x80 to 0xff, which have no immediates and which wazero reads
// as the opcode followed by a nop.
func scanSIMD(r *reader, pop, push func(uint32), memarg func() error) error {
	c, err := r.byte()
	if err != nil {
		return err
	}
	op := uint32(c)
	if c >= 0x80 {
		c2, err := r.byte()
		if err != nil {
			return err
		}
		if c2 != 0x01 {
			return fmt.Errorf("unsupported instruction 0xfd 0x%x 0x%x", c, c2)
		}
		pop(1)
		push(1)
		return nil
	}
	switch {
	case op <= 10 || op == 92 || op == 93: // loads
		err = memarg()
		pop(1)
		push(1)
	case op == 11: // v128.store
		err = memarg()
		pop(2)
	case op == 12: // v128.const
		err = r.skip(16)
		push(1)
	case op == 13: // i8x16.shuffle
		err = r.skip(16)
		pop(2)
		push(1)
	case op >= 21 && op <= 34: // extract_lane, replace_lane
		err = r.skip(1)
		pop(2)
		push(1)
	case op >= 84 && op <= 87: // load_lane
		if err = memarg(); err == nil {
			err = r.skip(1)
		}
		pop(2)
		push(1)
	case op >= 88 && op <= 91: // store_lane
		if err = memarg(); err == nil {
			err = r.skip(1)
		}
		pop(2)
	default:
		// Every other SIMD instruction pops one to three values and pushes
		// one; counting it as pop 1, push 1 never underestimates the
		// height.
		pop(1)
		push(1)
	}
	return err
}

// frameSlots estimates a function's native frame in 8-byte slots: its
// parameters and locals, the operand stack at its highest, and a fixed part
// for the return address, the saved frame pointer and spilled registers.
// v128 values take two slots, so everything is counted twice.
func frameSlots(locals uint64, maxHeight uint32) uint32 {
	s := 16 + 2*locals + 2*uint64(maxHeight)
	return uint32(min(s, math.MaxUint32))
}
