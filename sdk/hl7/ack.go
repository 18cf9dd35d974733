package hl7

import (
	"strconv"
	"sync/atomic"
	"time"
)

// AckOptions configure [Message.Ack].
type AckOptions struct {
	// Code is MSA-1: AA (default), AE, AR, or in enhanced mode CA, CE, CR.
	Code string
	// Text is MSA-3, the text message; optional, escaped on output.
	Text string
	// Err, when set, adds an ERR segment.
	Err *AckError
	// ControlID is MSH-10 of the acknowledgement; when empty, NewControlID
	// is called.
	ControlID string
	// NewControlID generates control IDs; nil means [NewControlID].
	NewControlID func() string
	// Now gives MSH-7; nil means time.Now.
	Now func() time.Time
}

// AckError describes the ERR segment of an acknowledgement (HL7 v2.5 layout:
// ERR-2 location, ERR-3 code, ERR-4 severity, ERR-7 diagnostic).
type AckError struct {
	Code       int    // HL7 table 0357 code (ERR-3.1); 0 means 207
	Text       string // ERR-3.2; empty means the table 0357 text
	Segment    string // ERR-2.1 segment ID, optional
	Sequence   int    // ERR-2.2 segment sequence, optional
	Field      int    // ERR-2.3 field position, optional
	Severity   string // ERR-4: E (default), W, I or F
	Diagnostic string // ERR-7, optional
}

// AckError returns an ERR description of the parse error.
func (e *ParseError) AckError() *AckError {
	return &AckError{Code: e.Code, Segment: e.Segment, Field: e.Field, Diagnostic: e.Error()}
}

var codeText = map[int]string{
	0: "Message accepted", 100: "Segment sequence error", 101: "Required field missing",
	102: "Data type error", 103: "Table value not found", 104: "Value too long",
	200: "Unsupported message type", 201: "Unsupported event code", 202: "Unsupported processing id",
	203: "Unsupported version id", 204: "Unknown key identifier", 205: "Duplicate key identifier",
	206: "Application record locked", 207: "Application internal error",
}

var ctlSeq atomic.Uint64

// NewControlID returns a new message control ID, unique within the process
// and unlikely to repeat across processes (time based, at most 20 characters).
func NewControlID() string {
	b := make([]byte, 0, 20)
	b = strconv.AppendInt(b, time.Now().UnixMicro(), 36)
	b = append(b, '.')
	b = strconv.AppendUint(b, ctlSeq.Add(1)%(36*36*36*36), 36)
	return string(b)
}

func validAckCode(c string) bool {
	switch c {
	case "AA", "AE", "AR", "CA", "CE", "CR":
		return true
	}
	return false
}

// Ack builds an acknowledgement of m: sending and receiving application and
// facility swapped (MSH-3/4 <-> MSH-5/6), a new control ID in MSH-10, the
// current time in MSH-7, MSH-9 ACK^<trigger>^ACK, MSH-11 and MSH-12 copied
// from m, MSA-1 the code, MSA-2 m's MSH-10, MSA-3 the optional text, and the
// optional ERR segment. Segments end with CR.
//
// The acknowledgement is always a well-formed message that carries every
// text exactly (Parse of it succeeds and each text is its Value):
//
//   - When m declares an escape character, the acknowledgement uses m's own
//     delimiters, and every text (MSA-3, the ERR texts, the control ID, the
//     time) is escaped with them.
//   - When m declares none (MSH-2 shorter than three characters, as in
//     "MSH|^~|"), no text holding a delimiter could be written with m's
//     delimiters: the acknowledgement declares the standard ones, |^~\&,
//     instead. The fields copied from m keep their structure (each of m's
//     delimiters becomes the standard one of the same role) and their text
//     (a character that is a standard delimiter is escaped).
//
// A text that is exactly "" (two double quotes) is written with its first
// quote escaped (\X22\), so that it is not read as the HL7 null.
func (m *Message) Ack(opts AckOptions) (*Message, error) {
	code := opts.Code
	if code == "" {
		code = "AA"
	}
	if !validAckCode(code) {
		return nil, ErrBadAckCode
	}
	h := m.Header()
	if !h.Is("MSH") {
		return nil, ErrNotAMessage
	}
	in := m.d
	d := in // the acknowledgement's delimiters
	if in.Escape == 0 {
		d = DefaultDelimiters
	}
	copyField := func(b, raw []byte) []byte {
		if d == in {
			return append(b, raw...)
		}
		return appendRecoded(b, raw, in, d)
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	ctl := opts.ControlID
	if ctl == "" {
		if opts.NewControlID != nil {
			ctl = opts.NewControlID()
		} else {
			ctl = NewControlID()
		}
	}
	fs := d.Field
	b := make([]byte, 0, 256)
	b = append(b, "MSH"...)
	b = append(b, fs)
	if d == in {
		b = append(b, h.Field(2).Raw()...)
	} else {
		b = append(b, d.Component, d.Repetition, d.Escape, d.Subcomponent)
	}
	for _, f := range [...]int{5, 6, 3, 4} {
		b = append(b, fs)
		b = copyField(b, h.Field(f).Raw())
	}
	b = append(b, fs)
	var ts [32]byte
	b = AppendEscaped(b, now().AppendFormat(ts[:0], "20060102150405-0700"), d) // '+' or '-' may be a delimiter
	b = append(b, fs, fs)
	b = append(b, "ACK"...)
	if trig := h.Field(9).Component(2).Raw(); len(trig) > 0 {
		b = append(b, d.Component)
		b = copyField(b, trig)
		b = append(b, d.Component)
		b = append(b, "ACK"...)
	}
	b = append(b, fs)
	b = appendText(b, ctl, d)
	b = append(b, fs)
	b = copyField(b, h.Field(11).Raw())
	b = append(b, fs)
	b = copyField(b, h.Field(12).Raw())
	b = append(b, '\r')

	b = append(b, "MSA"...)
	b = append(b, fs)
	b = append(b, code...)
	b = append(b, fs)
	b = copyField(b, h.Field(10).Raw())
	if opts.Text != "" {
		b = append(b, fs)
		b = appendText(b, opts.Text, d)
	}
	b = append(b, '\r')

	if e := opts.Err; e != nil {
		b = appendERR(b, e, d)
	}
	return Parse(b)
}

// appendText appends s escaped with d (which has an escape character). The
// text "" would read as the HL7 null, so its first quote is escaped.
func appendText(b []byte, s string, d Delimiters) []byte {
	if s == `""` {
		return append(b, d.Escape, 'X', '2', '2', d.Escape, '"')
	}
	return AppendEscaped(b, []byte(s), d)
}

// appendRecoded appends raw, an element written with the delimiters from
// (which have no escape character, so raw holds no escape sequence), as
// written with to: from's repetition, component and subcomponent
// separators become to's, and any other character that is a delimiter of
// to, or CR or LF, is escaped.
func appendRecoded(b, raw []byte, from, to Delimiters) []byte {
	for i, c := range raw {
		switch {
		case c == 0:
			b = append(b, c)
		case c == from.Repetition:
			b = append(b, to.Repetition)
		case c == from.Component:
			b = append(b, to.Component)
		case c == from.Subcomponent:
			b = append(b, to.Subcomponent)
		default:
			b = AppendEscaped(b, raw[i:i+1], to)
		}
	}
	return b
}

func appendERR(b []byte, e *AckError, d Delimiters) []byte {
	fs, cs := d.Field, d.Component
	c := e.Code
	if c == 0 {
		c = CodeInternal
	}
	text := e.Text
	if text == "" {
		text = codeText[c]
	}
	sev := e.Severity
	if sev == "" {
		sev = "E"
	}
	b = append(b, "ERR"...)
	b = append(b, fs, fs)
	if e.Segment != "" {
		b = appendText(b, e.Segment, d)
		b = append(b, cs)
		if e.Sequence > 0 {
			b = strconv.AppendInt(b, int64(e.Sequence), 10)
		}
		b = append(b, cs)
		if e.Field > 0 {
			b = strconv.AppendInt(b, int64(e.Field), 10)
		}
	}
	b = append(b, fs)
	b = strconv.AppendInt(b, int64(c), 10)
	b = append(b, cs)
	b = appendText(b, text, d)
	b = append(b, cs)
	b = append(b, "HL70357"...)
	b = append(b, fs)
	b = appendText(b, sev, d)
	if e.Diagnostic != "" {
		b = append(b, fs, fs, fs)
		b = appendText(b, e.Diagnostic, d)
	}
	return append(b, '\r')
}

// FrameMLLP returns msg wrapped in MLLP framing (0x0B msg 0x1C 0x0D).
func FrameMLLP(msg []byte) []byte {
	out := make([]byte, 0, len(msg)+3)
	out = append(out, 0x0B)
	out = append(out, msg...)
	return append(out, 0x1C, 0x0D)
}
