package runtime

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// memArtifacts is an ArtifactStore in memory.
type memArtifacts struct {
	mu sync.Mutex
	m  map[string]*Artifact
}

func (s *memArtifacts) LoadArtifact(_ context.Context, hash, platform string) (*Artifact, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.m[hash+" "+platform]
	if a == nil {
		return nil, nil
	}
	c := *a
	c.Code = append([]byte(nil), a.Code...)
	return &c, nil
}

func (s *memArtifacts) StoreArtifact(_ context.Context, a *Artifact) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*Artifact{}
	}
	if _, ok := s.m[a.ModuleHash+" "+a.Platform]; !ok {
		s.m[a.ModuleHash+" "+a.Platform] = a
	}
	return nil
}

func freshRuntime(t *testing.T) (*Runtime, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := New(context.Background(), Config{CacheDir: t.TempDir(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	return r, reg
}

// TestArtifactsShared: a module compiled by one runtime is loaded by
// another from the shared artifact, with the prepared module it carries and
// without a compiler child; an artifact whose code, prepared module, name,
// module or MAC was changed, or made under another key, or over the size
// bound, is refused and the module compiled.
func TestArtifactsShared(t *testing.T) {
	wasm := fixture(t, "echo.wasm")
	key := []byte("0123456789abcdef0123456789abcdef")
	st := &memArtifacts{}
	one, _ := freshRuntime(t)
	if one.platform == "" {
		t.Fatal("no platform: nothing would be shared")
	}
	if _, err := one.Compile(WithArtifacts(context.Background(), st, key), wasm); err != nil {
		t.Fatal(err)
	}
	if testutil.ToFloat64(one.metrics.artifacts.WithLabelValues("stored")) != 1 || len(st.m) != 1 {
		t.Fatalf("stored: %v", st.m)
	}
	for _, a := range st.m {
		if p, _ := one.decodePrepared(a.Prepared); p == nil {
			t.Fatal("the artifact does not carry the prepared module")
		}
	}
	two, _ := freshRuntime(t)
	m, err := two.Compile(WithArtifacts(context.Background(), st, key), wasm)
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(two.metrics.childCompiles); n != 0 {
		t.Errorf("compiler children: %v, want 0", n)
	}
	if n := testutil.ToFloat64(two.metrics.artifacts.WithLabelValues("loaded")); n != 1 {
		t.Errorf("loaded: %v, want 1", n)
	}
	ev := event("hi")
	if res, err := two.Execute(context.Background(), m, Execution{Event: ev}); err != nil || string(res.Envelope.Result) != string(ev) {
		t.Fatalf("execute the loaded module: %v %v", res, err)
	}

	var a *Artifact
	for _, v := range st.m {
		a = v
	}
	tampered := map[string]func(a *Artifact){
		"code": func(a *Artifact) { a.Code[len(a.Code)/2] ^= 1 },
		"name": func(a *Artifact) { a.Name = filepath.ToSlash(filepath.Join(filepath.Dir(a.Name), "..", "x")) },
		"module": func(a *Artifact) {
			a.ModuleHash = HashBytes([]byte("other"))
			a.MAC = artifactMAC(key, a)
		},
		"mac":      func(a *Artifact) { a.MAC = "00" + a.MAC[2:] },
		"prepared": func(a *Artifact) { a.Prepared = append([]byte(nil), a.Prepared...); a.Prepared[len(a.Prepared)-1] ^= 1 },
		"oversize": func(a *Artifact) {},
	}
	for what, change := range tampered {
		t.Run(what, func(t *testing.T) {
			b := *a
			b.Code = append([]byte(nil), a.Code...)
			change(&b)
			bad := &memArtifacts{m: map[string]*Artifact{a.ModuleHash + " " + a.Platform: &b}}
			r, _ := freshRuntime(t)
			if what == "oversize" {
				r.cfg.Limits.ModuleArtifactBytes = int64(len(b.Code) - 1)
			}
			if _, err := r.Compile(WithArtifacts(context.Background(), bad, key), wasm); err != nil {
				t.Fatal(err)
			}
			if n := testutil.ToFloat64(r.metrics.artifacts.WithLabelValues("rejected")); n != 1 {
				t.Errorf("rejected: %v, want 1", n)
			}
			if n := testutil.ToFloat64(r.metrics.childCompiles); n != 1 {
				t.Errorf("compiler children: %v, want 1 (compiled instead)", n)
			}
		})
	}
	t.Run("other key", func(t *testing.T) {
		r, _ := freshRuntime(t)
		if _, err := r.Compile(WithArtifacts(context.Background(), st, []byte("another key, 32 bytes long......")), wasm); err != nil {
			t.Fatal(err)
		}
		if n := testutil.ToFloat64(r.metrics.artifacts.WithLabelValues("rejected")); n != 1 {
			t.Errorf("rejected: %v, want 1", n)
		}
	})
}

// TestArtifactLoadPhases logs where the time of loading a shared Go module
// goes (SANDBOT_HELLO_WASM: the hello example). No assertion on time.
func TestArtifactLoadPhases(t *testing.T) {
	path := os.Getenv("SANDBOT_HELLO_WASM")
	if path == "" {
		t.Skip("SANDBOT_HELLO_WASM not set")
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef0123456789abcdef")
	st := &memArtifacts{}
	one, _ := freshRuntime(t)
	start := time.Now()
	if _, err := one.Compile(WithArtifacts(context.Background(), st, key), wasm); err != nil {
		t.Fatal(err)
	}
	t.Logf("compile on one: %v", time.Since(start))
	two, _ := freshRuntime(t)
	start = time.Now()
	_, prepared, _, err := prepareModule(wasm, &two.budget, two.stackSlots)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("prepare: %v", time.Since(start))
	start = time.Now()
	m, err := two.Compile(WithArtifacts(context.Background(), st, key), wasm)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compile on two (from the artifact): %v (%d bytes of code, %d prepared)", time.Since(start), len(st.m[HashBytes(wasm)+" "+two.platform].Code), len(prepared))
	for i := 0; i < 3; i++ {
		start = time.Now()
		if _, err := two.Execute(context.Background(), m, Execution{Event: event(map[string]any{"name": "Ada"})}); err != nil {
			t.Fatal(err)
		}
		t.Logf("execution %d: %v", i+1, time.Since(start))
	}
}
