package hl7

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
)

// Delimiters are the separators of a message, taken from MSH-1 and MSH-2.
// A zero byte means the message does not define that delimiter.
type Delimiters struct {
	Field        byte // MSH-1, usually '|'
	Component    byte // MSH-2 char 1, usually '^'
	Repetition   byte // MSH-2 char 2, usually '~'
	Escape       byte // MSH-2 char 3, usually '\'
	Subcomponent byte // MSH-2 char 4, usually '&'
}

// DefaultDelimiters are the recommended HL7 delimiters |^~\&.
var DefaultDelimiters = Delimiters{Field: '|', Component: '^', Repetition: '~', Escape: '\\', Subcomponent: '&'}

// seg is one segment of the index. An unedited segment is a range of
// Message.data with its field separators in Message.fpos. An edited or added
// segment is a list of pieces instead (Message.edits[edit-1]): the segment
// split at its field separators, each piece referring to data or to bytes of
// its own, so that an edit replaces only the field it changes.
type seg struct {
	start, end uint32 // unedited: segment content in data, terminator excluded
	tstart     uint32 // terminator run (CR/LF and blank lines) in data: [tstart, tend)
	tend       uint32
	fi         int32 // unedited: index of the first separator in Message.fpos; -1 = not indexed yet
	nf         int32 // unedited: number of field separators in the segment
	edit       int32 // edited or added: 1 + index of its pieces in Message.edits; 0 = unedited
	newTerm    bool  // added segment: use the message's default terminator
}

// Message is a parsed HL7 v2 message. The zero value is an empty message
// that can be filled with [Message.Parse].
type Message struct {
	data   []byte // message text as received, framing and BOM stripped
	d      Delimiters
	segs   []seg
	fpos   []uint32   // field separator offsets of the indexed segments
	edits  [][][]byte // pieces of edited and added segments (see seg)
	ebuf   []byte     // bytes of edited fields and added segments, append-only until Reset
	first  uint32     // offset of the first segment (after leading blank lines)
	edited bool
}

// Parse parses one HL7 message. The returned Message refers to data, which
// must not be modified while the Message is used. On a *ParseError found
// after a valid MSH segment, Parse also returns the message as far as it was
// read, so that a negative acknowledgement can still be built from its header.
func Parse(data []byte) (*Message, error) {
	m := new(Message)
	if err := m.Parse(data); err != nil {
		if len(m.segs) > 0 {
			return m, err
		}
		return nil, err
	}
	return m, nil
}

// Reset empties m, keeping its buffers for reuse.
func (m *Message) Reset() {
	m.data = nil
	m.d = Delimiters{}
	m.segs = m.segs[:0]
	m.fpos = m.fpos[:0]
	for i, ps := range m.edits { // keep the piece lists, drop what they referred to
		clear(ps[:cap(ps)])
		m.edits[i] = ps[:0]
	}
	m.edits = m.edits[:0]
	m.ebuf = m.ebuf[:0]
	m.first = 0
	m.edited = false
}

// Parse resets m and parses data into it, reusing m's buffers: parsing into a
// Message that was used before does not allocate. See [Parse].
func (m *Message) Parse(data []byte) error {
	m.Reset()
	inner, base, err := stripFraming(data)
	if err != nil {
		return err
	}
	return m.parse(inner, base, data)
}

// stripFraming removes a UTF-8 BOM and MLLP framing. It returns the message
// text and its offset in data.
func stripFraming(data []byte) ([]byte, int, error) {
	base := 0
	if len(data) >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF {
		data = data[3:]
		base = 3
	}
	if len(data) > 0 && data[0] == 0x0B {
		end := bytes.IndexByte(data, 0x1C)
		if end < 0 {
			return nil, 0, &ParseError{Offset: base, Line: 1, Code: CodeSegmentSequence,
				Reason: "MLLP start block (0x0B) without end block (0x1C)"}
		}
		rest := data[end+1:]
		if len(rest) > 0 && rest[0] == '\r' {
			rest = rest[1:]
		}
		for _, c := range rest {
			if c != '\r' && c != '\n' && c != ' ' && c != '\t' {
				off := base + len(data) - len(rest)
				return nil, 0, &ParseError{Offset: off, Line: lineAt(data, off-base), Code: CodeSegmentSequence,
					Reason: "data after MLLP end block"}
			}
		}
		data = data[1:end]
		base++
		if len(data) >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF {
			data = data[3:]
			base += 3
		}
	}
	return data, base, nil
}

func (m *Message) errAt(orig []byte, base, off int, segStart int, field, code int, reason string) *ParseError {
	e := &ParseError{Offset: base + off, Line: lineAt(orig, base+off), Field: field, Code: code, Reason: reason}
	if segStart >= 0 && segStart < len(m.data) {
		e.Segment = segName(m.data[segStart:])
	}
	return e
}

// parseDelimiters reads MSH-1 and MSH-2 from a header segment starting at
// data[0] ("MSH|^~\&|..."). It returns the delimiters, or a field number and
// reason on error.
func parseDelimiters(data []byte) (Delimiters, int, string) {
	var d Delimiters
	if len(data) < 5 {
		return d, 1, "header segment too short"
	}
	fs := data[3]
	if !isDelimChar(fs) {
		return d, 1, "invalid field separator (MSH-1)"
	}
	d.Field = fs
	var enc [5]byte
	n := 0
	for i := 4; i < len(data); i++ {
		c := data[i]
		if c == fs || c == '\r' || c == '\n' {
			break
		}
		if n == len(enc) {
			return d, 2, "too many encoding characters (MSH-2)"
		}
		if !isDelimChar(c) {
			return d, 2, "invalid encoding character (MSH-2)"
		}
		for j := 0; j < n; j++ {
			if enc[j] == c {
				return d, 2, "duplicate encoding character (MSH-2)"
			}
		}
		enc[n] = c
		n++
	}
	if n == 0 {
		return d, 2, "missing encoding characters (MSH-2)"
	}
	d.Component = enc[0]
	if n > 1 {
		d.Repetition = enc[1]
	}
	if n > 2 {
		d.Escape = enc[2]
	}
	if n > 3 {
		d.Subcomponent = enc[3]
	}
	return d, 0, ""
}

func isDelimChar(c byte) bool {
	switch {
	case c <= ' ', c >= 0x7f:
		return false
	case c >= '0' && c <= '9', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		return false
	case c == '"': // "" is the HL7 null
		return false
	}
	return true
}

// isSegChar reports whether c may appear in a segment ID.
func isSegChar(c byte) bool {
	return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// skipTerm skips segment terminators and blank (empty or whitespace-only)
// lines starting at i.
func skipTerm(data []byte, i int) int {
	n := len(data)
	for i < n {
		c := data[i]
		if c == '\r' || c == '\n' {
			i++
			continue
		}
		k := i
		for k < n && (data[k] == ' ' || data[k] == '\t') {
			k++
		}
		if k > i && (k == n || data[k] == '\r' || data[k] == '\n') {
			i = k
			continue
		}
		break
	}
	return i
}

func isHeaderName(b []byte) bool {
	if len(b) < 3 {
		return false
	}
	return (b[0] == 'M' && b[1] == 'S' && b[2] == 'H') || (b[1] == 'H' && b[2] == 'S' && (b[0] == 'F' || b[0] == 'B'))
}

func isEnvelopeName(b []byte) bool {
	if len(b) < 3 {
		return false
	}
	return (b[1] == 'H' && b[2] == 'S' && (b[0] == 'F' || b[0] == 'B')) ||
		(b[1] == 'T' && b[2] == 'S' && (b[0] == 'F' || b[0] == 'B'))
}

// parse indexes data (one message). orig and base locate data in the caller's
// input for error positions.
func (m *Message) parse(data []byte, base int, orig []byte) error {
	m.data = data
	if uint64(len(data)) >= math.MaxUint32 {
		return &ParseError{Offset: base, Line: 1, Code: CodeInternal, Reason: "message larger than 4 GiB"}
	}
	n := len(data)
	i := skipTerm(data, 0)
	if i >= n {
		return m.errAt(orig, base, i, -1, 0, CodeSegmentSequence, "empty message")
	}
	if !bytes.HasPrefix(data[i:], []byte("MSH")) {
		if isEnvelopeName(data[i:]) {
			return m.errAt(orig, base, i, i, 0, CodeSegmentSequence, "batch envelope where a message was expected (use ParseBatch)")
		}
		return m.errAt(orig, base, i, i, 0, CodeSegmentSequence, "message does not start with MSH")
	}
	d, field, reason := parseDelimiters(data[i:])
	if reason != "" {
		off := i + 3
		if field == 2 {
			off = i + 4
		}
		return m.errAt(orig, base, off, i, field, CodeDataType, reason)
	}
	m.d = d
	m.first = uint32(i)

	// One allocation for the segment index: every segment ends at a CR or LF
	// or at the end of the data.
	est := bytes.Count(data[i:], []byte{'\r'}) + bytes.Count(data[i:], []byte{'\n'}) + 1
	if cap(m.segs) < est {
		m.segs = make([]seg, 0, est)
	}
	segs := m.segs[:0]
	if nsep := bytes.Count(data[i:], []byte{d.Field}); cap(m.fpos) < nsep {
		m.fpos = make([]uint32, 0, nsep)
	}
	fpos := m.fpos[:0]
	fs := d.Field

	nextCR, nextLF := -2, -2 // -2: not searched yet, -1: none left
	for i < n {
		// Find the end of the segment: the next CR or LF.
		if nextCR != -1 && nextCR < i {
			nextCR = bytes.IndexByte(data[i:], '\r')
			if nextCR >= 0 {
				nextCR += i
			}
		}
		if nextLF != -1 && nextLF < i {
			nextLF = bytes.IndexByte(data[i:], '\n')
			if nextLF >= 0 {
				nextLF += i
			}
		}
		e := n
		if nextCR >= 0 {
			e = nextCR
		}
		if nextLF >= 0 && nextLF < e {
			e = nextLF
		}
		// Validate the segment ID.
		if e-i < 3 || !isSegChar(data[i]) || !isSegChar(data[i+1]) || !isSegChar(data[i+2]) {
			m.segs, m.fpos = segs, fpos
			return m.errAt(orig, base, i, i, 0, CodeSegmentSequence, "invalid segment ID")
		}
		if len(segs) > 0 && (isHeaderName(data[i:]) || isEnvelopeName(data[i:])) {
			m.segs, m.fpos = segs, fpos
			if data[i] == 'M' {
				return m.errAt(orig, base, i, i, 0, CodeSegmentSequence, "second MSH segment: several messages (use ParseBatch)")
			}
			return m.errAt(orig, base, i, i, 0, CodeSegmentSequence, "batch envelope segment inside a message (use ParseBatch)")
		}
		t := skipTerm(data, e)
		fi := len(fpos)
		fpos = appendSeps(fpos, data[i:e], fs)
		segs = append(segs, seg{start: uint32(i), end: uint32(e), tstart: uint32(e), tend: uint32(t), fi: int32(fi), nf: int32(len(fpos) - fi)})
		i = t
	}
	m.segs, m.fpos = segs, fpos
	return nil
}

// indexFields records the field separator offsets of unedited segment si
// (Parse indexes every segment; batch envelopes are indexed as they are
// found).
func (m *Message) indexFields(si int) {
	s := &m.segs[si]
	fi := len(m.fpos)
	m.fpos = appendSeps(m.fpos, m.data[s.start:s.end], m.d.Field)
	s.fi = int32(fi)
	s.nf = int32(len(m.fpos) - fi)
}

// numSeps returns the number of field separators of segment si.
func (m *Message) numSeps(si int) int {
	s := &m.segs[si]
	if s.edit > 0 {
		return len(m.edits[s.edit-1]) - 1
	}
	if s.fi < 0 {
		m.indexFields(si)
	}
	return int(s.nf)
}

// piece returns the k-th part (0-based) of segment si split at its field
// separators, k <= numSeps(si): piece 0 is the segment ID.
func (m *Message) piece(si, k int) []byte {
	s := &m.segs[si]
	if s.edit > 0 {
		return m.edits[s.edit-1][k]
	}
	if s.fi < 0 {
		m.indexFields(si)
	}
	b := m.data[s.start:s.end]
	nf := int(s.nf)
	pos := m.fpos[s.fi : int(s.fi)+nf]
	from, to := 0, len(b)
	if k > 0 {
		from = int(pos[k-1]) + 1
	}
	if k < nf {
		to = int(pos[k])
	}
	return b[from:to]
}

// pieces returns the pieces of segment si for editing, splitting an
// unedited segment first: the pieces refer to data, nothing is copied.
func (m *Message) pieces(si int) [][]byte {
	s := &m.segs[si]
	if s.edit > 0 {
		return m.edits[s.edit-1]
	}
	n := m.numSeps(si)
	ps := m.newPieces(n + 1)
	for k := 0; k <= n; k++ {
		ps = append(ps, m.piece(si, k))
	}
	m.edits = append(m.edits, ps)
	s.edit = int32(len(m.edits))
	return ps
}

// newPieces returns an empty piece list with room for n, reusing one left by
// Reset when there is one.
func (m *Message) newPieces(n int) [][]byte {
	if len(m.edits) < cap(m.edits) {
		if ps := m.edits[:len(m.edits)+1][len(m.edits)]; cap(ps) >= n {
			return ps[:0]
		}
	}
	return make([][]byte, 0, n)
}

// segName returns the first three bytes of segment si, its ID.
func (m *Message) segName(si int) []byte {
	s := &m.segs[si]
	if s.edit > 0 {
		id := m.edits[s.edit-1][0]
		return id[:min(3, len(id))]
	}
	return m.data[s.start:min(s.start+3, s.end)]
}

// segLen returns the length of segment si's content.
func (m *Message) segLen(si int) int {
	s := &m.segs[si]
	if s.edit == 0 {
		return int(s.end - s.start)
	}
	ps := m.edits[s.edit-1]
	n := len(ps) - 1
	for _, p := range ps {
		n += len(p)
	}
	return n
}

// appendSeg appends the content of segment si to dst.
func (m *Message) appendSeg(dst []byte, si int) []byte {
	s := &m.segs[si]
	if s.edit == 0 {
		return append(dst, m.data[s.start:s.end]...)
	}
	for k, p := range m.edits[s.edit-1] {
		if k > 0 {
			dst = append(dst, m.d.Field)
		}
		dst = append(dst, p...)
	}
	return dst
}

// segBytes returns the content of segment si: a part of data when it is
// unedited, else a new copy.
func (m *Message) segBytes(si int) []byte {
	s := &m.segs[si]
	if s.edit == 0 {
		return m.data[s.start:s.end]
	}
	return m.appendSeg(make([]byte, 0, m.segLen(si)), si)
}

// Delimiters returns the message's delimiters.
func (m *Message) Delimiters() Delimiters { return m.d }

// NumSegments returns the number of segments.
func (m *Message) NumSegments() int { return len(m.segs) }

const (
	lo7 = 0x7f7f7f7f7f7f7f7f
	b01 = 0x0101010101010101
)

// appendSeps appends the offsets of every sep byte in b to pos. It looks at
// eight bytes at a time (SWAR) and falls back to IndexByte over long runs
// without separators (base64 payloads).
func appendSeps(pos []uint32, b []byte, sep byte) []uint32 {
	pat := uint64(sep) * b01
	off := 0
	miss := 0
	for off+8 <= len(b) {
		v := binary.LittleEndian.Uint64(b[off:]) ^ pat
		// High bit set in each byte of v that is zero (exact, no borrow).
		z := ^(((v & lo7) + lo7) | v | lo7)
		if z == 0 {
			off += 8
			miss++
			if miss >= 4 { // a long field: let IndexByte skip it
				j := bytes.IndexByte(b[off:], sep)
				if j < 0 {
					return pos
				}
				off += j
				miss = 0
			}
			continue
		}
		miss = 0
		for z != 0 {
			pos = append(pos, uint32(off+bits.TrailingZeros64(z)>>3))
			z &= z - 1
		}
		off += 8
	}
	for ; off < len(b); off++ {
		if b[off] == sep {
			pos = append(pos, uint32(off))
		}
	}
	return pos
}
