package adminapi_test

import (
	"os"
	"testing"

	"github.com/sandbot/sandbot/runtime"
)

// TestMain lets this test binary serve as the bot compiler's child process
// (runtime.RunCompilerChild): bots are compiled in a child process.
func TestMain(m *testing.M) {
	runtime.RunCompilerChild()
	os.Exit(m.Run())
}
