package mllp

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func TestReadFrames(t *testing.T) {
	msg1, msg2 := []byte("MSH|^~\\&|A\rPID|1\r"), []byte("MSH|^~\\&|B\r")
	var in bytes.Buffer
	in.WriteString("garbage\r\n")
	in.Write(Frame(msg1))
	in.WriteString("xx")
	in.Write(Frame(msg2))
	// A frame split into one-byte reads reads the same.
	r := NewReader(iotest.OneByteReader(&in), 100)
	for _, want := range [][]byte{msg1, msg2} {
		got, err := r.ReadFrame()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("got %q %v, want %q", got, err, want)
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if r.Skipped != int64(len("garbage\r\nxx")) {
		t.Errorf("skipped %d", r.Skipped)
	}
}

func TestReadFrameErrors(t *testing.T) {
	var in bytes.Buffer
	in.Write(Frame(bytes.Repeat([]byte("x"), 11))) // too large
	in.Write(Frame([]byte("ok")))
	in.WriteString("\x0bunterminated")             // its end block lost
	in.Write(Frame([]byte("next")))                // read after the error
	in.WriteString("\x0bno CR\x1c\x0bafter\x1c\r") // an end block without CR
	in.WriteString("\x0btruncated")
	r := NewReader(&in, 10)
	for i, want := range []struct {
		msg string
		err error
	}{{"", ErrTooLarge}, {"ok", nil}, {"", ErrUnterminated}, {"next", nil}, {"no CR", nil}, {"after", nil}, {"", io.ErrUnexpectedEOF}} {
		got, err := r.ReadFrame()
		if !errors.Is(err, want.err) || string(got) != want.msg {
			t.Fatalf("frame %d: %q %v, want %q %v", i, got, err, want.msg, want.err)
		}
	}
}

// FuzzReader: whatever the stream, the reader never returns a frame over
// its limit or holding a framing byte, and never panics; frames written by
// Frame read back whole after any garbage.
func FuzzReader(f *testing.F) {
	f.Add([]byte("\x0bMSH|^~\\&|A\r\x1c\r"), []byte("MSH|x"))
	f.Add([]byte("junk\x0b\x0b\x1c\x1c\r\r"), []byte(""))
	f.Add([]byte("\x0b"+string(bytes.Repeat([]byte("a"), 70))+"\x1c\r"), []byte("PID|1"))
	f.Add([]byte("\x1c\r\x0babc"), []byte("\x0d"))
	f.Fuzz(func(t *testing.T, stream, payload []byte) {
		const max = 64
		r := NewReader(bytes.NewReader(stream), max)
		for i := 0; i < len(stream)+1; i++ {
			msg, err := r.ReadFrame()
			if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			if err != nil && err != ErrTooLarge && err != ErrUnterminated {
				t.Fatalf("error %v", err)
			}
			if len(msg) > max || bytes.IndexByte(msg, StartBlock) >= 0 || bytes.IndexByte(msg, EndBlock) >= 0 {
				t.Fatalf("frame %q", msg)
			}
		}
		// A clean frame after garbage without a start block reads back.
		payload = bytes.Map(func(r rune) rune {
			if r == rune(StartBlock) || r == rune(EndBlock) {
				return -1
			}
			return r
		}, payload)
		if len(payload) > max {
			payload = payload[:max]
		}
		garbage := bytes.ReplaceAll(stream, []byte{StartBlock}, nil)
		r = NewReader(bytes.NewReader(append(garbage, Frame(payload)...)), max)
		msg, err := r.ReadFrame()
		if err != nil || !bytes.Equal(msg, payload) {
			t.Fatalf("after garbage %q: %q %v, want %q", garbage, msg, err, payload)
		}
	})
}
