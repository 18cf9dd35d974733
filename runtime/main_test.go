package runtime

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	RunCompilerChild()
	os.Exit(m.Run())
}

// testBudget is a budget with no limits.
func testBudget() *moduleBudget {
	const n = 1 << 62
	return &moduleBudget{n, n, n, n, n, n, n, n, n, n, n, n, n}
}
