package runtime

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// This file holds the small amount of WebAssembly binary parsing the runtime
// needs before handing a module to wazero: listing imports (so that a
// forbidden import is reported by name at deploy, not at first execution),
// giving every table without a declared maximum a maximum equal to its
// initial size (docs/decisions.md 14), and merging active data segments that
// are separated by short runs of zeros. Go's linker emits tens of thousands
// of small data segments, and wazero evaluates and copies each one at every
// instantiation; merged, a Go bot instantiates in a fraction of the time.

const (
	secImport    = 2
	secTable     = 4
	secData      = 11
	secDataCount = 12
)

// maxDataGap is the longest run of zero bytes mergeData fills to join two
// data segments.
const maxDataGap = 256

type wasmImport struct {
	module, name string
	kind         byte // 0 func, 1 table, 2 memory, 3 global, 4 tag
}

func (i wasmImport) kindName() string {
	switch i.kind {
	case 0:
		return "function"
	case 1:
		return "table"
	case 2:
		return "memory"
	case 3:
		return "global"
	case 4:
		return "tag"
	}
	return fmt.Sprintf("kind %d", i.kind)
}

var errTruncated = errors.New("unexpected end of module")

type reader struct {
	b   []byte
	off int
}

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) u32() (uint32, error) {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, errors.New("malformed LEB128 integer")
}

func (r *reader) bytes(n uint32) ([]byte, error) {
	if uint64(r.off)+uint64(n) > uint64(len(r.b)) {
		return nil, errTruncated
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s, nil
}

func (r *reader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	s, err := r.bytes(n)
	return string(s), err
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// prepareModule parses the module's imports and returns a copy of the module
// in which each table without a maximum has maximum = minimum. Structural
// errors are reported as they are found; everything else is left to wazero's
// own validation.
func prepareModule(wasm []byte) (imports []wasmImport, out []byte, err error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, nil, errors.New("not a WebAssembly module (bad magic number)")
	}
	if string(wasm[4:8]) != "\x01\x00\x00\x00" {
		return nil, nil, errors.New("unsupported WebAssembly binary version")
	}
	r := &reader{b: wasm, off: 8}
	out = make([]byte, 0, len(wasm)+16)
	out = append(out, wasm[:8]...)
	dataCount := false
	for r.off < len(wasm) {
		start := r.off
		id, err := r.byte()
		if err != nil {
			return nil, nil, err
		}
		size, err := r.u32()
		if err != nil {
			return nil, nil, err
		}
		body, err := r.bytes(size)
		if err != nil {
			return nil, nil, fmt.Errorf("section %d: %w", id, err)
		}
		switch id {
		case secImport:
			imports, err = parseImports(body)
			if err != nil {
				return nil, nil, fmt.Errorf("import section: %w", err)
			}
			out = append(out, wasm[start:r.off]...)
		case secTable:
			nb, err := capTables(body)
			if err != nil {
				return nil, nil, fmt.Errorf("table section: %w", err)
			}
			out = append(out, secTable)
			out = appendU32(out, uint32(len(nb)))
			out = append(out, nb...)
		case secData:
			nb, ok := mergeData(body)
			if !ok || dataCount {
				out = append(out, wasm[start:r.off]...)
				break
			}
			out = append(out, secData)
			out = appendU32(out, uint32(len(nb)))
			out = append(out, nb...)
		default:
			if id == secDataCount {
				dataCount = true // segment indices matter: do not merge
			}
			out = append(out, wasm[start:r.off]...)
		}
	}
	return imports, out, nil
}

func parseImports(body []byte) ([]wasmImport, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	var imps []wasmImport
	for i := uint32(0); i < n; i++ {
		var imp wasmImport
		if imp.module, err = r.name(); err != nil {
			return nil, err
		}
		if imp.name, err = r.name(); err != nil {
			return nil, err
		}
		if imp.kind, err = r.byte(); err != nil {
			return nil, err
		}
		imps = append(imps, imp)
		switch imp.kind {
		case 0: // type index
			_, err = r.u32()
		default:
			// Any non-function import is rejected by the caller; there is
			// no need to decode the rest of the section.
			return imps, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return imps, nil
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
		if ref != 0x70 && ref != 0x6f {
			return nil, fmt.Errorf("unsupported table type 0x%x", ref)
		}
		flag, err := r.byte()
		if err != nil {
			return nil, err
		}
		if flag > 1 {
			return nil, fmt.Errorf("unsupported table limits flag 0x%x", flag)
		}
		min, err := r.u32()
		if err != nil {
			return nil, err
		}
		max := min
		if flag == 1 {
			if max, err = r.u32(); err != nil {
				return nil, err
			}
		}
		out = append(out, ref, 1)
		out = appendU32(out, min)
		out = appendU32(out, max)
	}
	if r.off != len(body) {
		return nil, errors.New("trailing bytes")
	}
	return out, nil
}

type dataSegment struct {
	offset uint64
	data   []byte
}

// mergeData rewrites a data section whose segments are all active, for
// memory 0, at constant offsets, and pairwise disjoint. Disjoint writes
// commute, so the segments may be sorted by offset; then each is joined to
// the previous one when the gap between them is at most maxDataGap bytes,
// filled with zeros (no segment writes there, and memory starts zeroed).
// It reports false when the section is left alone.
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

func (r *reader) s32() (int32, error) {
	var v int64
	shift := 0
	for {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			break
		}
		if shift >= 35 {
			return 0, errors.New("malformed LEB128 integer")
		}
	}
	return int32(v), nil
}

func appendS32(b []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if (x == 0 && c&0x40 == 0) || (x == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
