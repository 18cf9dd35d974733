package runtime

import (
	"errors"
	"fmt"
)

// This file holds the WebAssembly binary primitives of the pre-parse
// (wasmparse.go) and of the rewrite (wasmrewrite.go): a strict reader of the
// binary format's integers and vectors, and their encoders. The reader is
// strict on purpose: the rewritten module is decoded again by wazero, and an
// integer that the two decoders read differently (an over-long or
// over-flowing LEB128) could name one index to the pre-parse and another to
// wazero, so such encodings are refused here.

const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
)

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

var (
	errTruncated = errors.New("unexpected end of module")
	errLEB       = errors.New("malformed LEB128 integer")
)

type reader struct {
	b   []byte
	off int
}

func (r *reader) done() bool { return r.off >= len(r.b) }

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

// u32 reads an unsigned LEB128 of at most 5 bytes whose value fits 32 bits.
func (r *reader) u32() (uint32, error) {
	var v uint32
	for i := 0; i < 5; i++ {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		if i == 4 && c&0xf0 != 0 {
			return 0, errLEB // a continuation or bits beyond 32
		}
		v |= uint32(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, errLEB
}

// sleb reads a signed LEB128 of the given width (32, 33 or 64 bits).
func (r *reader) sleb(bits int) (int64, error) {
	var v int64
	maxBytes := (bits + 6) / 7
	for i := 0; i < maxBytes; i++ {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		shift := 7 * i
		if i == maxBytes-1 {
			// The last byte holds the top bits and copies of the sign bit:
			// it may not continue and its unused bits must equal the sign.
			if c&0x80 != 0 {
				return 0, errLEB
			}
			used := bits - shift // payload bits in this byte, sign included
			if used < 7 {
				rest := int8(c<<1) >> uint(used) // the unused bits, sign-extended, and the sign
				if rest != 0 && rest != -1 {
					return 0, errLEB
				}
			}
		}
		v |= int64(c&0x7f) << shift
		if c&0x80 == 0 {
			if shift+7 < 64 && c&0x40 != 0 {
				v |= -1 << (shift + 7)
			}
			return v, nil
		}
	}
	return 0, errLEB
}

func (r *reader) s32() (int32, error) {
	v, err := r.sleb(32)
	return int32(v), err
}

func (r *reader) bytes(n uint32) ([]byte, error) {
	if uint64(r.off)+uint64(n) > uint64(len(r.b)) {
		return nil, errTruncated
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s, nil
}

func (r *reader) skip(n int) error {
	if r.off+n > len(r.b) {
		return errTruncated
	}
	r.off += n
	return nil
}

func (r *reader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	s, err := r.bytes(n)
	return string(s), err
}

// count reads a vector length and checks that the rest of the input could
// hold that many items of at least minSize bytes each, so that no caller
// allocates for a count the module cannot back.
func (r *reader) count(minSize int) (uint32, error) {
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	if uint64(n)*uint64(minSize) > uint64(len(r.b)-r.off) {
		return 0, errTruncated
	}
	return n, nil
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

func appendS32(b []byte, v int32) []byte { return appendS64(b, int64(v)) }

func appendS64(b []byte, x int64) []byte {
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if (x == 0 && c&0x40 == 0) || (x == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendSection(out []byte, id byte, body []byte) []byte {
	out = append(out, id)
	out = appendU32(out, uint32(len(body)))
	return append(out, body...)
}
