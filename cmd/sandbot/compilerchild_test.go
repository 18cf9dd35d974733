package main

import (
	"context"
	"os"
	"testing"

	"github.com/sandbot/sandbot/runtime"
)

// TestMain lets this test binary serve as the bot compiler's child process
// (runtime.RunCompilerChild): bots are compiled in a child process. With
// SANDBOT_TEST_SERVE=1 it is the sandbot command itself, for the tests that
// need the server in a process of its own (TestHostileBots).
func TestMain(m *testing.M) {
	runtime.RunCompilerChild()
	if os.Getenv("SANDBOT_TEST_SERVE") == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
