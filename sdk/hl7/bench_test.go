package hl7

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// benchMessages returns the corpus messages exactly as compat/hl7-bench.mjs
// feeds them to @medplum/core: single-message files as they are (BOM
// stripped); batch files and files of several messages split into messages
// whose lines are joined with CR. Deliberately bad files are left out.
func benchMessages(tb testing.TB) [][]byte {
	var out [][]byte
	for _, f := range loadCorpus(tb) {
		if strings.Contains(f.name, "bad") || strings.Contains(f.name, "InvalidMessage") {
			continue
		}
		out = append(out, splitLikeNode(bytes.TrimPrefix(f.data, []byte("\xEF\xBB\xBF")))...)
	}
	return out
}

// splitLikeNode mirrors splitMessages in compat/hl7-golden.mjs.
func splitLikeNode(text []byte) [][]byte {
	lines := bytes.FieldsFunc(text, func(r rune) bool { return r == '\r' || r == '\n' })
	msh, env := 0, false
	for _, l := range lines {
		if bytes.HasPrefix(l, []byte("MSH")) {
			msh++
		}
		if isEnvelopeName(l) {
			env = true
		}
	}
	if bytes.HasPrefix(text, []byte("MSH")) && msh == 1 && !env {
		return [][]byte{text}
	}
	var msgs [][][]byte
	cur := -1
	for _, l := range lines {
		switch {
		case isEnvelopeName(l):
			cur = -1
		case bytes.HasPrefix(l, []byte("MSH")):
			msgs = append(msgs, [][]byte{l})
			cur = len(msgs) - 1
		case cur >= 0:
			msgs[cur] = append(msgs[cur], l)
		}
	}
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		out[i] = bytes.Join(m, []byte("\r"))
	}
	return out
}

// largeORU is the generated ORU^R01 with n OBX segments that
// compat/hl7-bench.mjs generates too.
func largeORU(n int) []byte {
	var b bytes.Buffer
	b.WriteString("MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240101120000||ORU^R01^ORU_R01|MSG00001|P|2.5.1\r")
	b.WriteString("PID|1||123456^^^HOSP^MR~987654^^^STATE^SS||DOE^JOHN^Q||19700101|M\r")
	b.WriteString("OBR|1|ORD1|FIL1|CBC^Complete blood count^L|||20240101110000\r")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "OBX|%d|NM|718-7^Hemoglobin^LN|1|13.%d|g/dL^grams per deciliter^UCUM|12.0-17.5|N|||F|||20240101120000\r", i, i%10)
	}
	return b.Bytes()
}

func totalBytes(msgs [][]byte) int64 {
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	return int64(n)
}

// allocsPerMsg reports allocations per message as a custom metric.
func allocsPerMsg(b *testing.B, nmsg int, run func()) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		run()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N*nmsg), "allocs/msg")
}

func BenchmarkParse(b *testing.B) {
	msgs := benchMessages(b)
	b.SetBytes(totalBytes(msgs))
	b.ReportAllocs()
	allocsPerMsg(b, len(msgs), func() {
		for _, d := range msgs {
			if _, err := Parse(d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkParseReuse(b *testing.B) {
	msgs := benchMessages(b)
	b.SetBytes(totalBytes(msgs))
	b.ReportAllocs()
	m := grown(msgs)
	allocsPerMsg(b, len(msgs), func() {
		for _, d := range msgs {
			if err := m.Parse(d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

var sink int

// grown is a Message reused for every one of msgs once, so that its buffers
// have grown to their size before a benchmark of reuse measures.
func grown(msgs [][]byte) *Message {
	m := new(Message)
	for _, d := range msgs {
		_ = m.Parse(d)
		_ = m.Get("PID-3")
	}
	return m
}

func BenchmarkParseGet3(b *testing.B) {
	msgs := benchMessages(b)
	b.SetBytes(totalBytes(msgs))
	b.ReportAllocs()
	allocsPerMsg(b, len(msgs), func() {
		for _, d := range msgs {
			m, err := Parse(d)
			if err != nil {
				b.Fatal(err)
			}
			sink += len(m.Get("PID-3").Raw()) + len(m.Get("PID-5.1").Raw()) + len(m.Get("MSH-10").Raw())
		}
	})
}

func BenchmarkParseGet3Reuse(b *testing.B) {
	msgs := benchMessages(b)
	b.SetBytes(totalBytes(msgs))
	b.ReportAllocs()
	m := grown(msgs)
	allocsPerMsg(b, len(msgs), func() {
		for _, d := range msgs {
			if err := m.Parse(d); err != nil {
				b.Fatal(err)
			}
			sink += len(m.Get("PID-3").Raw()) + len(m.Get("PID-5.1").Raw()) + len(m.Get("MSH-10").Raw())
		}
	})
}

func BenchmarkSerialize(b *testing.B) {
	msgs := benchMessages(b)
	parsed := make([]*Message, len(msgs))
	for i, d := range msgs {
		parsed[i], _ = Parse(d)
	}
	b.SetBytes(totalBytes(msgs))
	b.ReportAllocs()
	buf := make([]byte, 0, 2<<20)
	allocsPerMsg(b, len(msgs), func() {
		for _, m := range parsed {
			buf = m.AppendTo(buf[:0])
		}
	})
}

func BenchmarkEditSerialize(b *testing.B) {
	msgs := benchMessages(b)
	b.SetBytes(totalBytes(msgs))
	b.ReportAllocs()
	var m Message
	buf := make([]byte, 0, 2<<20)
	allocsPerMsg(b, len(msgs), func() {
		for _, d := range msgs {
			if err := m.Parse(d); err != nil {
				b.Fatal(err)
			}
			if err := m.Set("MSH-10", "EDITED-42"); err != nil {
				b.Fatal(err)
			}
			buf = m.AppendTo(buf[:0])
		}
	})
}

func BenchmarkParseLarge(b *testing.B) {
	d := largeORU(5000)
	b.SetBytes(int64(len(d)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Parse(d); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseLargeReuse(b *testing.B) {
	d := largeORU(5000)
	b.SetBytes(int64(len(d)))
	b.ReportAllocs()
	var m Message
	_ = m.Parse(d)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := m.Parse(d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSetRepeated: n Sets on one segment, each adding a field (PID-1 ..
// PID-n), on a freshly parsed message. An edit costs memory in proportion to
// what it changes, so B/op and allocs/op grow linearly with n.
func BenchmarkSetRepeated(b *testing.B) {
	msg := []byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1\rPV1|1\r")
	for _, n := range []int{100, 1000, 2000} {
		paths := make([]Path, n)
		for i := range paths {
			var err error
			if paths[i], err = ParsePath(fmt.Sprintf("PID-%d", i+1)); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m, err := Parse(msg)
				if err != nil {
					b.Fatal(err)
				}
				for _, p := range paths {
					if err := m.SetPath(p, "value"); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
