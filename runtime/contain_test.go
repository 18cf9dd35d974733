package runtime

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goruntime "runtime"

	"github.com/sandbot/sandbot/limits"
)

// Hostile modules: each shape below once took the server's memory or time
// (issue 11). The module budget refuses them at deploy, naming the limit;
// the instrumentation stops the ones it accepts.

func compileErr(t *testing.T, r *Runtime, wasm []byte) *ModuleError {
	t.Helper()
	_, err := r.Compile(context.Background(), wasm)
	var me *ModuleError
	if !errors.As(err, &me) {
		t.Fatalf("want *ModuleError, got %v", err)
	}
	return me
}

// localsDecl declares n locals of type t in groups of at most 2^32-1.
func localsDecl(groups ...[2]uint32) []byte {
	b := uleb(uint32(len(groups)))
	for _, g := range groups {
		b = append(b, uleb(g[0])...)
		b = append(b, byte(g[1]))
	}
	return b
}

func nested(depth int) []byte {
	var b []byte
	for range depth {
		b = append(b, 0x02, 0x40)
	}
	for range depth {
		b = append(b, 0x0b)
	}
	return append(b, 0x0b)
}

func brTable(targets int) []byte {
	b := []byte{0x02, 0x40, 0x41, 0x00, 0x0e}
	b = append(b, uleb(uint32(targets-1))...)
	for range targets {
		b = append(b, 0x00)
	}
	return append(b, 0x0b, 0x0b)
}

func TestModuleBudget(t *testing.T) {
	r := testRuntime(t)
	d := limits.Default()
	manyFuncs := func(n int) testModule {
		var tm testModule
		for range n {
			tm.funcs = append(tm.funcs, testFunc{typ: 2, code: []byte{0x0b}})
		}
		return tm
	}
	bigBody := testModule{funcs: []testFunc{{typ: 2, code: append(bytes.Repeat([]byte{0x01}, int(d.ModuleFunctionBytes)), 0x0b)}}}
	manyLocals := testModule{}
	for range 21 {
		manyLocals.funcs = append(manyLocals.funcs, testFunc{typ: 2, locals: localsDecl([2]uint32{50_000, tI64}), code: []byte{0x0b}})
	}
	hugeTables := testModule{}
	for range 8 {
		hugeTables.tables = append(hugeTables.tables, wcat([]byte{0x70, 0x00}, uleb(100_000_000)))
	}
	cases := []struct {
		name string
		wasm []byte
		want string
	}{
		// 116 bytes that declared 4·10⁹ locals killed the process (OOM).
		{"4e9 locals", testModule{funcs: []testFunc{{typ: 2, locals: localsDecl([2]uint32{0xffffffff, tI64}, [2]uint32{0xffffffff, tI64}), code: []byte{0x0b}}}}.build(),
			"locals, over the limit of 50000 per function"},
		{"1e8 locals", testModule{funcs: []testFunc{{typ: 2, locals: localsDecl([2]uint32{100_000_000, tI32}), code: []byte{0x0b}}}}.build(),
			"over the limit of 50000 per function"},
		{"locals in all", manyLocals.build(), "locals in all, over the limit of 1000000 per module"},
		{"br_table of 1e6 targets", testModule{funcs: []testFunc{{typ: 2, code: brTable(1_000_000)}}}.build(),
			"br_table of 1000000 targets, over the limit of 65520"},
		{"nesting", testModule{funcs: []testFunc{{typ: 2, code: nested(10_001)}}}.build(), "nests blocks deeper than the limit of 10000"},
		{"functions", manyFuncs(100_000).build(), "100002 functions, over the limit of 100000"},
		{"body size", bigBody.build(), "over the limit of 2097152 bytes per function"},
		{"8 tables of 1e8", hugeTables.build(), "tables declare 800000000 elements (initial and maximum sizes together), over the limit of 100000"},
		{"table maximum counts", testModule{tables: [][]byte{wcat([]byte{0x70, 0x01, 0x01}, uleb(200_000))}}.build(), "over the limit of 100000"},
		{"globals", testModule{globals: bytes.Split(bytes.Repeat([]byte{0x7f, 0x00, 0x41, 0x00, 0x0b, '|'}, 10_001), []byte{'|'})[:10_001]}.build(),
			"10001 globals, over the limit of 10000"},
		{"type arity", testModule{types: [][]byte{functype(bytes.Repeat([]byte{tI32}, 129), nil)}}.build(), "129 parameters, over the limit of 128"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			me := compileErr(t, r, c.wasm)
			if !strings.Contains(me.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", me, c.want)
			}
			t.Logf("%d-byte module refused in %v: %s", len(c.wasm), time.Since(start), me)
		})
	}
}

func TestModuleBudgetDataBytes(t *testing.T) {
	r, err := New(context.Background(), Config{Limits: limits.Limits{BotMemoryBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	seg := wcat([]byte{0x01}, uleb(2<<20), make([]byte, 2<<20)) // passive, 2 MiB
	me := compileErr(t, r, testModule{data: wcat(uleb(1), seg), raw: nil}.build())
	if !strings.Contains(me.Error(), "data segments hold 2097152 bytes, over the memory limit of 1048576 bytes") {
		t.Fatal(me)
	}
}

// TestIndexPastModuleRefused: the rewrite appends a function, two globals,
// types and a local; an instruction naming one index past the module's own
// would come to name them (a bot resetting its own fuel), so it is refused.
func TestIndexPastModuleRefused(t *testing.T) {
	r := testRuntime(t)
	for name, code := range map[string][]byte{
		"global.set past the globals": {0x41, 0x00, 0x24, 0x00, 0x0b},                    // no globals: index 0 is the fuel
		"call past the functions":     {0x10, 0x03, 0x0b},                                // 3 functions
		"local past the locals":       {0x41, 0x00, 0x21, 0x00, 0x0b},                    // no params, no locals
		"block type past the types":   {0x02, 0x03, 0x0b, 0x0b},                          // 3 types
		"call_indirect past types":    {0x41, 0x00, 0x11, 0x03, 0x00, 0x0b},              // 3 types
		"memory.fill without memory":  {0x41, 0x00, 0x41, 0x00, 0x41, 0x00, 0xfc, 11, 1}, // memory 1
	} {
		t.Run(name, func(t *testing.T) {
			me := compileErr(t, r, testModule{funcs: []testFunc{{typ: 2, code: code}}}.build())
			if !strings.Contains(me.Error(), "invalid module") {
				t.Fatal(me)
			}
		})
	}
}

func TestCallTreeStopsAtDeadline(t *testing.T) {
	r := testRuntime(t)
	m, err := r.Compile(context.Background(), callTree(32).build())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`), Limits: Limits{Timeout: 300 * time.Millisecond}})
	mustFail(t, res, err, FailTimeout)
	t.Logf("2^32-call tree with a 300 ms deadline stopped after %v", time.Since(start))
}

// TestStartFunctionBounded: a runaway wasm start function runs during
// instantiation, under the same deadline.
func TestStartFunctionBounded(t *testing.T) {
	r := testRuntime(t)
	tm := callTree(32)
	start := uint32(2)
	tm.start = &start
	m, err := r.Compile(context.Background(), tm.build())
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`), Limits: Limits{Timeout: 300 * time.Millisecond}})
	mustFail(t, res, err, FailTimeout)
}

// TestGCNotHeldByGuest: a garbage collection started while a call tree runs
// finishes long before the tree's deadline. Compiled WebAssembly is not
// preemptible: before the yields, the collection's stop-the-world waited for
// the guest to return.
func TestGCNotHeldByGuest(t *testing.T) {
	r := testRuntime(t)
	m, err := r.Compile(context.Background(), callTree(40).build())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan time.Time, 1)
	go func() {
		_, _ = r.Execute(context.Background(), m, Execution{Event: []byte(`{}`), Limits: Limits{Timeout: 5 * time.Second}})
		done <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	runtimeGC()
	gcDone := time.Now()
	ended := <-done
	t.Logf("GC during the call tree took %v; the tree ended %v later", gcDone.Sub(start), ended.Sub(gcDone))
	if !gcDone.Before(ended) {
		t.Fatalf("the garbage collection waited for the guest (GC %v, guest ended %v after the GC started)", gcDone.Sub(start), ended.Sub(start))
	}
}

func TestDeepRecursionFailsCleanly(t *testing.T) {
	r := testRuntime(t)
	// Function 2 calls itself forever, with locals to make frames count.
	tm := testModule{handle: []byte{0x10, 2, 0x42, 0x00, 0x0b}}
	tm.funcs = []testFunc{{typ: 2, locals: localsDecl([2]uint32{16, tI64}), code: []byte{0x10, 2, 0x0b}}}
	m, err := r.Compile(context.Background(), tm.build())
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`)})
	f := mustFail(t, res, err, FailStack)
	if !strings.Contains(f.Message, "call stack limit of 8388608 bytes") {
		t.Fatal(f.Message)
	}
}

func runtimeGC() { goruntime.GC() }

// expensiveToCompile is within the module budget (119 KB, 50,000 locals,
// one br_table of 60,000 targets into 200 nested blocks, 5,000 locals
// moved around in a loop) and costs wazero's compiler about 8 s of CPU and
// 165 MB.
func expensiveToCompile() []byte {
	const depth, targets = 200, 60_000
	code := []byte{0x03, 0x40} // loop
	for range depth {
		code = append(code, 0x02, 0x40)
	}
	for i := range 5000 {
		code = append(code, 0x20)
		code = append(code, uleb(uint32(i*10))...)
		code = append(code, 0x21)
		code = append(code, uleb(uint32(i*10+1))...)
	}
	code = append(code, 0x41, 0x00, 0x0e)
	code = append(code, uleb(targets-1)...)
	for i := range targets {
		code = append(code, uleb(uint32(i%(depth+1)))...)
	}
	for range depth + 2 {
		code = append(code, 0x0b)
	}
	return testModule{funcs: []testFunc{{typ: 2, locals: localsDecl([2]uint32{50_000, tI64}), code: code}}}.build()
}

// TestCompileCeiling: a module the budget accepts but whose compilation
// blows up is stopped at the compile CPU time or memory ceiling (the child
// process is killed); it is refused, and the runtime goes on.
func TestCompileCeiling(t *testing.T) {
	for _, c := range []struct {
		name string
		lim  limits.Limits
		wasm []byte
		want string
	}{
		{"cpu", limits.Limits{CompileCPUSeconds: 1}, expensiveToCompile(), "over the compile CPU time limit of 1 s"},
		{"memory", limits.Limits{CompileMemoryBytes: 16 << 20}, expensiveToCompile(), "over the compile memory limit of 16777216 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(context.Background(), Config{Limits: c.lim})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close(context.Background())
			start := time.Now()
			me := compileErr(t, r, c.wasm)
			u := r.lastChild.Load()
			t.Logf("refused after %v (child CPU %v, peak RSS %d MiB): %s", time.Since(start), u.cpu, u.maxRSS>>20, me)
			if !strings.Contains(me.Error(), c.want) {
				t.Fatal(me)
			}
			m := compileFixture(t, r, "echo.wasm")
			if _, err := r.Execute(context.Background(), m, Execution{Event: event("after")}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCompileCanceledWhenCallersLeave: a compilation nobody waits for any
// more is stopped (its child killed), not left running.
func TestCompileCanceledWhenCallersLeave(t *testing.T) {
	r, err := New(context.Background(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	wasm := expensiveToCompile()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := r.Compile(ctx, wasm); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// The flight is gone and the child with it: the slot is free again.
	for len(r.compileSlots) > 0 {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the compilation still holds its slot 5 s after its only caller left")
		}
		time.Sleep(10 * time.Millisecond)
	}
	u := r.lastChild.Load()
	t.Logf("child stopped %v after the start, after %v of CPU", time.Since(start), u.cpu)
	r.mu.RLock()
	defer r.mu.RUnlock()
	if len(r.flights) != 0 {
		t.Fatalf("%d flights left", len(r.flights))
	}
}

// TestCompileQueueFull: beyond the slots and the queue, Compile answers
// *BusyError at once.
func TestCompileQueueFull(t *testing.T) {
	r, err := New(context.Background(), Config{Limits: limits.Limits{CompileConcurrency: 1, CompileQueue: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Compile(ctx, expensiveToCompile())
	for len(r.compileSlots) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	_, err = r.Compile(context.Background(), fixture(t, "echo.wasm"))
	var busy *BusyError
	if !errors.As(err, &busy) || busy.RetryAfter <= 0 {
		t.Fatalf("want *BusyError, got %v", err)
	}
}
