package hl7

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

const adt = "MSH|^~\\&|SENDAPP|SENDFAC|RECVAPP|RECVFAC|20240102030405||ADT^A01^ADT_A01|CTRL123|P|2.5.1\r" +
	"EVN|A01|20240102030405\r" +
	"PID|1||111^^^HOSP^MR~222^^^STATE^SS||DOE&VAN^JOHN^Q||19700101|M|||1 Main St^^Town^ST^12345||\"\"|\r" +
	"OBX|1|ST|A^first||one\r" +
	"OBX|2|ST|B^second||two\\S\\half\r" +
	"OBX|3|FT|C^third||line1\\.br\\line2\r" +
	"ZPD|custom|x^y\r"

func mustParse(t *testing.T, s string) *Message {
	t.Helper()
	m, err := Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return m
}

func TestPaths(t *testing.T) {
	m := mustParse(t, adt)
	cases := []struct{ path, raw string }{
		{"MSH-1", "|"},
		{"MSH-2", "^~\\&"},
		{"MSH-3", "SENDAPP"},
		{"MSH-9", "ADT^A01^ADT_A01"},
		{"MSH-9.2", "A01"},
		{"MSH.9.3", "ADT_A01"},
		{"MSH-10", "CTRL123"},
		{"MSH-12", "2.5.1"},
		{"PID-3", "111^^^HOSP^MR~222^^^STATE^SS"},
		{"PID-3.1", "111"},
		{"PID-3[1].4", "HOSP"},
		{"PID-3[2]", "222^^^STATE^SS"},
		{"PID-3[2].1", "222"},
		{"PID-3(2).5", "SS"},
		{"PID-3[3]", ""},
		{"PID-5", "DOE&VAN^JOHN^Q"},
		{"PID-5.1", "DOE&VAN"},
		{"PID-5.1.1", "DOE"},
		{"PID-5.1.2", "VAN"},
		{"PID-5.2", "JOHN"},
		{"PID-5.2.1", "JOHN"},
		{"PID-5.4", ""},
		{"OBX-5", "one"},
		{"OBX(2)-5", "two\\S\\half"},
		{"OBX[3]-3.2", "third"},
		{"OBX(4)-5", ""},
		{"ZPD-2.2", "y"},
		{"ZPD", "ZPD|custom|x^y"},
		{"NK1-1", ""},
	}
	for _, c := range cases {
		if got := m.Get(c.path).String(); got != c.raw {
			t.Errorf("Get(%q) = %q, want %q", c.path, got, c.raw)
		}
	}
	if m.Get("OBX(4)-5").Exists() || m.Get("PID-99").Exists() || m.Get("NK1").Exists() {
		t.Error("missing elements exist")
	}
	if !m.Get("PID-2").Exists() || !m.Get("PID-2").IsEmpty() {
		t.Error("PID-2 should exist and be empty")
	}
	for _, bad := range []string{"", "PI", "pid-1", "PID-", "PID-0x", "PID-1.", "PID-1[0]", "PID(0)", "PID-1.2.3.4", "PID-1[2", "PID 1"} {
		if _, err := ParsePath(bad); err == nil {
			t.Errorf("ParsePath(%q) succeeded", bad)
		}
	}
	p, err := ParsePath("OBX(3)-5[2].1.2")
	if err != nil || p != (Path{"OBX", 3, 5, 2, 1, 2}) || p.String() != "OBX(3)-5[2].1.2" {
		t.Errorf("ParsePath: %+v %v %s", p, err, p.String())
	}
}

func TestTypedAPI(t *testing.T) {
	m := mustParse(t, adt)
	if m.NumSegments() != 7 || m.Count("OBX") != 3 {
		t.Fatalf("segments %d, OBX %d", m.NumSegments(), m.Count("OBX"))
	}
	pid := m.Segment("PID", 1)
	if pid.Name() != "PID" || pid.Index() != 2 || !pid.Is("PID") {
		t.Error("PID segment")
	}
	f := pid.Field(3)
	if f.NumRepetitions() != 2 || f.Repetition(2).NumComponents() != 5 {
		t.Errorf("reps %d comps %d", f.NumRepetitions(), f.Repetition(2).NumComponents())
	}
	if got := f.Repetition(2).Component(4).Value(); got != "STATE" {
		t.Errorf("PID-3[2].4 = %q", got)
	}
	if got := pid.Field(5).Component(1).Subcomponent(2).Value(); got != "VAN" {
		t.Errorf("PID-5.1.2 = %q", got)
	}
	if n := pid.Field(5).Component(1).NumSubcomponents(); n != 2 {
		t.Errorf("subcomponents %d", n)
	}
	if n := pid.NumFields(); n != 14 {
		t.Errorf("PID fields %d", n)
	}
	msh := m.Header()
	if n := msh.NumFields(); n != 12 {
		t.Errorf("MSH fields %d", n)
	}
	if m.Type() != "ADT" || m.Trigger() != "A01" || m.ControlID() != "CTRL123" || m.Version() != "2.5.1" {
		t.Error("header helpers")
	}
	if m.Delimiters() != DefaultDelimiters {
		t.Error("delimiters")
	}
	if got := len(m.Segments()); got != 7 {
		t.Error("Segments")
	}
	if m.SegmentAt(7).Exists() || m.SegmentAt(-1).Exists() || m.Segment("OBX", 4).Exists() {
		t.Error("out of range segment exists")
	}
}

func TestMSHNumbering(t *testing.T) {
	m := mustParse(t, adt)
	h := m.Header()
	if h.Field(1).String() != "|" || h.Field(2).String() != "^~\\&" || h.Field(3).String() != "SENDAPP" {
		t.Error("MSH-1..3")
	}
	// MSH-1 and MSH-2 are atomic: not split, not unescaped.
	if h.Field(2).Value() != "^~\\&" || h.Field(2).NumRepetitions() != 1 || h.Field(2).Component(1).String() != "^~\\&" {
		t.Error("MSH-2 atomic")
	}
	if h.Field(2).Component(2).Exists() {
		t.Error("MSH-2.2 exists")
	}
	if h.Field(0).String() != "MSH" {
		t.Error("MSH-0")
	}
}

func TestNullVersusEmpty(t *testing.T) {
	m := mustParse(t, adt)
	null := m.Get("PID-13")
	if !null.IsNull() || null.IsEmpty() || null.Value() != "" || null.String() != `""` || !null.Exists() {
		t.Errorf("PID-13 null: %+v", null)
	}
	empty := m.Get("PID-12")
	if empty.IsNull() || !empty.IsEmpty() || !empty.Exists() {
		t.Error("PID-12 empty")
	}
	absent := m.Get("PID-30")
	if absent.IsNull() || !absent.IsEmpty() || absent.Exists() {
		t.Error("PID-30 absent")
	}
	if got := string(null.AppendValue([]byte("x"))); got != "x" {
		t.Errorf("AppendValue(null) = %q", got)
	}
}

func TestValueUnescapes(t *testing.T) {
	m := mustParse(t, adt)
	if got := m.Value("OBX(2)-5"); got != "two^half" {
		t.Errorf("OBX(2)-5 = %q", got)
	}
	if got := m.Value("OBX(3)-5"); got != "line1\nline2" {
		t.Errorf("OBX(3)-5 = %q", got)
	}
	if got := m.Get("OBX(2)-5").String(); got != "two\\S\\half" {
		t.Errorf("raw = %q", got)
	}
}

func TestCustomDelimiters(t *testing.T) {
	// From hapi/segmentfinder_a24.hl7: field ^, component ~, repetition |.
	in := "MSH^~|\\&^SEND^200M^RECV^200^20120918173931-0500^^ADT~A24^2003582144^T^2.4\r\n" +
		"PID^1^^11111~~~FOO&&0363~NI|22222~~~BAR^^SMITH~JOHN\r\n"
	m := mustParse(t, in)
	d := m.Delimiters()
	if d != (Delimiters{'^', '~', '|', '\\', '&'}) {
		t.Fatalf("delimiters %q", []byte{d.Field, d.Component, d.Repetition, d.Escape, d.Subcomponent})
	}
	if m.Get("MSH-1").String() != "^" || m.Get("MSH-2").String() != "~|\\&" || m.Trigger() != "A24" {
		t.Error("MSH")
	}
	if got := m.Get("PID-3[2].4").String(); got != "BAR" {
		t.Errorf("PID-3[2].4 = %q", got)
	}
	if got := m.Get("PID-3.4.3").String(); got != "0363" {
		t.Errorf("PID-3.4.3 = %q", got)
	}
	if got := m.Get("PID-5.2").Value(); got != "JOHN" {
		t.Errorf("PID-5.2 = %q", got)
	}
	if err := m.Set("PID-5.1", "A^B~C"); err != nil {
		t.Fatal(err)
	}
	if got := m.Get("PID-5.1").String(); got != `A\F\B\S\C` {
		t.Errorf("escaped = %q", got)
	}
	if got := m.Value("PID-5.1"); got != "A^B~C" {
		t.Errorf("round trip = %q", got)
	}

	// Three encoding characters: no subcomponent separator.
	m = mustParse(t, "MSH|^~}|A|B\rPID|1||x&y^z\r")
	if m.Delimiters().Subcomponent != 0 || m.Get("PID-3.1").String() != "x&y" || m.Get("PID-3.1.1").String() != "x&y" {
		t.Error("3 encoding characters")
	}
	if m.Get("PID-3.1.2").Exists() {
		t.Error("no subcomponents without a separator")
	}
	if m.Value("PID-3.2") != "z" || Unescape("}F}", m.Delimiters()) != "|" {
		t.Error("custom escape")
	}
	if err := m.Set("PID-3.1.2", "v"); !errors.Is(err, ErrNoDelimiter) {
		t.Errorf("Set sub without separator: %v", err)
	}
}

func TestTerminators(t *testing.T) {
	segs := []string{"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5", "PID|1||X", "OBX|1|ST|||v"}
	for _, term := range []string{"\r", "\n", "\r\n"} {
		for _, trailer := range []string{"", term, term + term + "  " + term} {
			in := strings.Join(segs, term) + trailer
			m := mustParse(t, in)
			if m.NumSegments() != 3 || m.Get("OBX-5").String() != "v" || m.Get("PID-3").String() != "X" {
				t.Errorf("%q: %d segments", in, m.NumSegments())
			}
			if string(m.Bytes()) != in {
				t.Errorf("%q: round trip", in)
			}
			// An added segment uses the message's terminator.
			if err := m.AppendSegment("ZZZ|1"); err != nil {
				t.Fatal(err)
			}
			want := strings.Join(append(segs, "ZZZ|1"), term) + term
			if trailer != "" {
				want = strings.Join(segs, term) + trailer + "ZZZ|1" + term
			}
			if got := m.String(); got != want {
				t.Errorf("%q: after append %q, want %q", in, got, want)
			}
		}
	}
	// Mixed terminators and blank lines.
	in := "MSH|^~\\&|A\r\nPID|1\n\nOBX|1\r\r\rNTE|1\n"
	m := mustParse(t, in)
	if m.NumSegments() != 4 || string(m.Bytes()) != in {
		t.Errorf("mixed: %d", m.NumSegments())
	}
}

func TestBOMAndMLLP(t *testing.T) {
	body := "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1\r"
	for _, in := range []string{
		"\xEF\xBB\xBF" + body,
		"\x0B" + body + "\x1C\x0D",
		"\x0B" + body + "\x1C",
		"\x0B\xEF\xBB\xBF" + body + "\x1C\x0D",
		"\x0B" + body + "\x1C\x0D\r\n",
	} {
		m, err := Parse([]byte(in))
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if string(m.Bytes()) != body || m.Get("PID-1").String() != "1" {
			t.Errorf("%q: got %q", in, m.Bytes())
		}
	}
	if got := string(FrameMLLP([]byte(body))); got != "\x0B"+body+"\x1C\x0D" {
		t.Error("FrameMLLP")
	}
	for _, bad := range []string{"\x0B" + body, "\x0B" + body + "\x1C\x0DMSH"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		in            string
		offset, line  int
		segment       string
		field, code   int
		reasonContain string
	}{
		{"", 0, 1, "", 0, 100, "empty"},
		{"\r\n\r\n", 4, 3, "", 0, 100, "empty"},
		{"PID|1\r", 0, 1, "PID", 0, 100, "does not start with MSH"},
		{"BHS|^~\\&\rMSH|^~\\&\r", 0, 1, "BHS", 0, 100, "ParseBatch"},
		{"MSH", 3, 1, "MSH", 1, 102, "too short"},
		{"MSHA^~\\&|", 3, 1, "MSH", 1, 102, "field separator"},
		{"MSH||x", 4, 1, "MSH", 2, 102, "missing encoding"},
		{"MSH|^^\\&|", 4, 1, "MSH", 2, 102, "duplicate"},
		{"MSH|^~\\&#$|", 4, 1, "MSH", 2, 102, "too many"},
		{"MSH|^~\\&|A\rPID|1\r\nob x|1\r", 18, 3, "ob", 0, 100, "invalid segment ID"},
		{"MSH|^~\\&|A\rPI\r", 11, 2, "PI", 0, 100, "invalid segment ID"},
		{"MSH|^~\\&|A\rPID|1\nMSH|^~\\&|B\r", 17, 3, "MSH", 0, 100, "second MSH"},
		{"\xEF\xBB\xBFMSH|^~\\&|A\rPID|1\r\nBTS|1\r", 21, 3, "BTS", 0, 100, "envelope"},
		{"\x0BMSH|^~\\&|A\r{\x1C\r", 12, 2, "{", 0, 100, "invalid segment ID"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.in))
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("%q: error %v, want *ParseError", c.in, err)
			continue
		}
		if pe.Offset != c.offset || pe.Line != c.line || pe.Segment != c.segment || pe.Field != c.field ||
			pe.Code != c.code || !strings.Contains(pe.Reason, c.reasonContain) {
			t.Errorf("%q: got %+v", c.in, *pe)
		}
		msg := pe.Error()
		if !strings.Contains(msg, "line ") || !strings.Contains(msg, "HL7 error ") {
			t.Errorf("Error() = %q", msg)
		}
	}
	// The header survives a later error, so that an AR can be built.
	m, err := Parse([]byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|XYZ|P|2.5\rpid|1\r"))
	if err == nil || m == nil || m.ControlID() != "XYZ" {
		t.Fatalf("partial message: %v %v", m, err)
	}
	var pe *ParseError
	errors.As(err, &pe)
	ack, err := m.Ack(AckOptions{Code: "AR", Err: pe.AckError(), ControlID: "1", Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	if got := ack.Get("ERR-3.1").String(); got != "100" {
		t.Errorf("ERR-3.1 = %q", got)
	}
}

func TestNeverPanicsOnPrefixes(t *testing.T) {
	for _, f := range []string{adt, "\x0B" + adt + "\x1C\r", "FHS|^~\\&\rBHS|^~\\&\r" + adt + "BTS|1\rFTS|1\r"} {
		for i := 0; i <= len(f); i++ {
			if m, err := Parse([]byte(f[:i])); err == nil {
				_ = m.Get("PID-3[2].1").Value()
			}
			if b, err := ParseBatch([]byte(f[:i])); err == nil {
				_ = b.Bytes()
			}
		}
	}
}

func TestBatch(t *testing.T) {
	msg1 := "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1\r"
	msg2 := "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|2|P|2.5\rPID|2\r"
	in := "FHS|^~\\&|FAPP\rBHS|^~\\&|BAPP\r" + msg1 + msg2 + "BTS|2\rFTS|1\r"
	b, err := ParseBatch([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Messages) != 2 || b.Messages[1].ControlID() != "2" || len(b.Envelope()) != 4 {
		t.Fatalf("messages %d envelope %d", len(b.Messages), len(b.Envelope()))
	}
	if string(b.Messages[0].Bytes()) != msg1 || string(b.Bytes()) != in {
		t.Error("round trip")
	}
	if got := b.EnvelopeSegment("BHS", 1).Field(3).String(); got != "BAPP" {
		t.Errorf("BHS-3 = %q", got)
	}
	if got := b.EnvelopeSegment("FHS", 1).Field(2).String(); got != "^~\\&" {
		t.Errorf("FHS-2 = %q", got)
	}
	if got := b.EnvelopeSegment("BTS", 1).Field(1).String(); got != "2" {
		t.Errorf("BTS-1 = %q", got)
	}
	if err := b.Messages[1].Set("PID-1", "22"); err != nil {
		t.Fatal(err)
	}
	if got := string(b.Bytes()); got != strings.Replace(in, "PID|2\r", "PID|22\r", 1) {
		t.Errorf("edited batch %q", got)
	}
	// Back to back messages, no envelope; LF terminators.
	b, err = ParseBatch([]byte(strings.ReplaceAll(msg1+msg2+msg1, "\r", "\n") + "\n\n"))
	if err != nil || len(b.Messages) != 3 {
		t.Fatalf("%v %d", err, len(b.Messages))
	}
	// A single message is a batch of one; framing is stripped.
	b, err = ParseBatch(FrameMLLP([]byte(msg1)))
	if err != nil || len(b.Messages) != 1 || string(b.Bytes()) != msg1 {
		t.Fatal("single")
	}
	// Empty batch.
	b, err = ParseBatch([]byte("BHS|^~\\&\rBTS|0\r"))
	if err != nil || len(b.Messages) != 0 {
		t.Fatal("empty batch")
	}
	bad := map[string]string{
		"BHS|^~\\&\rPID|1\rBTS|1\r":                        "outside a message",
		"BHS|^~\\&\r" + msg1 + "BHS|^~\\&\r" + msg2:        "BHS while a batch is open",
		"FHS|^~\\&\r" + msg1 + "FHS|^~\\&\r":               "FHS is not the first",
		"FHS|^~\\&\r" + msg1 + "FTS|1\r" + msg2:            "after the file trailer",
		"BHS|^~\\&\r" + msg1 + "BTS|1\rBTS|1\r":            "BTS without an open batch",
		"PID|1\r":                                          "does not start",
		"BHS|^^\r":                                         "duplicate",
		"BHS|^~\\&\rMSH|^~\\&|A\rPID|1\rMSH|^^|B\rPID|2\r": "duplicate",
	}
	for in, want := range bad {
		_, err := ParseBatch([]byte(in))
		var pe *ParseError
		if !errors.As(err, &pe) || !strings.Contains(pe.Reason, want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestEscapes(t *testing.T) {
	d := DefaultDelimiters
	cases := []struct{ raw, text string }{
		{`a\F\b\S\c\T\d\R\e\E\f`, "a|b^c&d~e\\f"},
		{`\X0D0A\`, "\r\n"},
		{`\X41\\x42\`, "A\\x42\\"},
		{`x\H\bold\N\y`, "xboldy"},
		{`1\.br\2`, "1\n2"},
		{`1\.sp\2\.sp 3\3`, "1\n2\n\n\n3"},
		{`a\.sk 2\b`, "a  b"},
		{`\.ce\T\.in +4\\.ti -2\\.fi\\.nf\`, "\nT"},
		{`\C2842\x\M2442\`, `\C2842\x\M2442\`},
		{`\Zlocal\`, `\Zlocal\`},
		{`unterminated\F`, `unterminated\F`},
		{`\Q\`, `\Q\`},
		{`\X4\`, `\X4\`},
		{`\XZZ\`, `\XZZ\`},
		{`\.br 2\`, `\.br 2\`},
		{`\\`, `\\`},
		{``, ``},
	}
	for _, c := range cases {
		if got := Unescape(c.raw, d); got != c.text {
			t.Errorf("Unescape(%q) = %q, want %q", c.raw, got, c.text)
		}
	}
	for text, raw := range map[string]string{
		"a|b^c&d~e\\f": `a\F\b\S\c\T\d\R\e\E\f`,
		"l1\r\nl2":     `l1\X0D\\X0A\l2`,
		"plain":        "plain",
	} {
		if got := Escape(text, d); got != raw {
			t.Errorf("Escape(%q) = %q, want %q", text, got, raw)
		}
		if got := Unescape(Escape(text, d), d); got != text {
			t.Errorf("round trip %q", text)
		}
	}
	custom := Delimiters{Field: '#', Component: '*', Repetition: '+', Escape: '!', Subcomponent: '%'}
	if got := Escape("a#b!c", custom); got != "a!F!b!E!c" || Unescape(got, custom) != "a#b!c" {
		t.Errorf("custom escape %q", got)
	}
	if Escape("a|b", Delimiters{Field: '|'}) != "a|b" {
		t.Error("no escape character")
	}
}

func TestEdits(t *testing.T) {
	m := mustParse(t, adt)
	steps := []struct{ path, value, raw string }{
		{"PID-5.2", "JANE", "DOE&VAN^JANE^Q"},
		{"PID-5.1.2", "VON", "DOE&VON^JANE^Q"},
		{"PID-5.6", "X", "DOE&VON^JANE^Q^^^X"},
		{"PID-3[3].1", "333", "111^^^HOSP^MR~222^^^STATE^SS~333"},
		{"PID-20.2.3", "s", "^&&s"},
		{"MSH-10", "NEW|ID", `NEW\F\ID`},
		{"OBX(2)-5", "a^b", `a\S\b`},
		{"ZPD-1", "", ""},
		{"PID-13", `""`, `""`},
	}
	for _, s := range steps {
		if err := m.Set(s.path, s.value); err != nil {
			t.Fatalf("Set(%q): %v", s.path, err)
		}
		p, _ := ParsePath(s.path)
		p.Repetition, p.Component, p.Subcomponent = 0, 0, 0
		if s.path == "PID-3[3].1" || strings.HasPrefix(s.path, "PID-5") || s.path == "PID-20.2.3" {
			if got := m.GetPath(p).String(); got != s.raw {
				t.Errorf("after Set(%q): field %q, want %q", s.path, got, s.raw)
			}
		}
		if got := m.Get(s.path).Value(); got != s.value && s.value != `""` {
			t.Errorf("Get(%q) = %q after Set", s.path, got)
		}
	}
	if !m.Get("PID-13").IsNull() {
		t.Error("null kept")
	}
	if err := m.SetRaw("PID-5", "A^B~C^D"); err != nil || m.Get("PID-5[2].2").String() != "D" {
		t.Errorf("SetRaw: %v", err)
	}
	for path, raw := range map[string]string{"PID-5": "a|b", "PID-5.1": "a^b", "PID-5[1]": "a~b", "PID-5.1.1": "a&b", "PID-6": "a\rb"} {
		if err := m.SetRaw(path, raw); !errors.Is(err, ErrBadRaw) {
			t.Errorf("SetRaw(%q, %q): %v", path, raw, err)
		}
	}
	for _, p := range []string{"MSH-1", "MSH-2", "MSH-2.1"} {
		if err := m.Set(p, "x"); !errors.Is(err, ErrReadOnly) {
			t.Errorf("Set(%s): %v", p, err)
		}
	}
	if err := m.Set("NK1-1", "x"); !errors.Is(err, ErrNoSegment) {
		t.Error("missing segment")
	}
	if err := m.Set("PID", "x"); !errors.Is(err, ErrBadPath) {
		t.Error("whole segment")
	}
	if err := m.InsertSegment(1, "ZAA|1"); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveSegment(m.Segment("EVN", 1).Index()); err != nil {
		t.Fatal(err)
	}
	if err := m.AppendSegment("ZZZ|end|x\\S\\y"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"MSH|x", "ab", "ZZZ|a\rb", "BHS|x", "ZZZ^x"} {
		if err := m.AppendSegment(bad); !errors.Is(err, ErrBadSegment) {
			t.Errorf("AppendSegment(%q): %v", bad, err)
		}
	}
	if m.InsertSegment(0, "ZAA|1") == nil || m.RemoveSegment(0) == nil || m.RemoveSegment(99) == nil {
		t.Error("MSH must stay first")
	}
	want := "MSH|^~\\&|SENDAPP|SENDFAC|RECVAPP|RECVFAC|20240102030405||ADT^A01^ADT_A01|NEW\\F\\ID|P|2.5.1\r" +
		"ZAA|1\r" +
		"PID|1||111^^^HOSP^MR~222^^^STATE^SS~333||A^B~C^D||19700101|M|||1 Main St^^Town^ST^12345||\"\"|||||||^&&s\r" +
		"OBX|1|ST|A^first||one\r" +
		"OBX|2|ST|B^second||a\\S\\b\r" +
		"OBX|3|FT|C^third||line1\\.br\\line2\r" +
		"ZPD||x^y\r" +
		"ZZZ|end|x\\S\\y\r"
	if got := m.String(); got != want {
		t.Errorf("edited:\n%q\nwant\n%q", got, want)
	}
	// Reparse gives the same values; untouched segments are byte-identical.
	m2 := mustParse(t, m.String())
	if m2.Value("ZZZ-2") != "x^y" || m2.Value("MSH-10") != "NEW|ID" || m2.Get("OBX(3)-5").String() != "line1\\.br\\line2" {
		t.Error("reparse")
	}
	var buf bytes.Buffer
	if _, err := m.WriteTo(&buf); err != nil || buf.String() != want {
		t.Error("WriteTo")
	}
	// Reset and reuse.
	m.Reset()
	if m.NumSegments() != 0 || m.Get("PID-1").Exists() {
		t.Error("Reset")
	}
	if err := m.Parse([]byte(adt)); err != nil || m.String() != adt {
		t.Error("reuse")
	}
}

func fixedNow() time.Time {
	return time.Date(2024, 5, 6, 7, 8, 9, 0, time.FixedZone("", -5*3600))
}

func TestAck(t *testing.T) {
	m := mustParse(t, adt)
	ack, err := m.Ack(AckOptions{Now: fixedNow, NewControlID: func() string { return "ACK1" }})
	if err != nil {
		t.Fatal(err)
	}
	want := "MSH|^~\\&|RECVAPP|RECVFAC|SENDAPP|SENDFAC|20240506070809-0500||ACK^A01^ACK|ACK1|P|2.5.1\rMSA|AA|CTRL123\r"
	if got := ack.String(); got != want {
		t.Errorf("ack:\n%q\nwant\n%q", got, want)
	}
	ack, err = m.Ack(AckOptions{Code: "AE", Text: "bad ^ value", ControlID: "C2", Now: fixedNow,
		Err: &AckError{Code: CodeRequiredMissing, Segment: "PID", Sequence: 1, Field: 3, Diagnostic: "PID-3 missing"}})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Get("MSA-1").String() != "AE" || ack.Get("MSA-2").String() != "CTRL123" || ack.Value("MSA-3") != "bad ^ value" {
		t.Errorf("MSA %q", ack.Get("MSA").String())
	}
	if got := ack.Get("ERR").String(); got != "ERR||PID^1^3|101^Required field missing^HL70357|E|||PID-3 missing" {
		t.Errorf("ERR %q", got)
	}
	for _, c := range []string{"CA", "CE", "CR", "AR"} {
		if a, err := m.Ack(AckOptions{Code: c}); err != nil || a.Get("MSA-1").String() != c || a.ControlID() == "" || a.ControlID() == "CTRL123" {
			t.Errorf("%s: %v", c, err)
		}
	}
	if _, err := m.Ack(AckOptions{Code: "XX"}); !errors.Is(err, ErrBadAckCode) {
		t.Error("bad code")
	}
	// Custom delimiters and an old message type without structure.
	m = mustParse(t, "MSH#*+!%#S1#F1#R1#F2#2024##ORM*O01#ID9#T#2.3\r")
	ack, err = m.Ack(AckOptions{Code: "AR", ControlID: "Z", Now: fixedNow, Text: "no#way"})
	if err != nil {
		t.Fatal(err)
	}
	want = "MSH#*+!%#R1#F2#S1#F1#20240506070809-0500##ACK*O01*ACK#Z#T#2.3\rMSA#AR#ID9#no!F!way\r"
	if got := ack.String(); got != want {
		t.Errorf("ack:\n%q\nwant\n%q", got, want)
	}
	// No trigger: MSH-9 is plain ACK.
	m = mustParse(t, "MSH|^~\\&|A|B|C|D|2024||ACK|1|P|2.1\r")
	if ack, _ := m.Ack(AckOptions{}); ack.Get("MSH-9").String() != "ACK" {
		t.Error("no trigger")
	}
	if a, b := NewControlID(), NewControlID(); a == b || len(a) > 20 {
		t.Errorf("control ids %q %q", a, b)
	}
}

func TestReuseDoesNotAllocate(t *testing.T) {
	var m Message
	in := []byte(adt)
	_ = m.Parse(in)
	allocs := testing.AllocsPerRun(100, func() {
		if err := m.Parse(in); err != nil {
			t.Fatal(err)
		}
		_ = m.Get("PID-3[2].1").Raw()
		_ = m.Get("PID-5.1").Raw()
		_ = m.Get("MSH-10").Raw()
	})
	if allocs != 0 {
		t.Errorf("%v allocations per reuse", allocs)
	}
	allocs = testing.AllocsPerRun(100, func() {
		if _, err := Parse(in); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 4 {
		t.Errorf("%v allocations per Parse", allocs)
	}
}
