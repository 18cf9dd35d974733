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
		n += int(s.end-s.start) + int(s.tend-s.tstart) + 2
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
		if !s.owned && !needTerm {
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
		dst = append(dst, m.segBytes(i)...)
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
// components are added; the segment must exist. Only the segment concerned
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

func (m *Message) set(p Path, value string, escape bool) error {
	if p.Field < 1 {
		return ErrBadPath
	}
	seg := m.Segment(p.Segment, max(p.Occurrence, 1))
	if !seg.Exists() {
		return ErrNoSegment
	}
	b := m.segBytes(seg.i)
	k := p.Field
	if isHeaderName(b) {
		if p.Field <= 2 {
			return ErrReadOnly
		}
		k = p.Field - 1
	}
	rep := p.Repetition
	if rep == 0 && p.Component > 0 {
		rep = 1
	}
	seps := [4]byte{m.d.Field, m.d.Repetition, m.d.Component, m.d.Subcomponent}
	idxs := [4]int{k + 1, rep, p.Component, p.Subcomponent}

	// Find the range [a, e) to replace, and the padding needed when the
	// target does not exist yet.
	a, e := 0, len(b)
	missingAt, have := -1, 0
	for l := 0; l < 4; l++ {
		idx := idxs[l]
		if idx == 0 {
			break
		}
		sep := seps[l]
		if sep == 0 {
			if idx > 1 {
				return ErrNoDelimiter
			}
			continue
		}
		if missingAt >= 0 {
			continue
		}
		for i := 1; i < idx; i++ {
			j := bytes.IndexByte(b[a:e], sep)
			if j < 0 {
				missingAt, have = l, i
				a = e
				break
			}
			a += j + 1
		}
		if missingAt < 0 {
			if j := bytes.IndexByte(b[a:e], sep); j >= 0 {
				e = a + j
			}
		}
	}

	off := len(m.ebuf)
	eb := append(m.ebuf, b[:a]...)
	if missingAt >= 0 {
		for l := missingAt; l < 4 && idxs[l] > 0; l++ {
			n := idxs[l] - 1
			if l == missingAt {
				n = idxs[l] - have
			}
			for ; n > 0; n-- {
				eb = append(eb, seps[l])
			}
		}
	}
	if escape {
		eb = AppendEscaped(eb, []byte(value), m.d)
	} else {
		eb = append(eb, value...)
	}
	eb = append(eb, b[e:]...)
	m.ebuf = eb
	s := &m.segs[seg.i]
	s.start, s.end, s.owned, s.fi, s.nf = uint32(off), uint32(len(eb)), true, -1, 0
	m.indexFields(seg.i)
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
	m.segs = append(m.segs, seg{})
	copy(m.segs[i+1:], m.segs[i:])
	m.segs[i] = seg{start: uint32(off), end: uint32(len(m.ebuf)), fi: -1, owned: true, newTerm: true}
	m.indexFields(i)
	m.edited = true
	return nil
}

// RemoveSegment removes the segment at 0-based position i (not MSH).
func (m *Message) RemoveSegment(i int) error {
	if i < 1 || i >= len(m.segs) {
		return ErrOutOfRange
	}
	m.segs = append(m.segs[:i], m.segs[i+1:]...)
	m.edited = true
	return nil
}
