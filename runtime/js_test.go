package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// jsRuntime returns the shared test runtime, skipping when this build has no
// JavaScript engine (`make js` not run), except in CI, where `make test`
// fetches it first and a missing engine is a failure.
func jsRuntime(t testing.TB) *Runtime {
	t.Helper()
	r := testRuntime(t)
	if _, err := r.jsEngine(context.Background()); err != nil {
		if errors.Is(err, ErrJSUnavailable) && os.Getenv("CI") == "" {
			t.Skip("JavaScript engine not fetched (make js)")
		}
		t.Fatal(err)
	}
	return r
}

func compileJS(t testing.TB, r *Runtime, code string) *Module {
	t.Helper()
	m, err := r.CompileJS(context.Background(), []byte(code), "bot.js")
	if err != nil {
		t.Fatalf("CompileJS: %v", err)
	}
	return m
}

func jsEvent(t testing.TB, contentType string, input any) []byte {
	t.Helper()
	in, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	ev := Event{Bot: Reference{Reference: "Bot/1", Display: "test"}, Requester: Reference{Reference: "ClientApplication/2"},
		ContentType: contentType, Input: in, TraceID: "trace", Headers: map[string]string{"x-test": "yes"}}
	b, err := ev.JSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func runJS(t testing.TB, r *Runtime, m *Module, ex Execution) (*Result, error) {
	t.Helper()
	return r.Execute(context.Background(), m, ex)
}

func TestJSHello(t *testing.T) {
	r := jsRuntime(t)
	m := compileJS(t, r, `exports.handler = async function (medplum, event) {
  console.log('hello', event.input.name, 42);
  return { greeting: 'Hello, ' + event.input.name, bot: event.bot.reference, headers: event.headers, typeofClient: typeof medplum.createResource };
};`)
	for i := 0; i < 3; i++ { // a fresh instance, then restored ones
		res, err := runJS(t, r, m, Execution{Event: jsEvent(t, MediaJSON, map[string]string{"name": "Ada"})})
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		want := `{"greeting":"Hello, Ada","bot":"Bot/1","headers":{"x-test":"yes"},"typeofClient":"function"}`
		if string(res.Envelope.Result) != want {
			t.Fatalf("run %d: result %s, want %s", i, res.Envelope.Result, want)
		}
		if len(res.Logs) != 1 || res.Logs[0].Text != "hello Ada 42" || res.Logs[0].Level != 1 {
			t.Fatalf("run %d: logs %+v", i, res.Logs)
		}
	}
}

func TestJSSyntaxErrorHasLineAndColumn(t *testing.T) {
	r := jsRuntime(t)
	_, err := r.CompileJS(context.Background(), []byte("exports.handler = async () => {\n  return 1 +;\n};\n"), "broken.js")
	var me *ModuleError
	if !errors.As(err, &me) {
		t.Fatalf("err = %v, want a ModuleError", err)
	}
	if me.Line != 2 || me.Column == 0 || !strings.Contains(me.Reason, "SyntaxError") || !strings.Contains(me.Reason, "broken.js, line 2") {
		t.Fatalf("ModuleError %+v", me)
	}
	_, err = r.CompileJS(context.Background(), []byte("exports.handler = ) 1"), "first.js")
	if !errors.As(err, &me) || me.Line != 1 || me.Column < 1 || me.Column > 20 {
		t.Fatalf("first-line error %+v (%v)", me, err)
	}
}

func TestJSTimeout(t *testing.T) {
	r := jsRuntime(t)
	for name, code := range map[string]string{
		"loop":  `exports.handler = () => { for (;;) {} };`,
		"await": `exports.handler = async () => { for (;;) { await null; } };`,
	} {
		t.Run(name, func(t *testing.T) {
			m := compileJS(t, r, code)
			start := time.Now()
			_, err := runJS(t, r, m, Execution{Event: jsEvent(t, MediaJSON, nil), Limits: Limits{Timeout: 300 * time.Millisecond}})
			var f *Failure
			if !errors.As(err, &f) || f.Kind != FailTimeout {
				t.Fatalf("err = %v, want a timeout", err)
			}
			if d := time.Since(start); d > 1300*time.Millisecond {
				t.Fatalf("took %v", d)
			}
		})
	}
}

func BenchmarkExecuteJSTrivial(b *testing.B) {
	r := jsRuntime(b)
	m := compileJS(b, r, `exports.handler = async () => ({ ok: true });`)
	ev := jsEvent(b, MediaJSON, map[string]string{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := r.Execute(context.Background(), m, Execution{Event: ev})
		if err != nil || string(res.Envelope.Result) != `{"ok":true}` {
			b.Fatal(err, res)
		}
	}
	b.StopTimer()
	// The image, and the memory an instance holds of its own: the pages its
	// executions wrote (copies of the image's), the rest being the image's
	// pages, shared.
	b.ReportMetric(float64(m.js.img.size), "image-bytes")
	if inst := m.js.get(); inst != nil {
		if private, err := privateBytes(inst.mem.buf[:m.js.img.size]); err == nil {
			b.ReportMetric(float64(private), "private-bytes/instance")
		}
		m.js.put(inst)
	}
}

// TestJSExecutionsShareNothing: module state, globals and the random
// sequence start from the image in every execution, on a fresh instance
// and on restored ones alike.
func TestJSExecutionsShareNothing(t *testing.T) {
	r := jsRuntime(t)
	m := compileJS(t, r, `let n = 0;
exports.handler = async () => {
  n++;
  globalThis.leak = (globalThis.leak || 0) + 1;
  const big = new Array(20000).fill(0).map((_, i) => 'x' + i); // dirties many pages
  const b = new Uint8Array(8);
  crypto.getRandomValues(b);
  return { n, leak: globalThis.leak, len: big.length, r: Math.random(), g: Array.from(b).join(','), id: crypto.randomUUID() };
};`)
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		res, err := runJS(t, r, m, Execution{Event: jsEvent(t, MediaJSON, nil)})
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			N, Leak, Len int
			R            float64
			G, ID        string
		}
		if err := json.Unmarshal(res.Envelope.Result, &out); err != nil {
			t.Fatal(err)
		}
		if out.N != 1 || out.Leak != 1 || out.Len != 20000 {
			t.Fatalf("execution %d saw state of an earlier one: %+v", i, out)
		}
		if out.R <= 0 || out.R >= 1 || len(out.ID) != 36 {
			t.Fatalf("execution %d: %+v", i, out)
		}
		for _, v := range []string{strconv.FormatFloat(out.R, 'g', -1, 64), out.G, out.ID} {
			if seen[v] {
				t.Fatalf("execution %d repeated a random value %q of an earlier execution", i, v)
			}
			seen[v] = true
		}
	}
}

// TestJSUnavailable: a build without the engine still runs WebAssembly and
// answers JavaScript with ErrJSUnavailable, which names the build step.
func TestJSUnavailable(t *testing.T) {
	r, err := New(context.Background(), Config{noJS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	if _, err := r.CompileJS(context.Background(), []byte("exports.handler = () => 1;"), "x.js"); !errors.Is(err, ErrJSUnavailable) || !strings.Contains(err.Error(), "make js") {
		t.Fatalf("CompileJS = %v", err)
	}
	m, err := r.Compile(context.Background(), fixture(t, "echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Execute(context.Background(), m, Execution{Event: jsEvent(t, MediaJSON, "x")}); err != nil {
		t.Fatal(err)
	}
}
