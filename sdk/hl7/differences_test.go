package hl7

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"testing"
	"time"
)

// medplumResult is what compat/hl7-golden.mjs records for a difference case.
type medplumResult struct {
	Error                 string     `json:"error"`
	Segments              [][]string `json:"segments"`
	Component1            string     `json:"component1"`
	SubcomponentSeparator string     `json:"subcomponentSeparator"`
	AfterEdit             string     `json:"afterEdit"`
	AckMSH9               string     `json:"ackMSH9"`
	AckMSH11              string     `json:"ackMSH11"`
	AckMSH12              string     `json:"ackMSH12"`
	AckMSA3               string     `json:"ackMSA3"`
}

type differenceCase struct {
	Input   string        `json:"input"`
	Medplum medplumResult `json:"medplum"`
}

// latin1 turns a string read by Node as latin1 back into its bytes.
func latin1(s string) []byte {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		b = append(b, byte(r))
	}
	return b
}

// fieldsOf lists Field(0..NumFields()) of every segment, like medplumCase.
func fieldsOf(m *Message) [][]string {
	var out [][]string
	for i := 0; i < m.NumSegments(); i++ {
		s := m.SegmentAt(i)
		var f []string
		for j := 0; j <= s.NumFields(); j++ {
			f = append(f, s.Field(j).String())
		}
		out = append(out, f)
	}
	return out
}

// TestDifferences checks every deliberate difference from @medplum/core listed
// in DIFFERENCES.md: medplum's recorded behaviour and ours.
func TestDifferences(t *testing.T) {
	raw, err := os.ReadFile("testdata/medplum-golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Differences map[string]differenceCase `json:"differences"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	get := func(name string) ([]byte, medplumResult) {
		c, ok := g.Differences[name]
		if !ok {
			t.Fatalf("difference case %q missing from the golden file", name)
		}
		return latin1(c.Input), c.Medplum
	}
	ok := func(in []byte) *Message {
		t.Helper()
		m, err := Parse(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		return m
	}

	// 1-3, 10: input that medplum rejects and we accept.
	for _, name := range []string{"bom", "mllp", "leadingBlankLine"} {
		in, mp := get(name)
		if mp.Error == "" {
			t.Errorf("%s: medplum accepted it", name)
		}
		m := ok(in)
		if m.NumSegments() == 0 || m.Get("MSH-3").String() != "A" {
			t.Errorf("%s: parsed wrongly", name)
		}
	}
	in, mp := get("batch")
	if mp.Error == "" {
		t.Error("batch: medplum accepted it")
	}
	if _, err := Parse(in); err == nil {
		t.Error("batch: Parse accepted an envelope")
	}
	if b, err := ParseBatch(in); err != nil || len(b.Messages) != 1 || b.Messages[0].Get("PID-1").String() != "1" {
		t.Errorf("batch: %v", err)
	}

	// 4: several MSH: medplum makes one message, we reject it in Parse and split it in ParseBatch.
	in, mp = get("severalMSH")
	if len(mp.Segments) != 5 {
		t.Errorf("severalMSH: medplum has %d segments", len(mp.Segments))
	}
	var pe *ParseError
	if _, err := Parse(in); !errors.As(err, &pe) || pe.Code != CodeSegmentSequence {
		t.Errorf("severalMSH: Parse: %v", err)
	}
	if b, err := ParseBatch(in); err != nil || len(b.Messages) != 2 {
		t.Errorf("severalMSH: ParseBatch: %v", err)
	}

	// 5: escapes: same raw text, but Value decodes.
	in, mp = get("escapes")
	m := ok(in)
	if got := m.Get("OBX-5").String(); got != mp.Segments[1][5] {
		t.Errorf("escapes: raw %q, medplum %q", got, mp.Segments[1][5])
	}
	if mp.Component1 != `a\S\b\.br\c` || m.Get("OBX-5.1").String() != mp.Component1 {
		t.Errorf("escapes: component raw")
	}
	if got := m.Value("OBX-5.1"); got != "a^b\nc" {
		t.Errorf("escapes: value %q", got)
	}

	// 6: terminators and blank lines survive an edit; medplum rewrites them as CR.
	in, mp = get("lfBlankLines")
	if mp.AfterEdit != "MSH|^~\\&|A\rPID|2\rOBX|1\r" {
		t.Errorf("lfBlankLines: medplum %q", mp.AfterEdit)
	}
	m = ok(in)
	_ = m.Set("PID-1", "2")
	if got := m.String(); got != "MSH|^~\\&|A\nPID|2\n\nOBX|1\n" {
		t.Errorf("lfBlankLines: %q", got)
	}

	// 7: trailing terminator: medplum adds an empty last segment, we do not.
	if n := len(mp.Segments); n != 4 || len(mp.Segments[3]) != 1 || mp.Segments[3][0] != "" {
		t.Errorf("medplum trailing segment: %v", mp.Segments)
	}
	if m.NumSegments() != 3 {
		t.Errorf("trailing terminator: %d segments", m.NumSegments())
	}

	// 8: MSH-2 with three characters.
	in, mp = get("shortMSH2")
	m = ok(in)
	if mp.Segments[0][2] != "^~}|" || mp.SubcomponentSeparator != "|" {
		t.Errorf("shortMSH2: medplum %q %q", mp.Segments[0][2], mp.SubcomponentSeparator)
	}
	if m.Get("MSH-2").String() != "^~}" || m.Delimiters().Subcomponent != 0 || m.Get("PID-3.1.1").String() != "x&y" {
		t.Errorf("shortMSH2: ours %q", m.Get("MSH-2").String())
	}

	// 9: segment name longer than three characters.
	in, mp = get("longSegmentName")
	m = ok(in)
	s := m.SegmentAt(1)
	if mp.Segments[1][0] != "PLATEL" || s.Field(0).String() != "PLATEL" || s.Name() != "PLA" || !m.Segment("PLA", 1).Exists() {
		t.Errorf("longSegmentName: %q %q", mp.Segments[1][0], s.Name())
	}

	// 11: invalid segment IDs are errors.
	in, mp = get("lowercaseSegment")
	if mp.Error != "" || len(mp.Segments) != 3 {
		t.Errorf("lowercaseSegment: medplum %+v", mp)
	}
	if _, err := Parse(in); !errors.As(err, &pe) || pe.Line != 2 || pe.Segment != "pid" {
		t.Errorf("lowercaseSegment: %v", err)
	}

	// 12: whitespace-only lines are blank lines, not segments.
	in, mp = get("whitespaceLine")
	m = ok(in)
	if len(mp.Segments) != 4 || mp.Segments[1][0] != "   " || m.NumSegments() != 2 || string(m.Bytes()) != string(in) {
		t.Errorf("whitespaceLine: medplum %d, ours %d", len(mp.Segments), m.NumSegments())
	}

	// 13: ACK contents.
	in, mp = get("ack")
	m = ok(in)
	ack, err := m.Ack(AckOptions{Code: "AE", Now: func() time.Time { return time.Unix(0, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	if mp.AckMSH9 != "ACK^A01" || mp.AckMSH11 != "P" || mp.AckMSH12 != "2.3" || mp.AckMSA3 != "Application Error" {
		t.Errorf("ack: medplum %+v", mp)
	}
	if ack.Get("MSH-9").String() != "ACK^A01^ACK" || ack.Get("MSH-11").String() != "T" || ack.Get("MSH-12").String() != "2.3" || ack.Get("MSA-3").Exists() {
		t.Errorf("ack: ours %q", ack.String())
	}

	// 14: Set escapes; medplum's setField stores the text as raw ER7.
	in, mp = get("setEscapes")
	m = ok(in)
	if mp.AfterEdit != "MSH|^~\\&|A\rPID|1|a|b^c\r" {
		t.Errorf("setEscapes: medplum %q", mp.AfterEdit)
	}
	_ = m.Set("PID-2", "a|b^c")
	if got := m.String(); got != "MSH|^~\\&|A\rPID|1|a\\F\\b\\S\\c\r" {
		t.Errorf("setEscapes: %q", got)
	}
	if !reflect.DeepEqual(fieldsOf(ok(latin1(g.Differences["escapes"].Input))), mp0(g.Differences["escapes"].Medplum.Segments)) {
		t.Error("escapes: field lists differ beyond the trailing segment")
	}
}

// mp0 drops medplum's empty trailing segment.
func mp0(s [][]string) [][]string {
	if n := len(s); n > 0 && len(s[n-1]) == 1 && s[n-1][0] == "" {
		return s[:n-1]
	}
	return s
}
