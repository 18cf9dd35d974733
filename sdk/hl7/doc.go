// Package hl7 parses, queries, edits and acknowledges HL7 version 2 messages
// in the ER7 ("pipe and hat") encoding, media type x-application/hl7-v2+er7.
//
// The server uses it to validate HL7 input and Go bots (compiled to
// wasip1/wasm) use it through the SDK. It depends on the standard library only.
//
// # Model
//
// [Parse] builds an index over the caller's bytes without copying them: one
// pass records where every segment starts and ends and where its field
// separators are, into two flat slices. Repetitions, components and
// subcomponents are split on demand, and nothing is converted to a string
// until asked. A parsed [Message] can be reused with [Message.Parse] (or
// [Message.Reset]) without allocating. The input must not be modified while
// the Message is in use. Reading a Message never modifies it, so concurrent
// reads are safe; editing needs exclusive access.
//
// Everything is numbered as HL7 numbers it, from 1: fields, repetitions,
// components and subcomponents. Segment occurrences are 1-based too; only
// [Message.SegmentAt] takes a 0-based position in the segment list. In MSH
// (and the FHS/BHS batch headers) field 1 is the field separator itself and
// field 2 the encoding characters, so MSH-3 is the sending application.
//
// Every element has [Element.Raw] (bytes as received, escapes intact) and
// [Element.Value] (escape sequences decoded). The HL7 null, two double quotes
// (""), is reported by [Element.IsNull] and is distinct from an empty or
// absent value ([Element.IsEmpty], [Element.Exists]).
//
// # Paths
//
// [Message.Get] takes a path:
//
//	PID            the first PID segment (Raw is the whole segment)
//	PID-5          field 5 of the first PID, all repetitions
//	PID-5.1        component 1 of the first repetition of PID-5
//	PID-5.1.2      subcomponent 2 of that component
//	PID-3[2]       the second repetition of PID-3
//	PID-3[2].1     component 1 of the second repetition of PID-3
//	OBX(3)-5       field 5 of the third OBX segment
//	MSH-9.2        the trigger event
//
// A dot may be used instead of the dash after the segment name ("PID.5.1"),
// and a segment occurrence may also be written with brackets ("OBX[3]-5").
// [ParsePath] parses a path once for repeated use with [Message.GetPath].
//
// # Input
//
// The delimiters come from MSH-1 and MSH-2 (custom delimiters are honoured;
// a missing subcomponent separator is allowed). Segments may end with CR, LF
// or CRLF, mixed; blank lines between and after segments are kept as part of
// the preceding terminator. A UTF-8 byte order mark and MLLP framing
// (0x0B ... 0x1C 0x0D) are stripped first. [Parse] accepts exactly one message;
// [ParseBatch] accepts batch and file envelopes (FHS/BHS/BTS/FTS) and files of
// several MSH messages back to back. Z-segments are kept like any other.
// Malformed input gives a [*ParseError] carrying the byte offset, line,
// segment, field and an HL7 table 0357 error code. The parser never panics.
//
// # Writing
//
// An unedited message serialises byte-exact to its input (after framing and
// BOM are stripped). [Message.Set] escapes a value and rebuilds only the
// field it touches: an edited segment becomes a list of its fields, the
// unchanged ones still referring to the input, so an edit costs memory in
// proportion to the field it changes, never to the segment (a 1 MiB OBX-5
// is not copied by an edit of OBX-3) and repeated edits of one segment
// allocate linearly. [Message.SetRaw], [Message.AppendSegment],
// [Message.InsertSegment] and [Message.RemoveSegment] edit structure.
// [Escape] and [Unescape] convert between text and ER7 escape sequences.
//
// # Acknowledgements
//
// [Message.Ack] builds an AA/AE/AR (or CA/CE/CR) acknowledgement; see
// [AckOptions]. It is always a well-formed message that carries its texts
// exactly: it uses the input's own delimiters when the input declares an
// escape character, and the standard ones (|^~\&) when it does not, since
// without an escape character a text holding a delimiter cannot be written
// (a diagnostic "a|b" or, with ',' as field separator, any text with a
// comma, would be split into fields). See [Message.Ack] for the details.
package hl7
