package hl7

import (
	"errors"
	"strconv"
)

// HL7 error codes from HL7 table 0357 (message error condition codes) used in
// [ParseError.Code] and in ERR segments.
const (
	CodeAccepted          = 0   // message accepted
	CodeSegmentSequence   = 100 // segment sequence error
	CodeRequiredMissing   = 101 // required field missing
	CodeDataType          = 102 // data type error
	CodeTableValue        = 103 // table value not found
	CodeUnsupportedType   = 200 // unsupported message type
	CodeUnsupportedEvent  = 201 // unsupported event code
	CodeUnsupportedProcID = 202 // unsupported processing id
	CodeUnsupportedVer    = 203 // unsupported version id
	CodeInternal          = 207 // application internal error
)

// ParseError describes malformed HL7 input.
type ParseError struct {
	Offset  int    // byte offset in the input as passed in (BOM and MLLP framing included)
	Line    int    // 1-based line (CR, LF and CRLF each end a line)
	Segment string // segment ID where the error was found, "" if unknown
	Field   int    // HL7 field number, 0 for the segment as a whole
	Code    int    // HL7 table 0357 error code
	Reason  string // what is wrong
}

// Error names the position, the segment, the field and the HL7 code.
func (e *ParseError) Error() string {
	b := make([]byte, 0, 96)
	b = append(b, "hl7: "...)
	b = append(b, e.Reason...)
	b = append(b, " (line "...)
	b = strconv.AppendInt(b, int64(e.Line), 10)
	b = append(b, ", offset "...)
	b = strconv.AppendInt(b, int64(e.Offset), 10)
	if e.Segment != "" {
		b = append(b, ", segment "...)
		b = append(b, e.Segment...)
		b = append(b, ", field "...)
		b = strconv.AppendInt(b, int64(e.Field), 10)
	}
	b = append(b, ", HL7 error "...)
	b = strconv.AppendInt(b, int64(e.Code), 10)
	b = append(b, ')')
	return string(b)
}

// Errors returned by path access and editing.
var (
	ErrBadPath     = errors.New("hl7: invalid path")
	ErrNoSegment   = errors.New("hl7: no such segment")
	ErrReadOnly    = errors.New("hl7: MSH-1 and MSH-2 (delimiters) cannot be set")
	ErrBadSegment  = errors.New("hl7: invalid segment")
	ErrNoDelimiter = errors.New("hl7: the message has no such delimiter")
	ErrBadRaw      = errors.New("hl7: raw value contains a terminator or a higher-level delimiter")
	ErrBadAckCode  = errors.New("hl7: acknowledgement code must be AA, AE, AR, CA, CE or CR")
	ErrOutOfRange  = errors.New("hl7: segment index out of range")
	ErrNotAMessage = errors.New("hl7: no message header")
)

// lineAt returns the 1-based line number of offset off in data.
func lineAt(data []byte, off int) int {
	if off > len(data) {
		off = len(data)
	}
	line := 1
	for i := 0; i < off; i++ {
		switch data[i] {
		case '\n':
			line++
		case '\r':
			if i+1 < len(data) && data[i+1] == '\n' {
				continue // the LF of CRLF ends the line
			}
			line++
		}
	}
	return line
}

// segName returns a printable segment ID for an error message.
func segName(b []byte) string {
	n := 0
	for n < len(b) && n < 3 && b[n] > ' ' && b[n] < 0x7f {
		n++
	}
	return string(b[:n])
}
