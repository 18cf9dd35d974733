//go:build !linux

package runtime

// jsImage is a JavaScript bot's snapshot: the engine's linear memory after
// @medplum/core and the bot's module were evaluated. Outside Linux it is
// copied into each instance's memory (see jsimage_linux.go for the
// copy-on-write mapping used on Linux).
type jsImage struct {
	size int
	sp   uint64
	mem  []byte
}

func newJSImage(mem []byte, sp uint64) (*jsImage, error) {
	return &jsImage{size: len(mem), sp: sp, mem: append([]byte(nil), mem...)}, nil
}

func (img *jsImage) mapInto(buf []byte) error { copy(buf, img.mem); return nil }

func (img *jsImage) reset(buf []byte) error { copy(buf, img.mem); return nil }

func (img *jsImage) bytes() []byte { return img.mem }

func (img *jsImage) close() {}
