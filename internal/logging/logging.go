// Package logging builds the server's logger: JSON lines on a writer that is
// buffered and flushed on a short interval, so that a busy server does not
// pay a system call for every access-log line.
package logging

import (
	"bufio"
	"io"
	"log/slog"
	"sync"
	"time"
)

// FlushInterval bounds how long a log line may wait in the buffer. A process
// that dies without Close (a fatal runtime error, SIGKILL) loses at most the
// lines of this last interval.
const FlushInterval = 100 * time.Millisecond

// BufferedWriter is an io.Writer safe for concurrent use that buffers writes
// and flushes them every FlushInterval, when the buffer fills, and on Close.
type BufferedWriter struct {
	mu   sync.Mutex
	buf  *bufio.Writer
	stop chan struct{}
	done chan struct{}
}

// NewBufferedWriter starts the periodic flush; call Close when done.
func NewBufferedWriter(w io.Writer) *BufferedWriter {
	b := &BufferedWriter{buf: bufio.NewWriterSize(w, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go b.flushLoop()
	return b
}

func (b *BufferedWriter) flushLoop() {
	defer close(b.done)
	t := time.NewTicker(FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			b.Flush()
		case <-b.stop:
			return
		}
	}
}

// Write implements io.Writer.
func (b *BufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Flush writes out what is buffered.
func (b *BufferedWriter) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Flush()
}

// Close stops the periodic flush and flushes what is left. It is idempotent.
func (b *BufferedWriter) Close() error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
		<-b.done
	}
	return b.Flush()
}

// New returns a JSON logger at the given level ("debug", "info", "warn",
// "error") on w.
func New(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}
