// wasi-command is a bot in the WASI command shape: built without
// -buildmode=c-shared, its main runs once per execution, sdk.Handle reads the
// event from stdin and writes the result envelope to stdout, and anything
// written to stderr becomes a log line. It reverses its text input:
//
//	text/plain "stressed"  ->  "desserts"
//
// Build: GOOS=wasip1 GOARCH=wasm go build -o wasi-command.wasm .
package main

import (
	"fmt"
	"os"

	"github.com/sandbot/sandbot/sdk"
)

func main() {
	sdk.Handle(func(ctx sdk.Context, e sdk.Event) (any, error) {
		s, err := e.Text()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "reversing %d bytes\n", len(s))
		r := []rune(s)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return string(r), nil
	})
}
