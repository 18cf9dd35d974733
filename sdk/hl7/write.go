package hl7

import (
	"bytes"
	"io"
)

// Bytes returns the serialised message. For an unedited message this is the
// input itself (framing and BOM stripped), not a copy: do not modify it.
func (m *Message) Bytes() []byte {
	if !m.edited {
		return m.data
	}
	return m.AppendTo(make([]byte, 0, m.size()))
}

// String returns the serialised message as a string.
func (m *Message) String() string { return string(m.Bytes()) }

// WriteTo writes the serialised message to w.
func (m *Message) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(m.Bytes())
	return int64(n), err
}

func (m *Message) size() int {
	n := int(m.first)
	for i := range m.segs {
		s := &m.segs[i]
		n += m.segLen(i) + int(s.tend-s.tstart) + 2
	}
	return n
}

// defaultTerm is the terminator used after added segments: the message's
// first terminator, or CR.
func (m *Message) defaultTerm() string {
	i := bytes.IndexAny(m.data, "\r\n")
	switch {
	case i < 0:
		return "\r"
	case m.data[i] == '\n':
		return "\n"
	case i+1 < len(m.data) && m.data[i+1] == '\n':
		return "\r\n"
	}
	return "\r"
}

// AppendTo appends the serialised message to dst. Unedited segments are
// copied as received, with their original terminators; edited segments are
// rebuilt.
func (m *Message) AppendTo(dst []byte) []byte {
	if !m.edited {
		return append(dst, m.data...)
	}
	dst = append(dst, m.data[:m.first]...)
	term := ""
	last := len(m.segs) - 1
	runS, runE := 0, 0 // pending run of contiguous original segments in data
	for i := range m.segs {
		s := &m.segs[i]
		needTerm := s.newTerm || (s.tstart == s.tend && i < last)
		if s.edit == 0 && !needTerm {
			if runE > runS && int(s.start) == runE {
				runE = int(s.tend)
				continue
			}
			dst = append(dst, m.data[runS:runE]...)
			runS, runE = int(s.start), int(s.tend)
			continue
		}
		dst = append(dst, m.data[runS:runE]...)
		runS, runE = 0, 0
		dst = m.appendSeg(dst, i)
		if needTerm {
			if term == "" {
				term = m.defaultTerm()
			}
			dst = append(dst, term...)
		} else {
			dst = append(dst, m.data[s.tstart:s.tend]...)
		}
	}
	return append(dst, m.data[runS:runE]...)
}

// Set stores value, escaped, at path. Missing fields, repetitions and
// components are added; the segment must exist. Only the field concerned
// is rebuilt. MSH-1 and MSH-2 cannot be set. Setting the text `""` stores
// the HL7 null; setting "" empties the element.
func (m *Message) Set(path, value string) error {
	p, err := ParsePath(path)
	if err != nil {
		return err
	}
	return m.SetPath(p, value)
}

// SetPath is [Message.Set] with a parsed path.
func (m *Message) SetPath(p Path, value string) error {
	if m.d.Escape == 0 && needsEscape([]byte(value), Delimiters{Field: m.d.Field, Component: m.d.Component,
		Repetition: m.d.Repetition, Escape: 1, Subcomponent: m.d.Subcomponent}) {
		return ErrNoDelimiter
	}
	return m.set(p, value, true)
}

// SetRaw stores raw ER7 text at path without escaping it. The text may hold
// delimiters below the level addressed (components in a field, say) but no
// segment terminator, no field separator and no delimiter of the addressed
// level or above.
func (m *Message) SetRaw(path, raw string) error {
	p, err := ParsePath(path)
	if err != nil {
		return err
	}
	d := m.d
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		bad := c == '\r' || c == '\n' || c == d.Field
		if p.Repetition > 0 || p.Component > 0 {
			bad = bad || (c == d.Repetition && c != 0)
		}
		if p.Component > 0 {
			bad = bad || (c == d.Component && c != 0)
		}
		if p.Subcomponent > 0 {
			bad = bad || (c == d.Subcomponent && c != 0)
		}
		if bad {
			return ErrBadRaw
		}
	}
	return m.set(p, raw, false)
}

// set replaces the element at p. Only the field concerned is rebuilt, at
// the end of ebuf: an edit costs memory in proportion to the field it
// changes, whatever the size of the segment, since the other fields keep
// referring to the input.
func (m *Message) set(p Path, value string, escape bool) error {
	if p.Field < 1 {
		return ErrBadPath
	}
	seg := m.Segment(p.Segment, max(p.Occurrence, 1))
	if !seg.Exists() {
		return ErrNoSegment
	}
	k := p.Field
	if seg.header() {
		if p.Field <= 2 {
			return ErrReadOnly
		}
		k = p.Field - 1
	}
	rep := p.Repetition
	if rep == 0 && p.Component > 0 {
		rep = 1
	}
	seps := [3]byte{m.d.Repetition, m.d.Component, m.d.Subcomponent}
	idxs := [3]int{rep, p.Component, p.Subcomponent}
	for l, idx := range idxs {
		if idx > 1 && seps[l] == 0 {
			return ErrNoDelimiter
		}
	}

	ps := m.pieces(seg.i)
	var field []byte
	if k < len(ps) {
		field = ps[k]
	}
	// Find the range [a, e) of field to replace, and the padding needed
	// when the target does not exist yet.
	a, e := 0, len(field)
	missingAt, have := -1, 0
	for l := 0; l < 3; l++ {
		idx := idxs[l]
		if idx == 0 {
			break
		}
		sep := seps[l]
		if sep == 0 || missingAt >= 0 {
			continue
		}
		for i := 1; i < idx; i++ {
			j := bytes.IndexByte(field[a:e], sep)
			if j < 0 {
				missingAt, have = l, i
				a = e
				break
			}
			a += j + 1
		}
		if missingAt < 0 {
			if j := bytes.IndexByte(field[a:e], sep); j >= 0 {
				e = a + j
			}
		}
	}

	// The new field goes to the end of ebuf; field may be an earlier part
	// of ebuf, which appending never overwrites.
	off := len(m.ebuf)
	nb := append(m.ebuf, field[:a]...)
	if missingAt >= 0 {
		for l := missingAt; l < 3 && idxs[l] > 0; l++ {
			n := idxs[l] - 1
			if l == missingAt {
				n = idxs[l] - have
			}
			for ; n > 0; n-- {
				nb = append(nb, seps[l])
			}
		}
	}
	if escape {
		nb = AppendEscaped(nb, []byte(value), m.d)
	} else {
		nb = append(nb, value...)
	}
	nb = append(nb, field[e:]...)
	m.ebuf = nb
	for len(ps) <= k {
		ps = append(ps, nil) // the missing fields, empty
	}
	ps[k] = nb[off:len(nb):len(nb)]
	m.edits[m.segs[seg.i].edit-1] = ps
	m.edited = true
	return nil
}

func validSegmentText(raw string, d Delimiters) bool {
	if len(raw) < 3 || !isSegChar(raw[0]) || !isSegChar(raw[1]) || !isSegChar(raw[2]) {
		return false
	}
	if len(raw) > 3 && raw[3] != d.Field {
		return false
	}
	if isHeaderName([]byte(raw)) || isEnvelopeName([]byte(raw)) {
		return false
	}
	return bytes.IndexByte([]byte(raw), '\r') < 0 && bytes.IndexByte([]byte(raw), '\n') < 0
}

// AppendSegment adds a segment, given as raw ER7 text without terminator
// ("ZPI|1|abc"), at the end of the message.
func (m *Message) AppendSegment(raw string) error {
	return m.InsertSegment(len(m.segs), raw)
}

// InsertSegment inserts a segment (raw ER7 text without terminator) at
// 0-based position i; 1 <= i <= NumSegments() (nothing goes before MSH).
func (m *Message) InsertSegment(i int, raw string) error {
	if len(m.segs) == 0 {
		return ErrNotAMessage
	}
	if i < 1 || i > len(m.segs) {
		return ErrOutOfRange
	}
	if !validSegmentText(raw, m.d) {
		return ErrBadSegment
	}
	off := len(m.ebuf)
	m.ebuf = append(m.ebuf, raw...)
	b := m.ebuf[off:len(m.ebuf):len(m.ebuf)]
	ps := m.newPieces(bytes.Count(b, []byte{m.d.Field}) + 1)
	for {
		j := bytes.IndexByte(b, m.d.Field)
		if j < 0 {
			break
		}
		ps = append(ps, b[:j:j])
		b = b[j+1:]
	}
	ps = append(ps, b)
	m.edits = append(m.edits, ps)
	m.segs = append(m.segs, seg{})
	copy(m.segs[i+1:], m.segs[i:])
	m.segs[i] = seg{fi: -1, edit: int32(len(m.edits)), newTerm: true}
	m.edited = true
	return nil
}

// RemoveSegment removes the segment at 0-based position i (not MSH).
func (m *Message) RemoveSegment(i int) error {
	if i < 1 || i >= len(m.segs) {
		return ErrOutOfRange
	}
	if e := m.segs[i].edit; e > 0 {
		m.edits[e-1] = nil // its fields are no longer referred to
	}
	m.segs = append(m.segs[:i], m.segs[i+1:]...)
	m.edited = true
	return nil
}
