package examples

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store/storetest"
)

// counter reads a counter (the sum over its labels matching label=value,
// or all of them when label is "") from reg.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || hasLabel(m, label, value) {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// TestReplicasShareCompiledModule runs three replicas on one database, each
// with its own bot runtime (and compilation cache), deploys the Go hello
// example through the first and executes it on the two others 10 ms after
// the deploy answered: they load the code the first compiled
// (docs/decisions.md 41) and start no compiler child.
func TestReplicasShareCompiledModule(t *testing.T) {
	wasm, err := os.ReadFile(filepath.Join("hello", "hello.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			dbURL := b.NewURL(t)
			var regs []*prometheus.Registry
			var replicas []*servertest.Server
			for i := 0; i < 3; i++ {
				reg := prometheus.NewRegistry()
				rt, err := runtime.New(ctx, runtime.Config{CacheDir: t.TempDir(), Registerer: reg, Limits: limits.Limits{CompileSeconds: 60}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rt.Close(ctx) })
				opts := []servertest.Option{func(c *server.Config) { c.Runtime = rt }}
				if i > 0 {
					base := replicas[0].URL
					opts = append(opts, func(c *server.Config) { c.BaseURL = base })
				}
				replicas = append(replicas, servertest.StartURL(t, b.Name, dbURL, opts...))
				regs = append(regs, reg)
			}
			owner := replicas[0].NewProject(t, "replicas")
			id := owner.Create(map[string]any{"resourceType": "Bot", "name": "hello"})["id"].(string)
			if r := owner.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
				t.Fatalf("deploy: %d %s", r.Status, r.Body)
			}
			if n := counter(t, regs[0], "sandbot_bot_module_artifacts_total", "result", "stored"); n != 1 {
				t.Fatalf("artifacts stored by the deploying replica: %v, want 1", n)
			}
			time.Sleep(10 * time.Millisecond)
			var wg sync.WaitGroup
			for i := 1; i < 3; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := servertest.NewClient(t, replicas[i].URL, owner.Token)
					start := time.Now()
					r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"name":"Ada"}`, "application/json")
					d := time.Since(start)
					if r.Status != 200 || string(r.Body) != `{"greeting":"Hello, Ada"}` {
						t.Errorf("replica %d: %d %s", i+1, r.Status, r.Body)
					}
					t.Logf("replica %d: first execution %v after the deploy on replica 1", i+1, d)
				}()
			}
			wg.Wait()
			for i := 1; i < 3; i++ {
				if n := counter(t, regs[i], "sandbot_bot_compiler_children_total", "", ""); n != 0 {
					t.Errorf("replica %d started %v compiler children, want 0", i+1, n)
				}
				if n := counter(t, regs[i], "sandbot_bot_module_artifacts_total", "result", "loaded"); n != 1 {
					t.Errorf("replica %d loaded %v artifacts, want 1", i+1, n)
				}
			}
		})
	}
}
