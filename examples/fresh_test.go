package examples

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCommittedGoModulesAreFresh rebuilds each Go example (the builds are
// deterministic: -trimpath, no build id) and compares it with the committed
// module, so that a change to the SDK or the hl7 package cannot leave a stale
// .wasm behind. Run `make -C examples all` when it fails.
func TestCommittedGoModulesAreFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("rebuilds the examples")
	}
	for _, ex := range []struct {
		dir    string
		shared bool
	}{{"hello", true}, {"hl7-ack", true}, {"fhir-patient", true}, {"wasi-command", false}} {
		t.Run(ex.dir, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.wasm")
			args := []string{"build", "-trimpath", "-ldflags=-s"}
			if ex.shared {
				args = append(args, "-buildmode=c-shared")
			}
			cmd := exec.Command("go", append(args, "-o", out, ".")...)
			cmd.Dir = ex.dir
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("build: %v\n%s", err, msg)
			}
			built, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			committed, err := os.ReadFile(filepath.Join(ex.dir, ex.dir+".wasm"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(built, committed) {
				t.Errorf("%s/%s.wasm is stale (%d bytes committed, %d built): run make -C examples all", ex.dir, ex.dir, len(committed), len(built))
			}
		})
	}
}
