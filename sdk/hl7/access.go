package hl7

import "bytes"

// Element levels.
const (
	levelNone uint8 = iota
	levelSegment
	levelField
	levelRepetition
	levelComponent
	levelSubcomponent
)

// Element is a value at any level of a message: a segment, field,
// repetition, component or subcomponent. The zero Element does not exist and
// is empty. Elements are small values that refer to the message's bytes.
type Element struct {
	raw    []byte
	d      Delimiters
	level  uint8
	exists bool
	atomic bool // MSH-1 and MSH-2: never split, never unescaped
}

// Exists reports whether the element is present in the message (an empty
// field between two separators exists; a field past the last one does not).
func (e Element) Exists() bool { return e.exists }

// Raw returns the element's bytes as received, escape sequences and
// delimiters included. It refers to the message's memory: do not modify it.
func (e Element) Raw() []byte { return e.raw }

// String returns the raw text (see [Element.Raw]) as a string.
func (e Element) String() string { return string(e.raw) }

// IsNull reports whether the element is the HL7 null value "" (two double
// quotes), which means "delete the value" rather than "no value".
func (e Element) IsNull() bool {
	return len(e.raw) == 2 && e.raw[0] == '"' && e.raw[1] == '"'
}

// IsEmpty reports whether the element has no bytes (absent or empty). The
// HL7 null "" is not empty.
func (e Element) IsEmpty() bool { return len(e.raw) == 0 }

// Value returns the text with escape sequences decoded (see [Unescape]).
// The HL7 null "" gives "" (use [Element.IsNull] to tell it from empty).
// Value is meant for leaves (a component or subcomponent, or a field
// without components): in a composite element the structural delimiters are
// left as they are, and could not be told from decoded \S\ and the like.
func (e Element) Value() string {
	if len(e.raw) == 0 || e.IsNull() {
		return ""
	}
	if e.atomic || e.d.Escape == 0 || bytes.IndexByte(e.raw, e.d.Escape) < 0 {
		return string(e.raw)
	}
	return string(AppendUnescaped(nil, e.raw, e.d))
}

// AppendValue appends [Element.Value] to dst.
func (e Element) AppendValue(dst []byte) []byte {
	if e.IsNull() {
		return dst
	}
	if e.atomic {
		return append(dst, e.raw...)
	}
	return AppendUnescaped(dst, e.raw, e.d)
}

// piece returns the idx-th (1-based) part of e split by sep.
func (e Element) piece(sep byte, idx int, level uint8) Element {
	out := Element{d: e.d, level: level}
	if !e.exists || idx < 1 {
		return out
	}
	if e.atomic || sep == 0 {
		if idx == 1 {
			out.raw, out.exists, out.atomic = e.raw, true, e.atomic
		}
		return out
	}
	b := e.raw
	for i := 1; i < idx; i++ {
		j := bytes.IndexByte(b, sep)
		if j < 0 {
			return out
		}
		b = b[j+1:]
	}
	if j := bytes.IndexByte(b, sep); j >= 0 {
		b = b[:j]
	}
	out.raw, out.exists = b, true
	return out
}

func (e Element) count(sep byte) int {
	if !e.exists || len(e.raw) == 0 {
		return 0
	}
	if e.atomic || sep == 0 {
		return 1
	}
	return bytes.Count(e.raw, []byte{sep}) + 1
}

// Field is a field of a segment (all its repetitions).
type Field struct{ Element }

// Repetition is one repetition of a field.
type Repetition struct{ Element }

// Component is a component of a repetition.
type Component struct{ Element }

// Subcomponent is a subcomponent of a component.
type Subcomponent struct{ Element }

// Repetition returns repetition r (1-based).
func (f Field) Repetition(r int) Repetition {
	return Repetition{f.piece(f.d.Repetition, r, levelRepetition)}
}

// NumRepetitions returns the number of repetitions (0 for an empty field).
func (f Field) NumRepetitions() int { return f.count(f.d.Repetition) }

// Component returns component c (1-based) of the first repetition.
func (f Field) Component(c int) Component { return f.Repetition(1).Component(c) }

// Component returns component c (1-based).
func (r Repetition) Component(c int) Component {
	return Component{r.piece(r.d.Component, c, levelComponent)}
}

// NumComponents returns the number of components (0 when empty).
func (r Repetition) NumComponents() int { return r.count(r.d.Component) }

// Subcomponent returns subcomponent s (1-based).
func (c Component) Subcomponent(s int) Subcomponent {
	return Subcomponent{c.piece(c.d.Subcomponent, s, levelSubcomponent)}
}

// NumSubcomponents returns the number of subcomponents (0 when empty).
func (c Component) NumSubcomponents() int { return c.count(c.d.Subcomponent) }

// Segment is one segment of a message. The zero Segment does not exist.
type Segment struct {
	m *Message
	i int
}

// Exists reports whether the segment is present.
func (s Segment) Exists() bool { return s.m != nil && s.i >= 0 && s.i < len(s.m.segs) }

// Index returns the segment's 0-based position in the message.
func (s Segment) Index() int { return s.i }

// Raw returns the segment's bytes, terminator excluded. For an edited
// segment they are assembled anew on every call.
func (s Segment) Raw() []byte {
	if !s.Exists() {
		return nil
	}
	return s.m.segBytes(s.i)
}

// name returns the segment ID's bytes (nil when the segment does not exist).
func (s Segment) name() []byte {
	if !s.Exists() {
		return nil
	}
	return s.m.segName(s.i)
}

// Name returns the segment ID, such as "PID".
func (s Segment) Name() string {
	b := s.name()
	if len(b) < 3 {
		return ""
	}
	return string(b)
}

// Is reports whether the segment ID is name, without allocating.
func (s Segment) Is(name string) bool {
	b := s.name()
	return len(b) >= 3 && len(name) == 3 && b[0] == name[0] && b[1] == name[1] && b[2] == name[2]
}

func (s Segment) header() bool { return isHeaderName(s.name()) }

// NumFields returns the number of fields after the segment ID. For MSH this
// counts MSH-1, the field separator.
func (s Segment) NumFields() int {
	if !s.Exists() {
		return 0
	}
	n := s.m.numSeps(s.i)
	if s.header() {
		n++
	}
	return n
}

// singleBytes holds every byte value once, so that MSH-1 of an edited
// header can refer to its field separator without allocating.
var singleBytes = func() (b [256]byte) {
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// Field returns field n (HL7-numbered: 1 is the first field after the
// segment ID; in MSH, 1 is the field separator and 2 the encoding
// characters). Field(0) is the segment ID.
func (s Segment) Field(n int) Field {
	out := Field{Element{level: levelField}}
	if !s.Exists() || n < 0 {
		return out
	}
	m := s.m
	out.d = m.d
	nf := m.numSeps(s.i)
	k := n // piece index
	if s.header() && n >= 1 {
		if n == 1 {
			if nf > 0 {
				fs := m.d.Field
				out.raw, out.exists, out.atomic = singleBytes[fs:fs+1], true, true
			}
			return out
		}
		k = n - 1
		if k == 1 {
			out.atomic = true
		}
	}
	if k > nf {
		return out
	}
	out.raw, out.exists = m.piece(s.i, k), true
	return out
}

// Segment returns the occurrence-th (1-based) segment named name.
func (m *Message) Segment(name string, occurrence int) Segment {
	if len(name) != 3 || occurrence < 1 {
		return Segment{}
	}
	for i := range m.segs {
		b := m.segName(i)
		if len(b) == 3 && b[0] == name[0] && b[1] == name[1] && b[2] == name[2] {
			occurrence--
			if occurrence == 0 {
				return Segment{m, i}
			}
		}
	}
	return Segment{}
}

// SegmentAt returns the segment at 0-based position i.
func (m *Message) SegmentAt(i int) Segment {
	if i < 0 || i >= len(m.segs) {
		return Segment{}
	}
	return Segment{m, i}
}

// Segments returns all segments in order.
func (m *Message) Segments() []Segment {
	out := make([]Segment, len(m.segs))
	for i := range out {
		out[i] = Segment{m, i}
	}
	return out
}

// Count returns the number of segments named name.
func (m *Message) Count(name string) int {
	n := 0
	for i := range m.segs {
		if (Segment{m, i}).Is(name) {
			n++
		}
	}
	return n
}

// Get returns the element at path (see the package documentation for the
// syntax). An invalid path or a missing element gives an Element that does
// not exist.
func (m *Message) Get(path string) Element {
	p, err := ParsePath(path)
	if err != nil {
		return Element{}
	}
	return m.GetPath(p)
}

// GetPath returns the element at a parsed path.
func (m *Message) GetPath(p Path) Element {
	s := m.Segment(p.Segment, max(p.Occurrence, 1))
	if !s.Exists() {
		return Element{}
	}
	if p.Field == 0 {
		return Element{raw: s.Raw(), d: m.d, level: levelSegment, exists: true, atomic: true}
	}
	f := s.Field(p.Field)
	if p.Repetition == 0 && p.Component == 0 {
		return f.Element
	}
	r := f.Repetition(max(p.Repetition, 1))
	if p.Component == 0 {
		return r.Element
	}
	c := r.Component(p.Component)
	if p.Subcomponent == 0 {
		return c.Element
	}
	return c.Subcomponent(p.Subcomponent).Element
}

// Value returns the unescaped value at path; "" if absent.
func (m *Message) Value(path string) string { return m.Get(path).Value() }

// Header returns the MSH segment.
func (m *Message) Header() Segment { return m.SegmentAt(0) }

// Type returns the message type, MSH-9.1 (e.g. "ADT").
func (m *Message) Type() string { return m.Header().Field(9).Component(1).Value() }

// Trigger returns the trigger event, MSH-9.2 (e.g. "A01").
func (m *Message) Trigger() string { return m.Header().Field(9).Component(2).Value() }

// ControlID returns the message control ID, MSH-10.
func (m *Message) ControlID() string { return m.Header().Field(10).Value() }

// Version returns the version ID, MSH-12.1 (e.g. "2.5.1").
func (m *Message) Version() string { return m.Header().Field(12).Component(1).Value() }
