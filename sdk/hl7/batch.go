package hl7

import "bytes"

// Batch is a parsed batch or file: the messages of an FHS/BHS/BTS/FTS
// envelope, or several MSH messages back to back (or a single message).
//
// Envelope rules: FHS may only come first; BHS may not open while a batch is
// open (missing BTS); BTS needs an open batch; nothing but blank lines may
// follow FTS; every segment other than FHS/BHS/BTS/FTS must belong to a
// message (come after an MSH). Missing trailers (BTS, FTS) and missing
// headers (BHS, FHS) are tolerated, as are empty batches. Trailer counts
// (BTS-1, FTS-1) are not checked. Violations give a *ParseError with code 100.
type Batch struct {
	// Messages are the messages in input order.
	Messages []*Message

	data  []byte
	first uint32
	env   Message // FHS, BHS, BTS, FTS segments, indexed over data
	parts []batchPart
}

type batchPart struct {
	env bool // env segment index, else message index
	i   int
}

func lineEnd(data []byte, i int) int {
	for j := i; j < len(data); j++ {
		if c := data[j]; c == '\r' || c == '\n' {
			return j
		}
	}
	return len(data)
}

// ParseBatch parses a batch, a file, or several messages back to back; a
// plain message gives a Batch with one message. Each message refers to data.
func ParseBatch(data []byte) (*Batch, error) {
	inner, base, err := stripFraming(data)
	if err != nil {
		return nil, err
	}
	b := &Batch{data: inner}
	b.env.data = inner
	fail := func(off int, reason string) error {
		return &ParseError{Offset: base + off, Line: lineAt(data, base+off), Segment: segName(inner[min(off, len(inner)):]),
			Code: CodeSegmentSequence, Reason: reason}
	}
	n := len(inner)
	i := skipTerm(inner, 0)
	if i >= n {
		return nil, fail(i, "empty input")
	}
	b.first = uint32(i)
	if !isHeaderName(inner[i:]) {
		return nil, fail(i, "input does not start with MSH, BHS or FHS")
	}
	d, field, reason := parseDelimiters(inner[i:])
	if reason != "" {
		e := fail(i+3, reason)
		e.(*ParseError).Field, e.(*ParseError).Code = field, CodeDataType
		return nil, e
	}
	b.env.d = d

	msgStart := -1
	batchOpen, fileClosed := false, false
	closeMsg := func(end int) error {
		if msgStart < 0 {
			return nil
		}
		m := new(Message)
		if err := m.parse(inner[msgStart:end], base+msgStart, data); err != nil {
			return err
		}
		b.parts = append(b.parts, batchPart{i: len(b.Messages)})
		b.Messages = append(b.Messages, m)
		msgStart = -1
		return nil
	}
	addEnv := func(i, e, t int) {
		b.parts = append(b.parts, batchPart{env: true, i: len(b.env.segs)})
		b.env.segs = append(b.env.segs, seg{start: uint32(i), end: uint32(e), tstart: uint32(e), tend: uint32(t), fi: -1})
		b.env.indexFields(len(b.env.segs) - 1)
	}
	for i < n {
		e := lineEnd(inner, i)
		t := skipTerm(inner, e)
		if e-i < 3 || !isSegChar(inner[i]) || !isSegChar(inner[i+1]) || !isSegChar(inner[i+2]) {
			return nil, fail(i, "invalid segment ID")
		}
		name := inner[i : i+3]
		env := isEnvelopeName(name)
		if fileClosed {
			return nil, fail(i, "segment after the file trailer (FTS)")
		}
		if env || bytes.Equal(name, []byte("MSH")) {
			if err := closeMsg(i); err != nil {
				return nil, err
			}
		}
		switch {
		case bytes.Equal(name, []byte("MSH")):
			msgStart = i
			batchOpen = true // an implicit batch when there is no BHS
		case bytes.Equal(name, []byte("FHS")):
			if len(b.parts) > 0 {
				return nil, fail(i, "FHS is not the first segment")
			}
			addEnv(i, e, t)
		case bytes.Equal(name, []byte("BHS")):
			if batchOpen {
				return nil, fail(i, "BHS while a batch is open (missing BTS)")
			}
			batchOpen = true
			addEnv(i, e, t)
		case bytes.Equal(name, []byte("BTS")):
			if !batchOpen {
				return nil, fail(i, "BTS without an open batch")
			}
			batchOpen = false
			addEnv(i, e, t)
		case bytes.Equal(name, []byte("FTS")):
			batchOpen = false
			fileClosed = true
			addEnv(i, e, t)
		default:
			if msgStart < 0 {
				return nil, fail(i, "segment "+string(name)+" outside a message (no MSH before it)")
			}
		}
		i = t
	}
	if err := closeMsg(n); err != nil {
		return nil, err
	}
	return b, nil
}

// Envelope returns the FHS, BHS, BTS and FTS segments in input order.
func (b *Batch) Envelope() []Segment { return b.env.Segments() }

// EnvelopeSegment returns the occurrence-th (1-based) envelope segment named
// name ("FHS", "BHS", "BTS" or "FTS"). Header fields are numbered like MSH.
func (b *Batch) EnvelopeSegment(name string, occurrence int) Segment {
	return b.env.Segment(name, occurrence)
}

// Bytes returns the serialised batch; byte-exact to the input (framing and
// BOM stripped) unless a message was edited.
func (b *Batch) Bytes() []byte {
	for _, m := range b.Messages {
		if m.edited {
			return b.AppendTo(nil)
		}
	}
	return b.data
}

// AppendTo appends the serialised batch to dst.
func (b *Batch) AppendTo(dst []byte) []byte {
	dst = append(dst, b.data[:b.first]...)
	for _, p := range b.parts {
		if p.env {
			s := &b.env.segs[p.i]
			dst = append(dst, b.data[s.start:s.tend]...)
		} else {
			dst = b.Messages[p.i].AppendTo(dst)
		}
	}
	return dst
}
