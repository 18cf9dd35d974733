package hl7

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// sameElement reports whether two fields hold the same repetitions,
// components and subcomponents with the same values, whatever delimiters
// each message uses.
func sameElement(a, b Field) bool {
	if a.NumRepetitions() != b.NumRepetitions() {
		return false
	}
	for r := 1; r <= a.NumRepetitions(); r++ {
		ra, rb := a.Repetition(r), b.Repetition(r)
		if ra.NumComponents() != rb.NumComponents() {
			return false
		}
		for c := 1; c <= ra.NumComponents(); c++ {
			ca, cb := ra.Component(c), rb.Component(c)
			if ca.NumSubcomponents() != cb.NumSubcomponents() {
				return false
			}
			for s := 1; s <= ca.NumSubcomponents(); s++ {
				if ca.Subcomponent(s).Value() != cb.Subcomponent(s).Value() {
					return false
				}
			}
		}
	}
	return true
}

// checkAck builds a negative acknowledgement of m carrying text everywhere a
// text goes, and checks the ACK rule of Message.Ack: the result parses, each
// text is its Value exactly, and the fields taken from m are m's.
func checkAck(t *testing.T, m *Message, text string) {
	t.Helper()
	ack, err := m.Ack(AckOptions{Code: "AE", Text: text, ControlID: text,
		Err: &AckError{Code: CodeDataType, Text: text, Segment: "PID", Field: 3, Diagnostic: text}})
	if text == "" {
		ack, err = m.Ack(AckOptions{Code: "AE", Err: &AckError{Code: CodeDataType, Segment: "PID", Field: 3}})
	}
	if err != nil {
		t.Fatalf("Ack(%q) of %q: %v", text, m.Bytes(), err)
	}
	out := ack.Bytes()
	again, err := Parse(out)
	if err != nil || again.NumSegments() != 3 || !again.Header().Is("MSH") || !again.SegmentAt(1).Is("MSA") || !again.SegmentAt(2).Is("ERR") {
		t.Fatalf("ACK of %q with text %q is not three segments MSH, MSA, ERR: %q (%v)", m.Bytes(), text, out, err)
	}
	if m.Delimiters().Escape != 0 && again.Delimiters() != m.Delimiters() {
		t.Fatalf("ACK of %q: delimiters %+v, want the message's own", m.Bytes(), again.Delimiters())
	}
	if m.Delimiters().Escape == 0 && again.Delimiters() != DefaultDelimiters {
		t.Fatalf("ACK of %q (no escape character): delimiters %+v, want the standard ones", m.Bytes(), again.Delimiters())
	}
	if text != "" {
		for _, p := range []string{"MSA-3", "ERR-7", "ERR-3.2", "MSH-10"} {
			if got := again.Value(p); got != text {
				t.Fatalf("ACK of %q: %s = %q, want %q\n%q", m.Bytes(), p, got, text, out)
			}
		}
	}
	if again.Value("MSA-1") != "AE" || again.Value("ERR-3.1") != "102" || again.Value("ERR-2.1") != "PID" {
		t.Fatalf("ACK of %q: MSA-1/ERR-3/ERR-2 wrong: %q", m.Bytes(), out)
	}
	h, ah := m.Header(), again.Header()
	for _, pair := range [][2]int{{3, 5}, {4, 6}, {5, 3}, {6, 4}, {11, 11}, {12, 12}} {
		if !sameElement(ah.Field(pair[0]), h.Field(pair[1])) {
			t.Fatalf("ACK of %q: MSH-%d %q is not the message's MSH-%d %q", m.Bytes(), pair[0], ah.Field(pair[0]).Raw(), pair[1], h.Field(pair[1]).Raw())
		}
	}
	if !sameElement(again.SegmentAt(1).Field(2), h.Field(10)) {
		t.Fatalf("ACK of %q: MSA-2 %q is not the message's MSH-10", m.Bytes(), again.Get("MSA-2").Raw())
	}
}

// TestAckRule: the two cases the rule exists for, then the property over
// generated headers and texts.
func TestAckRule(t *testing.T) {
	// No escape character: the ACK declares the standard delimiters, so
	// a text with | is escaped, where it used to end the field (MSA|AE||a|b).
	m := mustParse(t, "MSH|^~|A\r")
	ack, err := m.Ack(AckOptions{Code: "AE", Text: "a|b", ControlID: "1", Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	if want := "MSH|^~\\&|||A||20240506070809-0500||ACK|1||\rMSA|AE||a\\F\\b\r"; ack.String() != want {
		t.Errorf("ack:\n%q\nwant\n%q", ack.String(), want)
	}
	// ',' as field separator and no escape character: the diagnostic is
	// one field, not split at every comma; the copied fields keep their
	// components and their literal '|'.
	m = mustParse(t, "MSH,^~,S|1^X,F1,R1,F2,,,ORU^R01,CTL^9,P,2.5\r")
	ack, err = m.Ack(AckOptions{Code: "AR", ControlID: "2", Now: fixedNow,
		Err: &AckError{Code: CodeDataType, Diagnostic: "bad value, field 3, segment PID"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "MSH|^~\\&|R1|F2|S\\F\\1^X|F1|20240506070809-0500||ACK^R01^ACK|2|P|2.5\rMSA|AR|CTL^9\r" +
		"ERR|||102^Data type error^HL70357|E|||bad value, field 3, segment PID\r"
	if ack.String() != want {
		t.Errorf("ack:\n%q\nwant\n%q", ack.String(), want)
	}
	// The text "" is not the HL7 null.
	m = mustParse(t, adt)
	if ack, err := m.Ack(AckOptions{Code: "AE", Text: `""`}); err != nil || ack.Value("MSA-3") != `""` || ack.Get("MSA-3").IsNull() {
		t.Errorf(`text "": %q %v`, ack.Get("MSA-3").Raw(), err)
	}
	// A time zone sign that is a delimiter is escaped.
	m = mustParse(t, "MSH-^~\\&-A\r")
	if ack, err := m.Ack(AckOptions{Now: fixedNow, ControlID: "3"}); err != nil || ack.Value("MSH-7") != "20240506070809-0500" {
		t.Errorf("'-' separator: %q %v", ack.Bytes(), err)
	}

	for _, f := range loadCorpus(t) {
		if b, err := ParseBatch(f.data); err == nil {
			for _, m := range b.Messages {
				checkAck(t, m, "x|y^z~w\\v&u,")
			}
		}
	}

	rng := rand.New(rand.NewPCG(9, 9))
	const alphabet = "|^~\\&#,!%*+-.:;/\"\r\nabcXYZ 0129\x00\xff"
	randText := func(n int) string {
		var sb strings.Builder
		for range n {
			sb.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return sb.String()
	}
	delims := []byte("|^~\\&#,!%*+-.:;/")
	tried := 0
	for tried < 3000 {
		// A header with 1-5 encoding characters and fields full of them.
		rng.Shuffle(len(delims), func(i, j int) { delims[i], delims[j] = delims[j], delims[i] })
		enc := string(delims[1 : 1+1+rng.IntN(5)])
		fs := string(delims[0])
		fields := make([]string, 11)
		for i := range fields {
			fields[i] = strings.NewReplacer("\r", "", "\n", "", fs, "").Replace(randText(rng.IntN(8)))
		}
		m, err := Parse([]byte("MSH" + fs + enc + fs + strings.Join(fields, fs) + "\r"))
		if err != nil {
			continue
		}
		tried++
		checkAck(t, m, randText(rng.IntN(24)))
	}
}

// FuzzAck: for any message header and any text, the acknowledgement parses
// and carries the text exactly (TestAckRule's property).
func FuzzAck(f *testing.F) {
	f.Add([]byte("MSH|^~|A\r"), "a|b")
	f.Add([]byte("MSH,^~,S|1^X,F1,R1,F2,,,ORU^R01,CTL^9,P,2.5\r"), "bad value, field 3")
	f.Add([]byte("MSH|^~\\&|A|B|C|D|2024||ADT^A01|X1|P|2.5\r"), `""`)
	f.Add([]byte("MSH#*+!%#S1#F1#R1#F2#2024##ORM*O01#ID9#T#2.3\r"), "no#way\r\n")
	f.Fuzz(func(t *testing.T, header []byte, text string) {
		m, err := Parse(header)
		if m == nil {
			return
		}
		_ = err // a message with a bad segment after MSH is still acknowledged
		checkAck(t, m, text)
	})
}
