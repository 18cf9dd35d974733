package hl7

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"
)

// TestEditMemoryProportional: edits beside a large field neither copy it nor
// keep copies of it alive. 100 Sets of OBX-3 in a message whose OBX-5 is
// 1 MiB used to copy the whole segment on every Set (110 MiB allocated and
// kept until the next Parse); an edit now costs the field it changes.
func TestEditMemoryProportional(t *testing.T) {
	big := bytes.Repeat([]byte("QUJD"), 1<<18) // 1 MiB of base64
	msg := append([]byte("MSH|^~\\&|A|B|C|D|20240101||ORU^R01|1|P|2.5\rPID|1\rOBX|1|ED|PDF||"), big...)
	msg = append(msg, "|||||F\r"...)
	m, err := Parse(msg)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < 100; i++ {
		if err := m.Set("OBX-3", "CODE-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if allocated > 256<<10 || retained > 64<<10 {
		t.Errorf("100 edits of OBX-3 beside a 1 MiB OBX-5: %d bytes allocated, %d retained (want < 256 KiB and < 64 KiB)", allocated, retained)
	}
	if got := m.Value("OBX-3"); got != "CODE-99" {
		t.Fatalf("OBX-3 = %q", got)
	}
	if f := m.Get("OBX-5"); len(f.Raw()) != len(big) || &f.Raw()[0] != &msg[bytes.Index(msg, big)] {
		t.Fatalf("OBX-5 was copied or changed")
	}
	out := m.Bytes()
	if want := bytes.Replace(msg, []byte("ED|PDF||"), []byte("ED|CODE-99||"), 1); !bytes.Equal(out, want) {
		t.Fatalf("serialised message differs")
	}
	runtime.KeepAlive(m)
}

// TestSetAllocationLinear: n Sets each adding a field to one segment
// allocate in proportion to n, not n² (BenchmarkSetRepeated reports the
// figures).
func TestSetAllocationLinear(t *testing.T) {
	msg := []byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1\r")
	allocFor := func(n int) uint64 {
		paths := make([]Path, n)
		for i := range paths {
			paths[i], _ = ParsePath("PID-" + strconv.Itoa(i+1))
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m, _ := Parse(msg)
		for _, p := range paths {
			if err := m.SetPath(p, "value"); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(m)
		return after.TotalAlloc - before.TotalAlloc
	}
	small, large := allocFor(250), allocFor(2000)
	// Linear: 8× the edits cost about 8× the bytes; quadratic would be 64×.
	if large > 16*small {
		t.Errorf("250 Sets allocate %d bytes, 2000 Sets %d (%.1f×; linear is about 8×)", small, large, float64(large)/float64(small))
	}
}
