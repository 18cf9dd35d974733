package hl7

import (
	"bytes"
	"testing"
)

// FuzzParse: Parse and ParseBatch never panic; a parsed message serialises
// byte-exact, reparses to the same structure, and survives an edit.
// Seeded with every corpus file up to 256 KB (the 1.27 MB PDF message is left
// out to keep mutation fast).
func FuzzParse(f *testing.F) {
	for _, c := range loadCorpus(f) {
		if len(c.data) <= 256<<10 {
			f.Add(c.data)
		}
	}
	f.Add([]byte("\x0BMSH|^~\\&|A\rPID|1\x1C\r"))
	f.Add([]byte("MSH^~|\\&^A\r\nPID^1^^x~y|z\r\n"))
	f.Add([]byte("FHS|^~\\&\rBHS|^~\\&\rMSH|^~\\&|1\rPID|1\rBTS|1\rFTS|1\r"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if b, err := ParseBatch(data); err == nil {
			inner, _, _ := stripFraming(data)
			if !bytes.Equal(b.Bytes(), inner) || !bytes.Equal(b.AppendTo(nil), inner) {
				t.Fatalf("batch round trip")
			}
			for _, m := range b.Messages {
				checkMessage(t, m)
			}
		}
		m, err := Parse(data)
		if err != nil {
			pe, ok := err.(*ParseError)
			if !ok {
				t.Fatalf("error %T is not *ParseError", err)
			}
			if m != nil { // the header survived: a negative ACK must be possible
				for i := 0; i < m.NumSegments(); i++ {
					s := m.SegmentAt(i)
					for fi := 0; fi <= s.NumFields(); fi++ {
						_ = s.Field(fi).Value()
					}
				}
				if _, err := m.Ack(AckOptions{Code: "AR", Err: pe.AckError()}); err != nil {
					t.Fatalf("Ack after ParseError: %v", err)
				}
			}
			return
		}
		checkAck(t, m, string(data[:min(len(data), 40)]))
		inner, _, _ := stripFraming(data)
		if !bytes.Equal(m.Bytes(), inner) {
			t.Fatalf("round trip")
		}
		checkMessage(t, m)
	})
}

func checkMessage(t *testing.T, m *Message) {
	out := m.Bytes()
	m.edited = true
	rebuilt := m.AppendTo(nil)
	m.edited = false
	if !bytes.Equal(rebuilt, out) {
		t.Fatalf("rebuilt serialisation differs:\n%q\n%q", rebuilt, out)
	}
	m2, err := Parse(out)
	if err != nil {
		t.Fatalf("reparse: %v", err)
	}
	if !bytes.Equal(m2.Bytes(), out) || m2.NumSegments() != m.NumSegments() {
		t.Fatalf("unstable")
	}
	for i := 0; i < m.NumSegments(); i++ {
		s1, s2 := m.SegmentAt(i), m2.SegmentAt(i)
		if s1.NumFields() != s2.NumFields() {
			t.Fatalf("segment %d: fields", i)
		}
		for fi := 0; fi <= s1.NumFields(); fi++ {
			f1, f2 := s1.Field(fi), s2.Field(fi)
			if !bytes.Equal(f1.Raw(), f2.Raw()) {
				t.Fatalf("segment %d field %d differs", i, fi)
			}
			_ = f1.Value()
			_ = f1.Repetition(2).Component(2).Subcomponent(2).Value()
		}
	}
	// Edit, serialise, reparse.
	const v = "a|b^c~d\\e&f\r\nx"
	if err := m2.Set("MSH-10", v); err == nil {
		m3, err := Parse(m2.Bytes())
		if err != nil {
			t.Fatalf("reparse after edit: %v\n%q", err, m2.Bytes())
		}
		if got := m3.Value("MSH-10"); got != v {
			t.Fatalf("MSH-10 = %q after Set", got)
		}
		if m3.NumSegments() != m.NumSegments() {
			t.Fatalf("segments changed by edit")
		}
	}
	if m2.NumSegments() > 1 {
		if err := m2.SetRaw("MSH-4.2", "x&y"); err == nil {
			if _, err := Parse(m2.Bytes()); err != nil {
				t.Fatalf("reparse after SetRaw: %v", err)
			}
		}
	}
}

// FuzzUnescape: Unescape never panics and inverts Escape.
func FuzzUnescape(f *testing.F) {
	for _, s := range []string{`a\F\b`, `\X0D0A\`, `\.sp 5\`, `\.sk\`, `\C2842\`, `\H\x\N\`, "a|b^c", "\r\n", `\`, `\\\`} {
		f.Add(s)
	}
	delims := []Delimiters{DefaultDelimiters, {'#', '*', '+', '!', '%'}, {'|', '^', '~', '\\', 0}}
	f.Fuzz(func(t *testing.T, s string) {
		for _, d := range delims {
			_ = Unescape(s, d)
			e := Escape(s, d)
			if got := Unescape(e, d); got != s {
				t.Fatalf("Unescape(Escape(%q)) = %q via %q", s, got, e)
			}
			for i := 0; i < len(e); i++ {
				c := e[i]
				if c == '\r' || c == '\n' || (c != 0 && (c == d.Field || c == d.Component || c == d.Repetition || c == d.Subcomponent)) {
					t.Fatalf("Escape(%q) = %q still holds a delimiter", s, e)
				}
			}
		}
	})
}
