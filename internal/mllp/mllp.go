// Package mllp reads and writes the Minimal Lower Layer Protocol (HL7 v2's
// framing over TCP): a message is sent as 0x0B, the message, 0x1C, 0x0D. The
// reader is strict about what it returns and lenient about what it skips:
// bytes outside a frame are dropped (and counted), a frame that is too large
// is read to its end and reported as ErrTooLarge so that the connection stays
// usable, and a start block inside a frame (the end block was lost) drops the
// frame so far and starts again. It knows nothing of HL7 or of sockets: it
// reads an io.Reader, so that it can be fuzzed.
package mllp

import (
	"bufio"
	"errors"
	"io"
)

// The framing bytes.
const (
	StartBlock byte = 0x0B
	EndBlock   byte = 0x1C
	CR         byte = 0x0D
)

// Errors of ReadFrame. After ErrTooLarge and ErrUnterminated the reader may
// be used again: the next call reads the next frame.
var (
	// ErrTooLarge: the frame was longer than the reader's limit; it was
	// read to its end and dropped.
	ErrTooLarge = errors.New("mllp: message too large")
	// ErrUnterminated: a start block came inside a frame, whose end block
	// was lost; the frame so far was dropped and the new one is read next.
	ErrUnterminated = errors.New("mllp: a start block inside a message (missing end block)")
)

// Reader reads frames.
type Reader struct {
	r   *bufio.Reader
	max int
	// pending: a start block was read at the end of a dropped frame; the
	// next frame begins there.
	pending bool
	// Skipped counts the bytes read outside frames (garbage between frames).
	Skipped int64
	// Started, when set, is called when a frame's start block has been read
	// (the caller may then set a read deadline for the rest of it).
	Started func()
}

// NewReader reads frames of at most max bytes (the message, without the
// framing) from r.
func NewReader(r io.Reader, max int) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 16<<10), max: max}
}

// ReadFrame returns the next message, without its framing. The slice is the
// caller's. io.EOF means the stream ended between frames; a stream that
// ends inside a frame is io.ErrUnexpectedEOF.
func (r *Reader) ReadFrame() ([]byte, error) {
	if !r.pending {
		for {
			b, err := r.r.ReadByte()
			if err != nil {
				return nil, err
			}
			if b == StartBlock {
				break
			}
			r.Skipped++
		}
	}
	r.pending = false
	if r.Started != nil {
		r.Started()
	}
	msg := make([]byte, 0, 1024)
	tooLarge := false
	for {
		b, err := r.r.ReadByte()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		switch b {
		case StartBlock:
			// A new frame starts before this one ended: drop this one.
			r.pending = true
			return nil, ErrUnterminated
		case EndBlock:
			// The end block is followed by a CR; a sender that leaves it
			// out is tolerated (the byte read is given back).
			if c, err := r.r.ReadByte(); err == nil && c != CR {
				r.r.UnreadByte()
			}
			if tooLarge {
				return nil, ErrTooLarge
			}
			return msg, nil
		}
		if tooLarge {
			continue
		}
		if len(msg) >= r.max {
			tooLarge, msg = true, nil
			continue
		}
		msg = append(msg, b)
	}
}

// Frame returns msg framed: 0x0B msg 0x1C 0x0D.
func Frame(msg []byte) []byte {
	out := make([]byte, 0, len(msg)+3)
	out = append(out, StartBlock)
	out = append(out, msg...)
	return append(out, EndBlock, CR)
}

// WriteFrame writes msg framed to w in one write.
func WriteFrame(w io.Writer, msg []byte) error {
	_, err := w.Write(Frame(msg))
	return err
}
