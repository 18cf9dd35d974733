package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/sandbot/sandbot/internal/testtiming"
	"github.com/sandbot/sandbot/internal/wasmtest"
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

func TestModuleBudget(t *testing.T) {
	r := testRuntime(t)
	d := limits.Default()
	manyFuncs := func(n int) wasmtest.Module {
		var tm wasmtest.Module
		for range n {
			tm.Funcs = append(tm.Funcs, wasmtest.Func{Type: 2, Code: []byte{0x0b}})
		}
		return tm
	}
	bigBody := wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Code: append(bytes.Repeat([]byte{0x01}, int(d.ModuleFunctionBytes)), 0x0b)}}}
	manyLocals := wasmtest.Module{}
	for range 21 {
		manyLocals.Funcs = append(manyLocals.Funcs, wasmtest.Func{Type: 2, Locals: wasmtest.Locals([2]uint32{50_000, wasmtest.I64}), Code: []byte{0x0b}})
	}
	cases := []struct {
		name string
		wasm []byte
		want string
	}{
		// 116 bytes that declared 4·10⁹ locals killed the process (OOM).
		{"4e9 locals", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Locals: wasmtest.Locals([2]uint32{0xffffffff, wasmtest.I64}, [2]uint32{0xffffffff, wasmtest.I64}), Code: []byte{0x0b}}}}.Build(),
			"locals, over the limit of 50000 per function"},
		{"1e8 locals", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Locals: wasmtest.Locals([2]uint32{100_000_000, wasmtest.I32}), Code: []byte{0x0b}}}}.Build(),
			"over the limit of 50000 per function"},
		{"locals in all", manyLocals.Build(), "locals in all, over the limit of 1000000 per module"},
		{"br_table of 1e6 targets", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Code: wasmtest.BrTable(1_000_000)}}}.Build(),
			"br_table of 1000000 targets, over the limit of 65520"},
		{"nesting", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Code: wasmtest.Nested(10_001)}}}.Build(), "nests blocks deeper than the limit of 10000"},
		{"functions", manyFuncs(100_000).Build(), "100002 functions, over the limit of 100000"},
		{"body size", bigBody.Build(), "over the limit of 2097152 bytes per function"},
		{"8 tables of 1e8", wasmtest.HugeTables(8, 100_000_000), "tables declare 800000000 elements (initial and maximum sizes together), over the limit of 100000"},
		{"table maximum counts", wasmtest.Module{Tables: [][]byte{wasmtest.Cat([]byte{0x70, 0x01, 0x01}, wasmtest.ULEB(200_000))}}.Build(), "over the limit of 100000"},
		{"globals", wasmtest.Module{Globals: bytes.Split(bytes.Repeat([]byte{0x7f, 0x00, 0x41, 0x00, 0x0b, '|'}, 10_001), []byte{'|'})[:10_001]}.Build(),
			"10001 globals, over the limit of 10000"},
		{"type arity", wasmtest.Module{Types: [][]byte{wasmtest.FuncType(bytes.Repeat([]byte{wasmtest.I32}, 129), nil)}}.Build(), "129 parameters, over the limit of 128"},
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
	seg := wasmtest.Cat([]byte{0x01}, wasmtest.ULEB(2<<20), make([]byte, 2<<20)) // passive, 2 MiB
	me := compileErr(t, r, wasmtest.Module{Data: wasmtest.Cat(wasmtest.ULEB(1), seg)}.Build())
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
			me := compileErr(t, r, wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Code: code}}}.Build())
			if !strings.Contains(me.Error(), "invalid module") {
				t.Fatal(me)
			}
		})
	}
}

func TestCallTreeStopsAtDeadline(t *testing.T) {
	r := testRuntime(t)
	m, err := r.Compile(context.Background(), wasmtest.CallTree(32).Build())
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
	tm := wasmtest.CallTree(32)
	start := uint32(2)
	tm.Start = &start
	m, err := r.Compile(context.Background(), tm.Build())
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
	m, err := r.Compile(context.Background(), wasmtest.CallTree(40).Build())
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
	tm := wasmtest.Module{Handle: []byte{0x10, 2, 0x42, 0x00, 0x0b}}
	tm.Funcs = []wasmtest.Func{{Type: 2, Locals: wasmtest.Locals([2]uint32{16, wasmtest.I64}), Code: []byte{0x10, 2, 0x0b}}}
	m, err := r.Compile(context.Background(), tm.Build())
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
		{"cpu", limits.Limits{CompileCPUSeconds: 1}, wasmtest.ExpensiveToCompile(), "over the compile CPU time limit of 1 s"},
		{"memory", limits.Limits{CompileMemoryBytes: 16 << 20}, wasmtest.ExpensiveToCompile(), "over the compile memory limit of 16777216 bytes"},
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
			// This process, the server, goes on. (Not with these ceilings: a
			// 16 MiB one may be too little for any module.)
			shared := testRuntime(t)
			m := compileFixture(t, shared, "echo.wasm")
			if _, err := shared.Execute(context.Background(), m, Execution{Event: event("after")}); err != nil {
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
	wasm := wasmtest.ExpensiveToCompile()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := r.Compile(ctx, wasm); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// The flight is gone and the child with it: the slot is free again.
	for len(r.compileSlots) > 0 {
		// A compilation left to finish holds the slot for about 8 s of CPU.
		if bound := testtiming.Limit(5*time.Second, 5*time.Second+testtiming.Slack); time.Since(start) > bound {
			t.Fatalf("the compilation still holds its slot %v after its only caller left", bound)
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
	go r.Compile(ctx, wasmtest.ExpensiveToCompile())
	for len(r.compileSlots) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	_, err = r.Compile(context.Background(), fixture(t, "echo.wasm"))
	var busy *BusyError
	if !errors.As(err, &busy) || busy.RetryAfter <= 0 {
		t.Fatalf("want *BusyError, got %v", err)
	}
}

// TestLogFloodStops: a loop of empty log lines, through sandbot.log or a
// WASI fd_write of a million empty iovecs, fails once it has written the
// log write limit's worth (every line or write counting at least 64 bytes),
// long before its deadline, and keeps the host's memory flat.
func TestLogFloodStops(t *testing.T) {
	r := testRuntime(t)
	for name, wasm := range map[string][]byte{"sandbot.log": wasmtest.LogFlood(), "fd_write of empty iovecs": wasmtest.IovecFlood()} {
		t.Run(name, func(t *testing.T) {
			m, err := r.Compile(context.Background(), wasm)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`), Limits: Limits{Timeout: 20 * time.Second}})
			f := mustFail(t, res, err, FailOutput)
			t.Logf("stopped after %v: %s", time.Since(start), f.Message)
			if !strings.Contains(f.Message, "wrote more than 8388608 bytes of log") {
				t.Fatal(f.Message)
			}
			if bound := testtiming.Limit(10*time.Second, 15*time.Second); time.Since(start) > bound {
				t.Fatalf("the flood ran %v (over %v), on towards its 20 s deadline", time.Since(start), bound)
			}
		})
	}
}

// TestAdmission: executions hold their memory against the node's budget
// and their project's share; one that does not fit is refused at once.
func TestAdmission(t *testing.T) {
	// Reservation of the tight loop: 64 KiB declared (no maximum: the
	// 1 MiB limit), stack, output, log.
	lim := limits.Limits{BotMemoryBytes: 1 << 20, BotStackBytes: 1 << 20, BotOutputBytes: 1 << 20, BotLogBytes: 1 << 10}
	per := uint64(1<<20 + 1<<20 + 2<<20 + 4<<10 + 8) // + the table's 8 bytes
	lim.ExecutionMemoryBytes = int64(3 * per)
	lim.ProjectExecutionPercent = 67 // two executions of one project
	r, err := New(context.Background(), Config{Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	m, err := r.Compile(context.Background(), wasmtest.Reactor(wasmtest.TightLoopBody))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.reservation(m, r.limits(Limits{})); got != per {
		t.Fatalf("reservation %d, want %d", got, per)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(tenant string) error {
		_, err := r.Execute(ctx, m, Execution{Event: []byte(`{}`), Tenant: tenant, Limits: Limits{Timeout: time.Minute}})
		return err
	}
	done := make(chan error, 3)
	for _, tenant := range []string{"a", "a", "b"} {
		go func() { done <- run(tenant) }()
		for r.admission.reserved() == 0 || r.admission.reserved()%per != 0 || r.admission.reserved() < per*uint64(len(done)+1) {
			time.Sleep(time.Millisecond)
			if r.admission.reserved() >= 3*per {
				break
			}
		}
	}
	for r.admission.reserved() < 3*per {
		time.Sleep(time.Millisecond)
	}
	var busy *BusyError
	if err := run("c"); !errors.As(err, &busy) || !strings.Contains(busy.Reason, "Too many bot executions") || busy.RetryAfter <= 0 {
		t.Fatalf("a fourth execution: %v", err)
	}
	cancel()
	for range 3 {
		<-done
	}
	// Project share: two of project a fill its 67%, while b still runs.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go run("a")
	go run("a")
	for r.admission.reserved() < 2*per {
		time.Sleep(time.Millisecond)
	}
	if err := run("a"); !errors.As(err, &busy) || !strings.Contains(busy.Reason, "project") {
		t.Fatalf("a third execution of one project: %v", err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer ccancel()
	if _, err := r.Execute(cctx, m, Execution{Event: []byte(`{}`), Tenant: "b"}); errors.As(err, &busy) {
		t.Fatalf("another project refused: %v", err)
	}
}

// TestFHIRReplyCapped: a FHIR reply over the output limit reaches the bot
// as a 413, not as megabytes copied into it.
func TestFHIRReplyCapped(t *testing.T) {
	r := testRuntime(t)
	m := compileFixture(t, r, "bots.wasm")
	res, err := r.Execute(context.Background(), m, Execution{
		Event:  event("fhir"),
		Limits: Limits{OutputBytes: 1 << 20},
		FHIR: func(ctx context.Context, req []byte) []byte {
			return []byte(`{"status":200,"body":"` + strings.Repeat("x", 2<<20) + `"}`)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(res.Envelope.Result), `{"status":413,`) {
		t.Fatalf("result %.200s", res.Envelope.Result)
	}
}

// TestDataImage: a module with a large data segment starts every execution
// from an image of its initial memory mapped copy-on-write (no copy per
// instantiation); its memory is the data, and the pooled buffer it used
// comes back zeroed for the next module.
func TestDataImage(t *testing.T) {
	r, err := New(context.Background(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	const size = 3 << 20
	m, err := r.Compile(context.Background(), wasmtest.DataSegment(size))
	if err != nil {
		t.Fatal(err)
	}
	if m.image == nil || m.image.size != size {
		t.Fatalf("no image of the data (%v)", m.image)
	}
	for range 3 {
		res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`)})
		if err != nil || res.Envelope.Result != nil {
			t.Fatalf("%v %+v", err, res)
		}
	}
	// The memory an instance sees is the data, byte for byte.
	mem := &guestMemory{limit: r.memoryLimit, pool: r.pool, image: m.image}
	buf := mem.Reallocate(size)
	want := make([]byte, size)
	for i := range want {
		want[i] = 0x5a
	}
	copy(want, "{}")
	if !bytes.Equal(buf, want) {
		t.Fatal("the mapped image differs from the data")
	}
	buf[100] = 1 // a private copy of the page
	mem.Free()
	// The next memory from the pool, for a module without an image, is zero.
	plain := &guestMemory{limit: r.memoryLimit, pool: r.pool}
	defer plain.Free()
	if b := plain.Reallocate(size); !bytes.Equal(b, make([]byte, size)) {
		t.Fatal("a pooled buffer came back with the image's bytes")
	}
}

// TestHostCallLoopsMeetTheDeadline: a loop of WASI calls that each do much
// work for few guest instructions (random_get of 60 MiB; fd_write of a
// million empty iovecs; random_get reached through a table) stops at its
// deadline: every WASI call is preceded by a yield, where the deadline is
// checked.
func TestHostCallLoopsMeetTheDeadline(t *testing.T) {
	r := testRuntime(t)
	const timeout = time.Second
	for name, wasm := range map[string][]byte{
		"random_get of 60 MiB":         wasmtest.RandomGetFlood(60 << 20),
		"random_get through a table":   wasmtest.RandomGetThroughTable(60 << 20),
		"fd_write of a million iovecs": wasmtest.IovecFlood(),
	} {
		t.Run(name, func(t *testing.T) {
			m, err := r.Compile(context.Background(), wasm)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`), Limits: Limits{Timeout: timeout}})
			took := time.Since(start)
			var f *Failure
			if !errors.As(err, &f) || (f.Kind != FailTimeout && f.Kind != FailOutput) {
				t.Fatalf("%v %v", res, err)
			}
			t.Logf("stopped after %v: %s", took, f.Message)
			if bound := testtiming.Bound(timeout, time.Second); took > bound {
				t.Fatalf("ran %v, over %v", took, bound)
			}
		})
	}
}

// TestDeployCompileIsBounded: a deploy answers within its compile time
// limit whatever the module. Ten thousand dense functions of 3 KiB each
// (31 MiB, each under the per-function limit) are refused at once by the
// limit on all the code together; with that limit raised, a module too
// costly to compile is stopped at the wall-clock limit.
func TestDeployCompileIsBounded(t *testing.T) {
	t.Run("code bytes", func(t *testing.T) {
		r := testRuntime(t)
		wasm := wasmtest.ManyDenseFunctions(10_000, 3200)
		start := time.Now()
		_, err := r.Compile(Deploying(context.Background()), wasm)
		var me *ModuleError
		if !errors.As(err, &me) || !strings.Contains(me.Reason, "for all functions together") {
			t.Fatalf("%d-byte module: %v", len(wasm), err)
		}
		t.Logf("%d-byte module refused after %v: %s", len(wasm), time.Since(start), me.Reason)
		if bound := testtiming.Limit(time.Second, 10*time.Second); time.Since(start) > bound {
			t.Fatalf("took %v", time.Since(start))
		}
	})
	t.Run("wall clock", func(t *testing.T) {
		r, err := New(context.Background(), Config{Limits: limits.Limits{CompileSeconds: 1, ModuleCodeBytes: 1 << 30}})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close(context.Background())
		wasm := wasmtest.ManyDenseFunctions(10_000, 3200)
		start := time.Now()
		_, err = r.Compile(Deploying(context.Background()), wasm)
		took := time.Since(start)
		var me *ModuleError
		var busy *BusyError
		switch {
		case errors.As(err, &me) && strings.Contains(me.Reason, "compile time limit of 1s"):
		case errors.As(err, &busy): // the machine too busy to give the child its time
		default:
			t.Fatalf("%v", err)
		}
		t.Logf("refused after %v (child CPU %v): %v", took, r.lastChild.Load().cpu, err)
		if bound := testtiming.Bound(time.Second, 2*time.Second); took > bound {
			t.Fatalf("took %v, over %v", took, bound)
		}
	})
}

// TestChunkedBulkMemory: memory.fill and memory.copy, run a mebibyte at a
// time, do what one instruction would, overlapping copies in both
// directions included.
func TestChunkedBulkMemory(t *testing.T) {
	const size = 3<<20 + 12345
	text := make([]byte, size)
	for i := range text {
		text[i] = 'a' + byte(i%26)
	}
	env := append(append([]byte(`{"result":"`), text...), `"}`...)
	const base = len(`{"result":"`)
	ops := []struct {
		copy    bool
		d, s, n int // s is the fill byte for a fill
	}{
		{true, base + 1000, base, 2<<20 + 7},      // overlapping, d > s: from the end
		{true, base + 50, base + 70, 2<<20 + 5},   // overlapping, d < s: from the start
		{false, base + 100, 'z', 1<<20 + 3},       // fill over a chunk
		{true, base + 3<<20, base + 5, 12000},     // small, no chunk
		{false, base + 2<<20 + 9, 'q', 1<<20 - 1}, // under a chunk
	}
	want := append([]byte(nil), env...)
	var handle []byte
	for _, op := range ops {
		handle = append(handle, 0x41)
		handle = append(handle, wasmtest.SLEB(int64(op.d))...)
		handle = append(handle, 0x41)
		handle = append(handle, wasmtest.SLEB(int64(op.s))...)
		handle = append(handle, 0x41)
		handle = append(handle, wasmtest.SLEB(int64(op.n))...)
		if op.copy {
			handle = append(handle, 0xfc, 0x0a, 0x00, 0x00)
			copy(want[op.d:op.d+op.n], want[op.s:op.s+op.n])
		} else {
			handle = append(handle, 0xfc, 0x0b, 0x00)
			for i := op.d; i < op.d+op.n; i++ {
				want[i] = byte(op.s)
			}
		}
	}
	handle = append(handle, 0x42)
	handle = append(handle, wasmtest.SLEB(int64(len(env)))...) // the envelope at 0
	handle = append(handle, 0x0b)
	pages := uint32((len(env) + 0xffff) >> 16)
	wasm := wasmtest.Module{
		Memory: wasmtest.Cat([]byte{0x00}, wasmtest.ULEB(pages)),
		Data:   wasmtest.Vec(wasmtest.Cat([]byte{0x00, 0x41, 0x00, 0x0b}, wasmtest.ULEB(uint32(len(env))), env)),
		Handle: handle,
	}.Build()
	r := testRuntime(t)
	m, err := r.Compile(context.Background(), wasm)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Execute(context.Background(), m, Execution{Event: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if err := json.Unmarshal(res.Envelope.Result, &got); err != nil {
		t.Fatal(err)
	}
	if got != string(want[base:len(want)-2]) {
		for i := range got {
			if got[i] != want[base+i] {
				t.Fatalf("first difference at byte %d: %q, want %q", i, got[i], want[base+i])
			}
		}
		t.Fatal("the results differ in length")
	}
}

// TestAdmissionCountsPerCore: the executions admitted at once and the
// guest turns are counted per core (limits.Cores), not per P, which serve
// raises past the cores (docs/decisions.md 62).
func TestAdmissionCountsPerCore(t *testing.T) {
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(4 * goruntime.NumCPU()))
	r, err := New(context.Background(), Config{Limits: limits.Limits{ExecutionsPerCore: 5}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	if want := 5 * goruntime.NumCPU(); r.admission.slots != want {
		t.Errorf("with GOMAXPROCS raised: %d executions admitted at once, want %d", r.admission.slots, want)
	}
	if want := 2 * goruntime.NumCPU(); r.cpu.cores != want {
		t.Errorf("with GOMAXPROCS raised: %d guest turns, want twice the %d CPUs", r.cpu.cores, goruntime.NumCPU())
	}
}
