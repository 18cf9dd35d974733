package main

import (
	"context"
	"io"
)

// runExtraCommand runs the commands that are not about serving ("bot run").
func runExtraCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, bool) {
	return 0, false
}
