package server_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLayering holds the import rules docs/architecture.md states, on what
// `go list` answers: handlers (every package that speaks HTTP) reach the
// store, the runtime and the job engine only through services; services
// speak no HTTP; nothing below the handlers imports them; and every package
// the page should name is named there.
func TestLayering(t *testing.T) {
	const module = "github.com/sandbot/sandbot/"
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	// The wiring, the assembly and the test helper that starts servers may
	// import anything.
	wiring := []string{"cmd/sandbot", "internal/server", "internal/servertest"}
	below := []string{"store", "store/sqlstore", "runtime", "internal/services/jobs"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := strings.TrimPrefix(fields[0], module), fields[1:]
		http := slices.Contains(imports, "net/http") || slices.Contains(imports, "github.com/gorilla/mux")
		var mine []string
		for _, imp := range imports {
			if strings.HasPrefix(imp, module) {
				mine = append(mine, strings.TrimPrefix(imp, module))
			} else if strings.HasPrefix(imp, "github.com/riverqueue/") && http && !slices.Contains(wiring, pkg) {
				t.Errorf("%s speaks HTTP and imports the job engine %s", pkg, imp)
			}
		}
		switch {
		case slices.Contains(wiring, pkg):
		case http:
			for _, imp := range mine {
				if slices.Contains(below, imp) {
					t.Errorf("%s speaks HTTP and imports %s: a handler reaches it through a service", pkg, imp)
				}
			}
		}
		if strings.HasPrefix(pkg, "internal/services/") && http {
			t.Errorf("%s is a service and imports net/http or gorilla/mux", pkg)
		}
		if !strings.HasPrefix(pkg, "internal/handlers/") && !slices.Contains(wiring, pkg) {
			for _, imp := range mine {
				if strings.HasPrefix(imp, "internal/handlers/") {
					t.Errorf("%s imports the handler %s: imports go down only", pkg, imp)
				}
			}
		}
		if strings.HasPrefix(pkg, "internal/services/") || strings.HasPrefix(pkg, "internal/handlers/") {
			for _, imp := range mine {
				if strings.HasPrefix(imp, "internal/handlers/") && !strings.HasPrefix(pkg, "internal/handlers/") {
					t.Errorf("service %s imports handler %s", pkg, imp)
				}
			}
		}
		documented := !strings.Contains(pkg, "/internal/") && !strings.HasPrefix(pkg, "examples") && !strings.HasPrefix(pkg, "deploy") &&
			!strings.HasSuffix(pkg, "test") && !strings.HasSuffix(pkg, "testtiming")
		if documented && !strings.Contains(string(doc), "`"+pkg+"`") {
			t.Errorf("docs/architecture.md does not name %s", pkg)
		}
	}
}
