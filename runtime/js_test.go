package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/testtiming"
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
	big := make([]byte, r.cfg.Limits.ModuleBytes+1)
	if _, err := r.CompileJS(context.Background(), big, "big.js"); !errors.As(err, &me) || !strings.Contains(me.Reason, "over the limit") {
		t.Fatalf("code over the size limit: %v", err)
	}
	_, err = r.CompileJS(context.Background(), []byte("exports.handler = ) 1"), "first.js")
	if !errors.As(err, &me) || me.Line != 1 || me.Column < 1 || me.Column > 20 {
		t.Fatalf("first-line error %+v (%v)", me, err)
	}
}

// TestJSTimeout: every shape of JavaScript stops at its deadline. The
// runtime has no close-on-context-done (engineConfig): JavaScript loops stop
// at QuickJS's interrupt hook or at a yield of the engine's fuel
// instrumentation, whichever comes first, and a builtin that loops in C
// without polling the hook only at a yield.
func TestJSTimeout(t *testing.T) {
	r := jsRuntime(t)
	for name, code := range map[string]string{
		"loop":  `exports.handler = () => { for (;;) {} };`,
		"while": `exports.handler = () => { while (true) {} };`,
		"await": `exports.handler = async () => { for (;;) { await null; } };`,
		// A builtin looping in C over an array-like of length 2^53 (it
		// polls the interrupt hook).
		"builtin": `exports.handler = () => Array.prototype.indexOf.call({ length: 2 ** 53 }, 1);`,
		// A builtin looping in C 2^32 times without polling the interrupt
		// hook and without allocating: only fuel stops it (it was still
		// running after 4 s with the yields' deadline check taken out).
		"join": `exports.handler = () => Array(2 ** 32 - 1).join('');`,
	} {
		t.Run(name, func(t *testing.T) {
			m := compileJS(t, r, code)
			start := time.Now()
			_, err := runJS(t, r, m, Execution{Event: jsEvent(t, MediaJSON, nil), Limits: Limits{Timeout: 300 * time.Millisecond}})
			var f *Failure
			if !errors.As(err, &f) || f.Kind != FailTimeout {
				t.Fatalf("err = %v, want a timeout", err)
			}
			if d, bound := time.Since(start), testtiming.Bound(300*time.Millisecond, time.Second); d > bound {
				t.Fatalf("took %v, over %v", d, bound)
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

// BenchmarkJSHL7: a JavaScript bot given an HL7 v2 message (the HL7
// feed's benchmark message), which the bridge parses into an Hl7Message
// before the handler runs: "input" answers one field of it, "ack" answers
// event.input.buildAck(), as the HL7 feed's benchmark bot does.
//
//	go test ./runtime -run '^$' -bench JSHL7 -benchtime 1000x
func BenchmarkJSHL7(b *testing.B) {
	r := jsRuntime(b)
	msg := "MSH|^~\\&|SEND|FAC|RECV|FAC|20250101120000||ADT^A08^ADT_A01|ctl-1|P|2.5\rEVN|A08|20250101120000\rPID|1||PAT1^^^MRN^MR||Doe^Jane||19800101|F\r"
	ev := jsEvent(b, MediaHL7, msg)
	for _, c := range []struct{ name, code, want string }{
		{"input", `exports.handler = async (medplum, event) => event.input.getSegment('PID').getField(3).toString();`, "PAT1^^^MRN^MR"},
		{"ack", `exports.handler = async (medplum, event) => event.input.buildAck();`, "MSA|AA|ctl-1"},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := compileJS(b, r, c.code)
			for b.Loop() {
				res, err := r.Execute(context.Background(), m, Execution{Event: ev})
				if err != nil || !strings.Contains(string(res.Envelope.Result), c.want) {
					b.Fatal(err, res)
				}
			}
		})
	}
}

// TestJSDeepRecursion: JavaScript recursion meets QuickJS's own stack limit,
// a RangeError the bot can catch; recursion through C (JSON.stringify of a
// structure nested 10^5 deep) may meet the engine's call depth limit first,
// which ends the execution as a stack failure. Either way the bot's next
// execution runs.
func TestJSDeepRecursion(t *testing.T) {
	r := jsRuntime(t)
	caught := compileJS(t, r, `const f = (n) => f(n + 1) + 1;
exports.handler = () => { try { f(0); } catch (e) { return { e: String(e) }; } };`)
	res, err := runJS(t, r, caught, Execution{Event: jsEvent(t, MediaJSON, nil)})
	if err != nil || string(res.Envelope.Result) != `{"e":"RangeError: Maximum call stack size exceeded"}` {
		t.Fatalf("JavaScript recursion: %v %s", err, res.Envelope.Result)
	}
	deep := compileJS(t, r, `let o = {}; for (let i = 0; i < 1e5; i++) o = { o };
exports.handler = (medplum, event) => event.input === 'deep' ? JSON.stringify(o).length : 'shallow';`)
	res, err = runJS(t, r, deep, Execution{Event: jsEvent(t, MediaJSON, "deep")})
	f := mustFail(t, res, err, FailStack)
	if want := fmt.Sprintf("call stack limit of %d bytes", r.jsStackBytes()); !strings.Contains(f.Message, want) {
		t.Fatalf("message %q, want %q", f.Message, want)
	}
	res, err = runJS(t, r, deep, Execution{Event: jsEvent(t, MediaJSON, "flat")})
	if err != nil || string(res.Envelope.Result) != `"shallow"` {
		t.Fatalf("after the stack failure: %v %s", err, res.Envelope.Result)
	}
}

// TestJSInstanceCounters: the engine is instrumented (its fuel and call
// depth globals exist), a clean execution leaves the call depth at 0, and
// an instance kept for the next execution starts with full fuel.
func TestJSInstanceCounters(t *testing.T) {
	r := jsRuntime(t)
	m := compileJS(t, r, `const f = (n) => n === 0 ? 0 : 1 + f(n - 1);
exports.handler = () => { let s = 0; for (let i = 0; i < 1e3; i++) s += f(100); return s; };`)
	res, err := runJS(t, r, m, Execution{Event: jsEvent(t, MediaJSON, nil)})
	if err != nil || string(res.Envelope.Result) != `100000` {
		t.Fatalf("%v %s", err, res.Envelope.Result)
	}
	inst := m.js.get()
	if inst == nil {
		t.Fatal("no instance kept after a clean execution")
	}
	if d := inst.depth.Get(); d != 0 {
		t.Fatalf("call depth %d after a clean execution, want 0", d)
	}
	if f := int32(inst.fuel.Get()); f == yieldFuel {
		t.Fatalf("fuel %d untouched by 10^5 calls: the engine is not charged", f)
	}
	inst.reset(m.js.img.sp)
	if f := inst.fuel.Get(); f != yieldFuel {
		t.Fatalf("fuel %d after reset, want %d", f, yieldFuel)
	}
	m.js.put(inst)
}

// BenchmarkJSCompute: JavaScript that computes, per loop iteration: an
// empty-bodied counting loop of 10^6 iterations, and 10^5 pushes of a small
// object (what the instrumentation and the deadline checks cost the
// interpreter; see RATIONALE.md, "What it costs").
func BenchmarkJSCompute(b *testing.B) {
	r := jsRuntime(b)
	for _, c := range []struct {
		name, code string
		n          float64
	}{
		{"loop", `exports.handler = async () => { let s = 0; for (let i = 0; i < 1e6; i++) { s += i; } return { s }; };`, 1e6},
		{"push", `exports.handler = async () => { const a = []; for (let i = 0; i < 1e5; i++) { a.push({ i, s: 'x' }); } return { n: a.length }; };`, 1e5},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := compileJS(b, r, c.code)
			ev := jsEvent(b, MediaJSON, nil)
			b.ResetTimer()
			for b.Loop() {
				res, err := r.Execute(context.Background(), m, Execution{Event: ev, Limits: Limits{Timeout: time.Minute}})
				if err != nil || len(res.Envelope.Result) == 0 {
					b.Fatal(err, res)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/c.n, "ns/iteration")
		})
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

// TestJSGlobals checks the polyfills and globals a bot sees against what
// Node (the reference's vm context) gives for the same expressions; each
// check is [expression, expected JSON].
func TestJSGlobals(t *testing.T) {
	r := jsRuntime(t)
	checks := [][2]string{
		{`typeof require('@medplum/core').MedplumClient`, `"function"`},
		{`[typeof Hl7Message, typeof MedplumClient, ContentType.JSON]`, `["function","function","application/json"]`},
		{`(() => { try { require('fs'); } catch (e) { return e.message.includes('only @medplum/core'); } })()`, `true`},
		// URL
		{`new URL('https://Example.COM:443/a/./b/../c?x=1#f').href`, `"https://example.com/a/c?x=1#f"`},
		{`new URL('Patient?name=a b', 'http://localhost:8103/fhir/R4/').href`, `"http://localhost:8103/fhir/R4/Patient?name=a%20b"`},
		{`new URL('../x', 'http://h/a/b/c').href`, `"http://h/a/x"`},
		{`new URL('/abs', 'http://h:81/a/b').href`, `"http://h:81/abs"`},
		{`new URL('//other/p', 'https://h/a').href`, `"https://other/p"`},
		{`new URL('?q=1', 'http://h/a/b').href`, `"http://h/a/b?q=1"`},
		{`(() => { const u = new URL('http://u:p@h:8080/p?a=1&b=2'); return [u.protocol, u.username, u.password, u.host, u.hostname, u.port, u.pathname, u.search, u.origin]; })()`,
			`["http:","u","p","h:8080","h","8080","/p","?a=1&b=2","http://h:8080"]`},
		{`(() => { const u = new URL('http://h/p?a=1'); u.searchParams.append('b', 'x y'); return u.href; })()`, `"http://h/p?a=1&b=x+y"`},
		{`[URL.canParse('nope'), URL.canParse('http://h/')]`, `[false,true]`},
		{`(() => { try { new URL('nope'); } catch (e) { return e instanceof TypeError; } })()`, `true`},
		// URLSearchParams
		{`new URLSearchParams({ a: '1', b: 'x&y' }).toString()`, `"a=1&b=x%26y"`},
		{`(() => { const p = new URLSearchParams('?a=1&a=2&b=%20c+d'); return [p.getAll('a'), p.get('b'), p.has('c'), p.size]; })()`, `[["1","2"]," c d",false,3]`},
		{`(() => { const p = new URLSearchParams([['b','2'],['a','1'],['b','1']]); p.sort(); p.set('c','3'); p.delete('a'); return [...p]; })()`, `[["b","2"],["b","1"],["c","3"]]`},
		// TextEncoder / TextDecoder
		{`Array.from(new TextEncoder().encode('aé€😀'))`, `[97,195,169,226,130,172,240,159,152,128]`},
		{`new TextDecoder().decode(new TextEncoder().encode('aé€😀'))`, `"aé€😀"`},
		{`new TextDecoder().decode(new Uint8Array([0xef,0xbb,0xbf,0x61,0xff,0x62,0xe2,0x82]))`, "\"a\ufffdb\ufffd\""},
		{`(() => { try { new TextDecoder('utf-8', { fatal: true }).decode(new Uint8Array([0xc3])); } catch (e) { return e instanceof TypeError; } })()`, `true`},
		// Headers, Request, Response
		{`(() => { const h = new Headers({ 'Content-Type': 'a' }); h.append('X-A', '1'); h.append('x-a', '2'); return [h.get('content-type'), h.get('X-A'), [...h.keys()]]; })()`, `["a","1, 2",["content-type","x-a"]]`},
		{`(async () => { const r = Response.json({ a: 1 }, { status: 201 }); return [r.status, r.ok, r.headers.get('content-type'), await r.json()]; })()`, `[201,true,"application/json",{"a":1}]`},
		{`(async () => { const q = new Request('http://h/x', { method: 'post', body: 'hi' }); return [q.method, q.url, await q.text()]; })()`, `["POST","http://h/x","hi"]`},
		// Timers run in order of their due time, and an awaited one sleeps.
		{`new Promise((resolve) => { const out = []; setTimeout(() => out.push(2), 20); setTimeout(() => out.push(1), 5); const i = setInterval(() => { out.push('i'); if (out.filter((x) => x === 'i').length === 2) clearInterval(i); }, 1); setTimeout(() => resolve(out.filter((x) => x !== 'i').concat(out.filter((x) => x === 'i').length)), 40); })`, `[1,2,2]`},
		{`(async () => { const t = Date.now(); await new Promise((r) => setTimeout(r, 50)); return Date.now() - t >= 45; })()`, `true`},
		// structuredClone, crypto, Math.random
		{`(() => { const d = new Date(0); const c = structuredClone({ d, m: new Map([[1, { x: [1] }]]) }); return [c.d instanceof Date && c.d !== d, c.m.get(1).x[0]]; })()`, `[true,1]`},
		{`[crypto.randomUUID().length, crypto.getRandomValues(new Uint32Array(4)).length, Math.random() < 1]`, `[36,4,true]`},
		{`(() => { try { crypto.getRandomValues(new Uint8Array(70000)); } catch (e) { return e instanceof RangeError; } })()`, `true`},
		// fetch: only the FHIR base.
		{`fetch('https://example.com/').catch((e) => e.message.includes('no network'))`, `true`},
		{`fetch('http://localhost:8103/auth/me').catch((e) => e instanceof TypeError)`, `true`},
		{`fetch('http://localhost:8103/fhir/R4/Patient/1').then((r) => r.status)`, `501`},
		// console formats like Node for the common cases.
		{`(console.log('%s is %d', 'x', 42, { a: 1 }), true)`, `true`},
	}
	var b strings.Builder
	b.WriteString("const checks = [\n")
	for _, c := range checks {
		b.WriteString("  async () => " + c[0] + ",\n")
	}
	b.WriteString("];\nexports.handler = async () => { const out = []; for (const c of checks) { try { out.push(JSON.stringify(await c())); } catch (e) { out.push('threw ' + e); } } return out; };\n")
	m := compileJS(t, r, b.String())
	res, err := runJS(t, r, m, Execution{Event: jsEvent(t, MediaJSON, nil)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := json.Unmarshal(res.Envelope.Result, &got); err != nil || len(got) != len(checks) {
		t.Fatalf("result %s: %v", res.Envelope.Result, err)
	}
	for i, c := range checks {
		if got[i] != c[1] {
			t.Errorf("%s\n  = %s, want %s", c[0], got[i], c[1])
		}
	}
	if len(res.Logs) != 1 || res.Logs[0].Text != `x is 42 {"a":1}` {
		t.Errorf("console: %+v", res.Logs)
	}
}

// TestJSModuleSyntax: an ES module exporting handler, importing from
// @medplum/core, runs like CommonJS; an import of anything else is refused
// at deploy.
func TestJSModuleSyntax(t *testing.T) {
	r := jsRuntime(t)
	m := compileJS(t, r, `import { getReferenceString, Hl7Message as H } from '@medplum/core';
import core from '@medplum/core';
export async function handler(medplum, event) {
  return { ref: getReferenceString({ resourceType: 'Patient', id: '1' }), same: H === core.Hl7Message, ct: event.contentType };
}`)
	res, err := runJS(t, r, m, Execution{Event: jsEvent(t, MediaJSON, nil)})
	if err != nil || string(res.Envelope.Result) != `{"ref":"Patient/1","same":true,"ct":"application/json"}` {
		t.Fatalf("%v %s", err, res.Envelope.Result)
	}
	_, err = r.CompileJS(context.Background(), []byte("import x from 'lodash';\nexport const handler = () => x;\n"), "esm.js")
	var me *ModuleError
	if !errors.As(err, &me) || !strings.Contains(me.Reason, "lodash") {
		t.Fatalf("import lodash: %v", err)
	}
	_, err = r.CompileJS(context.Background(), []byte("export const notHandler = 1;\n"), "esm.js")
	if !errors.As(err, &me) || !strings.Contains(me.Reason, "handler") {
		t.Fatalf("no handler: %v", err)
	}
}

// TestJSConcurrentExecutions: executions of two bots running at once, on
// instances restored again and again, each see only their own input and the
// image's state.
func TestJSConcurrentExecutions(t *testing.T) {
	r := jsRuntime(t)
	m := compileJS(t, r, `let n = 0; exports.handler = async (medplum, event) => { n++; const a = new Array(1000).fill(event.input.k); return { n, k: a[999] }; };`)
	trivial := compileJS(t, r, `exports.handler = async () => ({ ok: true });`)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				res, err := r.Execute(context.Background(), m, Execution{Event: jsEvent(t, MediaJSON, map[string]int{"k": i})})
				if want := fmt.Sprintf(`{"n":1,"k":%d}`, i); err != nil || string(res.Envelope.Result) != want {
					t.Errorf("goroutine %d, execution %d: %v %s, want %s", g, i, err, res.Envelope.Result, want)
					return
				}
				res, err = r.Execute(context.Background(), trivial, Execution{Event: jsEvent(t, MediaJSON, nil)})
				if err != nil || string(res.Envelope.Result) != `{"ok":true}` {
					t.Errorf("trivial, goroutine %d, execution %d: %v", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
