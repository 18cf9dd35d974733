package logging

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func TestBufferedLinesArriveWhole(t *testing.T) {
	var out lockedBuffer
	w := NewBufferedWriter(&out)
	log := New(w, "info")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 500; j++ {
				log.Info("request", "n", j)
			}
		}()
	}
	wg.Wait()
	log.Debug("below the level")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4000 {
		t.Fatalf("%d lines after Close, want 4000", len(lines))
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, `{"time":`) || !strings.HasSuffix(l, "}") {
			t.Fatalf("torn line %q", l)
		}
	}
}

func TestBufferedWriterFlushesOnItsOwn(t *testing.T) {
	var out lockedBuffer
	w := NewBufferedWriter(&out)
	defer w.Close()
	w.Write([]byte("line\n"))
	deadline := time.Now().Add(5 * time.Second)
	for out.String() == "" {
		if time.Now().After(deadline) {
			t.Fatal("a buffered line was never flushed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
