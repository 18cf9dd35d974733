package runtime

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandbot/sandbot/limits"
)

// TestModuleCacheEviction: with a budget that holds one module, compiling a
// second evicts the least recently used; an execution that already runs on
// the evicted module finishes normally; a later Execute of it reports
// ErrModuleEvicted, and compiling the bytes again brings it back.
func TestModuleCacheEviction(t *testing.T) {
	echo, bots := fixture(t, "echo.wasm"), fixture(t, "bots.wasm")
	r, err := New(context.Background(), Config{
		CacheDir:   testCacheDir(),
		Limits:     limits.Limits{ModuleCacheBytes: int64(max(len(echo), len(bots)) + 1)},
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	mb, err := r.Compile(ctx, bots)
	if err != nil {
		t.Fatal(err)
	}
	// An execution of bots.wasm is in its fhir call when echo.wasm is
	// compiled and bots.wasm is evicted.
	inCall, evicted := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		res, err := r.Execute(ctx, mb, Execution{Event: event("fhir"), FHIR: func(context.Context, []byte) []byte {
			close(inCall)
			<-evicted
			return []byte(`{"status":200,"body":{"ok":true}}`)
		}})
		if err == nil && string(res.Envelope.Result) != `{"status":200,"body":{"ok":true}}` {
			err = errors.New("result " + string(res.Envelope.Result))
		}
		done <- err
	}()
	<-inCall
	me, err := r.Compile(ctx, echo)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Lookup(mb.Hash()); ok {
		t.Fatal("bots.wasm still cached over the budget")
	}
	if _, ok := r.Lookup(me.Hash()); !ok {
		t.Fatal("echo.wasm, just compiled, not cached")
	}
	if n := testutil.ToFloat64(r.metrics.evictions); n != 1 {
		t.Fatalf("evictions %v, want 1", n)
	}
	close(evicted)
	if err := <-done; err != nil {
		t.Fatalf("execution running during the eviction: %v", err)
	}

	if _, err := r.Execute(ctx, mb, Execution{Event: event("status")}); !errors.Is(err, ErrModuleEvicted) {
		t.Fatalf("Execute of an evicted module: %v, want ErrModuleEvicted", err)
	}
	mb2, err := r.Compile(ctx, bots)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Execute(ctx, mb2, Execution{Event: event("status")})
	if err != nil || res.Envelope.Status != 201 {
		t.Fatalf("recompiled module: %v %+v", err, res)
	}
	// Now echo.wasm was the least recently used and is gone.
	if _, ok := r.Lookup(me.Hash()); ok {
		t.Fatal("echo.wasm still cached")
	}
	if got := testutil.ToFloat64(r.metrics.cachedBytes); got != float64(len(bots)) {
		t.Fatalf("cached bytes %v, want %d", got, len(bots))
	}
}
