package main

import (
	"context"
	"io"
)

// runExtraCommand runs the commands that are not about serving: "bot run"
// executes a module locally through the same runtime and limits, "bot new"
// creates a bot's files.
func runExtraCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, bool) {
	if args[0] == "bot" {
		return runBotCommand(ctx, args[1:], stdin, stdout, stderr), true
	}
	return 0, false
}
