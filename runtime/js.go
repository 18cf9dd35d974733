package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// This file runs JavaScript bots: QuickJS-NG compiled to WASI (the npm
// package quickjs-wasi, fetched by `make js`) inside the same wazero runtime,
// limits and logs as WebAssembly bots. The engine's C interface is called
// from Go; the bot-facing side (globals, the MedplumClient, turning a result
// into an envelope) is JavaScript in jsengine/bridge.js. See RATIONALE.md,
// "JavaScript bots".

// jsEngine is what every JavaScript bot of a Runtime shares: QuickJS
// compiled twice (as shipped, to build images; without its data segments, to
// run instances over an image, which already holds that data), and the base
// image with the polyfills, @medplum/core and the bridge evaluated.
type jsEngine struct {
	build   wazero.CompiledModule
	restore wazero.CompiledModule
	base    []byte
	sp      uint64
	// Values created while building the base image and never freed, so
	// that their pointers are valid in every image derived from it.
	global, undefined, runFn, timersFn, loadCJS, loadESM, describe uint32
	scratch                                                        uint32 // 16 bytes: argv and length slots
	coreModule                                                     []byte // ES module source re-exporting @medplum/core
}

// JavaScript is the Shape of a JavaScript bot's Module.
const JavaScript Shape = 2

// jsBot is the runnable form of one JavaScript bot: its image and the idle
// instances restored from it.
type jsBot struct {
	img *jsImage
	// idleTotal counts the idle instances of all the runtime's bots.
	idleTotal *atomic.Int64

	mu     sync.Mutex
	idle   []*jsInstance
	closed bool
}

// Idle instances kept, per bot (as many as connections commonly run one bot
// at once) and in all: each holds a memory reservation
// (address space), the pages its executions wrote (a few hundred KiB,
// copies of the image's) and wazero's per-function stacks.
const (
	maxIdleJS      = 8
	maxIdleJSTotal = 64
)

func (b *jsBot) get() *jsInstance {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.idle); n > 0 {
		inst := b.idle[n-1]
		b.idle = b.idle[:n-1]
		b.idleTotal.Add(-1)
		return inst
	}
	return nil
}

// put keeps inst for the next execution after restoring its memory to the
// image; an instance that cannot be restored is closed.
func (b *jsBot) put(inst *jsInstance) {
	if inst.mem.size() != uint64(b.img.size) || b.img.reset(inst.mem.buf) != nil {
		inst.close()
		return
	}
	b.mu.Lock()
	if b.closed || len(b.idle) >= maxIdleJS || b.idleTotal.Add(1) > maxIdleJSTotal {
		if !b.closed && len(b.idle) < maxIdleJS {
			b.idleTotal.Add(-1)
		}
		b.mu.Unlock()
		inst.close()
		return
	}
	b.idle = append(b.idle, inst)
	b.mu.Unlock()
}

func (b *jsBot) close() {
	b.mu.Lock()
	b.closed = true
	idle := b.idle
	b.idle = nil
	b.idleTotal.Add(-int64(len(idle)))
	b.mu.Unlock()
	for _, inst := range idle {
		inst.close()
	}
	b.img.close()
}

// jsMemory is the linear memory of an instance running over an image: a
// reservation of the runtime's memory limit (see reserve) whose first
// img.size bytes show the image. It enforces the execution's limit as
// guestMemory does.
type jsMemory struct {
	mu      sync.Mutex
	buf     []byte
	cur     uint64
	limit   uint64
	refused bool
	pooled  bool // buf comes from reserve and is released by close
}

var _ experimental.LinearMemory = (*jsMemory)(nil)

func (m *jsMemory) Allocate(capacity, max uint64) experimental.LinearMemory { return m }

func (m *jsMemory) Reallocate(size uint64) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if size > m.limit {
		m.refused = true
		return nil
	}
	if size > uint64(len(m.buf)) {
		if m.pooled {
			m.refused = true
			return nil
		}
		m.buf = append(m.buf, make([]byte, size-uint64(len(m.buf)))...)
	}
	m.cur = size
	return m.buf[:size:size]
}

// Free is called by wazero when the instance closes; the buffer is released
// by jsInstance.close, which knows whether it is still mapped.
func (m *jsMemory) Free() {}

func (m *jsMemory) size() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur
}

// arm sets the limit of the next execution and forgets the last refusal.
func (m *jsMemory) arm(limit uint64) {
	m.mu.Lock()
	m.limit, m.refused = limit, false
	m.mu.Unlock()
}

func (m *jsMemory) wasRefused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
}

// jsInstance is one QuickJS instance and the engine functions the host calls.
type jsInstance struct {
	mod   api.Module
	mem   *jsMemory
	stdio *jsStdio
	sp    api.MutableGlobal
	// fuel and depth are the instrumentation's counters (prepareEngine),
	// reset with sp when the instance is reused.
	fuel, depth api.MutableGlobal
	closed      bool

	malloc, free, newString, call, execJob, getStringLen, freeCString, freeValue,
	getUndefined, isException, getException, getFloat64, eval, promiseState, promiseResult,
	runGC, getPropString, setPropString, newHostFunction, setMaxStack,
	setInterrupt, setModuleLoader api.Function
}

func (i *jsInstance) close() {
	if i.closed {
		return
	}
	i.closed = true
	_ = i.mod.Close(context.Background())
	if i.mem.pooled {
		release(i.mem.buf)
	}
	i.mem.buf = nil
}

// jsStdio sends what the engine itself writes on stdout or stderr to the
// log of the execution running in the instance.
type jsStdio struct {
	mu sync.Mutex
	w  *lineWriter
}

func (s *jsStdio) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil {
		s.w.Write(p)
	}
	return len(p), nil
}

func (s *jsStdio) attach(w *lineWriter) {
	s.mu.Lock()
	if s.w != nil {
		s.w.flush()
	}
	s.w = w
	s.mu.Unlock()
}

// jsCall is the state of one execution (or one image build) that the host
// functions reach through the call's context.
type jsCall struct {
	inst   *jsInstance
	eng    *jsEngine
	st     *execState
	output int // envelope limit in bytes

	done     bool
	envelope []byte
	overflow bool
}

type jsCallKey struct{}

func jsCallFrom(ctx context.Context) *jsCall {
	c, _ := ctx.Value(jsCallKey{}).(*jsCall)
	return c
}

// jsError is an exception that left the engine, described by the bridge.
type jsError struct {
	Name    string `json:"name"`
	Message string `json:"message"`
	Line    int    `json:"line"`
	Column  int    `json:"column"`
	Stack   string `json:"stack"`
}

func (e *jsError) Error() string {
	if e.Name == "" {
		return e.Message
	}
	return e.Name + ": " + e.Message
}

var errJSNotFunction = errors.New("runtime: JavaScript engine function missing")

func (i *jsInstance) do(ctx context.Context, f api.Function, args ...uint64) (uint64, error) {
	res, err := f.Call(ctx, args...)
	if err != nil {
		return 0, err
	}
	if len(res) == 0 {
		return 0, nil
	}
	return res[0], nil
}

// cstring copies s into the guest's heap, NUL-terminated. Free it.
func (i *jsInstance) cstring(ctx context.Context, s []byte) (uint32, error) {
	p, err := i.do(ctx, i.malloc, uint64(len(s)+1))
	if err != nil {
		return 0, err
	}
	if p == 0 {
		return 0, errors.New("out of memory")
	}
	mem := i.mod.Memory()
	if !mem.Write(uint32(p), s) || !mem.WriteByte(uint32(p)+uint32(len(s)), 0) {
		return 0, errors.New("runtime: malloc returned memory out of bounds")
	}
	return uint32(p), nil
}

// jsString makes a JavaScript string value of s.
func (i *jsInstance) jsString(ctx context.Context, s []byte) (uint32, error) {
	p, err := i.cstring(ctx, s)
	if err != nil {
		return 0, err
	}
	v, err := i.do(ctx, i.newString, uint64(p), uint64(len(s)))
	if _, e := i.do(ctx, i.free, uint64(p)); err == nil {
		err = e
	}
	return uint32(v), err
}

// readString returns the string value val as UTF-8 (WTF-8 for lone
// surrogates). Over max bytes it returns nil and false without copying.
func (i *jsInstance) readString(ctx context.Context, eng *jsEngine, val uint32, max int) ([]byte, bool, error) {
	lenPtr := eng.scratch + 8
	p, err := i.do(ctx, i.getStringLen, uint64(val), uint64(lenPtr))
	if err != nil {
		return nil, false, err
	}
	if p == 0 {
		return nil, true, nil
	}
	n, _ := i.mod.Memory().ReadUint32Le(lenPtr)
	var out []byte
	ok := int64(n) <= int64(max)
	if ok {
		b, inBounds := i.mod.Memory().Read(uint32(p), n)
		if !inBounds {
			return nil, false, errors.New("runtime: string out of bounds")
		}
		out = bytes.Clone(b)
	}
	_, err = i.do(ctx, i.freeCString, p)
	return out, ok, err
}

// callFn calls fn(args...) with undefined as this; the result must be freed.
func (i *jsInstance) callFn(ctx context.Context, eng *jsEngine, fn uint32, args ...uint32) (uint32, error) {
	argv := eng.scratch
	if len(args) > 2 {
		return 0, errors.New("runtime: callFn takes at most two arguments")
	}
	for k, a := range args {
		i.mod.Memory().WriteUint32Le(argv+uint32(4*k), a)
	}
	res, err := i.do(ctx, i.call, uint64(fn), uint64(eng.undefined), uint64(len(args)), uint64(argv))
	return uint32(res), err
}

// check turns an exception result into a *jsError (freeing the result).
func (i *jsInstance) check(ctx context.Context, eng *jsEngine, val uint32) error {
	exc, err := i.do(ctx, i.isException, uint64(val))
	if err != nil || exc == 0 {
		return err
	}
	_, _ = i.do(ctx, i.freeValue, uint64(val))
	return i.exception(ctx, eng)
}

// exception takes the pending exception and describes it.
func (i *jsInstance) exception(ctx context.Context, eng *jsEngine) error {
	e, err := i.do(ctx, i.getException)
	if err != nil {
		return err
	}
	defer i.do(ctx, i.freeValue, e)
	if eng.describe == 0 {
		b, _, err := i.readString(ctx, eng, uint32(e), 1<<16)
		if err != nil {
			return err
		}
		return &jsError{Message: string(b)}
	}
	d, err := i.callFn(ctx, eng, eng.describe, uint32(e))
	if err != nil {
		return err
	}
	defer i.do(ctx, i.freeValue, uint64(d))
	b, _, err := i.readString(ctx, eng, d, 1<<16)
	if err != nil {
		return err
	}
	je := &jsError{}
	if json.Unmarshal(b, je) != nil {
		je.Message = string(b)
	}
	return je
}

// evalCode evaluates code as a script (flags 0) or module (1).
func (i *jsInstance) evalCode(ctx context.Context, eng *jsEngine, code []byte, filename string, flags uint64) (uint32, error) {
	c, err := i.cstring(ctx, code)
	if err != nil {
		return 0, err
	}
	defer i.do(ctx, i.free, uint64(c))
	f, err := i.cstring(ctx, []byte(filename))
	if err != nil {
		return 0, err
	}
	defer i.do(ctx, i.free, uint64(f))
	v, err := i.do(ctx, i.eval, uint64(c), uint64(len(code)), uint64(f), flags)
	if err != nil {
		return 0, err
	}
	if err := i.check(ctx, eng, uint32(v)); err != nil {
		return 0, err
	}
	return uint32(v), nil
}

// prop returns global[name] (a new value).
func (i *jsInstance) prop(ctx context.Context, eng *jsEngine, obj uint32, name string) (uint32, error) {
	n, err := i.cstring(ctx, []byte(name))
	if err != nil {
		return 0, err
	}
	defer i.do(ctx, i.free, uint64(n))
	v, err := i.do(ctx, i.getPropString, uint64(obj), uint64(n))
	return uint32(v), err
}

// runJobs runs pending promise jobs until none is left.
func (i *jsInstance) runJobs(ctx context.Context, eng *jsEngine) error {
	for {
		r, err := i.do(ctx, i.execJob)
		if err != nil {
			return err
		}
		switch int32(r) {
		case 0:
			return nil
		case 1:
			continue
		default:
			return i.exception(ctx, eng)
		}
	}
}

func (r *Runtime) jsEngine(ctx context.Context) (*jsEngine, error) {
	r.jsOnce.Do(func() {
		r.jsEng, r.jsErr = r.newJSEngine(context.WithoutCancel(ctx))
		if r.jsErr != nil && !errors.Is(r.jsErr, ErrJSUnavailable) {
			r.log.Error("JavaScript engine unavailable", "err", r.jsErr)
		}
	})
	return r.jsEng, r.jsErr
}

const jsHostModule = "env"

// jsMinStackBytes is the least call depth limit of the JavaScript engine:
// evaluating @medplum/core when the engine starts needs more than the
// smallest SANDBOT_BOT_STACK_BYTES (64 KiB) allows.
const jsMinStackBytes = 1 << 20

// jsStackBytes is the engine's call depth limit (wasmrewrite.go): the bots'
// limit, since a bot's recursion is the engine's, but at least
// jsMinStackBytes. Plain JavaScript recursion meets QuickJS's own limit
// first (a RangeError the bot may catch, about 2,000 calls deep); recursion
// through C, such as JSON.stringify of a structure nested 10^5 deep, may
// meet this one, which ends the execution.
func (r *Runtime) jsStackBytes() int64 {
	return max(r.cfg.Limits.BotStackBytes, jsMinStackBytes)
}

// newJSEngine compiles the engine and builds the base image. The engine is
// trusted code, compiled in this process (not through Compile, whose budget
// and compiler child are for bots' modules), but instrumented like every
// bot module (prepareEngine): the runtime has no other deadline
// (engineConfig), and some of QuickJS's builtins loop in C without polling
// its interrupt hook.
func (r *Runtime) newJSEngine(ctx context.Context) (*jsEngine, error) {
	shipped, core, err := jsAssets()
	if r.cfg.noJS {
		err = ErrJSUnavailable
	}
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := instantiateJSHost(ctx, r.wz); err != nil {
		return nil, fmt.Errorf("runtime: JavaScript host module: %w", err)
	}
	wasm, err := prepareEngine(shipped, uint32(r.jsStackBytes()/8))
	if err != nil {
		return nil, fmt.Errorf("runtime: instrumenting the JavaScript engine: %w", err)
	}
	eng := &jsEngine{}
	if eng.build, err = r.wz.CompileModule(ctx, wasm); err != nil {
		return nil, fmt.Errorf("runtime: compiling the JavaScript engine: %w", err)
	}
	stripped, err := stripDataSegments(wasm)
	if err != nil {
		return nil, fmt.Errorf("runtime: preparing the JavaScript engine: %w", err)
	}
	if eng.restore, err = r.wz.CompileModule(ctx, stripped); err != nil {
		return nil, fmt.Errorf("runtime: compiling the JavaScript engine: %w", err)
	}

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	mem := &jsMemory{limit: r.memoryLimit}
	inst, err := r.newJSInstance(ctx, eng.build, mem)
	if err != nil {
		return nil, err
	}
	defer inst.close()
	call := &jsCall{inst: inst, eng: eng, st: &execState{logs: &logBuffer{max: 1 << 16}}, output: 1 << 20}
	ctx = context.WithValue(ctx, jsCallKey{}, call)
	fail := func(what string, err error) (*jsEngine, error) {
		return nil, fmt.Errorf("runtime: JavaScript engine: %s: %w", what, err)
	}
	init := inst.mod.ExportedFunction("_initialize")
	if init == nil {
		return fail("_initialize", errJSNotFunction)
	}
	if _, err := inst.do(ctx, init); err != nil {
		return fail("_initialize", err)
	}
	if rc, err := inst.do(ctx, inst.mod.ExportedFunction("qjs_init")); err != nil || rc != 0 {
		return fail("qjs_init", errors.Join(err, fmt.Errorf("returned %d", int32(rc))))
	}
	// Deep recursion becomes a RangeError rather than a trap: half the
	// engine's 1 MiB C stack, as quickjs-wasi recommends.
	for _, c := range []struct {
		f   api.Function
		arg uint64
	}{{inst.setMaxStack, 512 << 10}, {inst.setInterrupt, 1}, {inst.setModuleLoader, 1}} {
		if _, err := inst.do(ctx, c.f, c.arg); err != nil {
			return fail("configuring", err)
		}
	}
	scratch, err := inst.do(ctx, inst.malloc, 16)
	if err != nil || scratch == 0 {
		return fail("scratch", errors.Join(err, errors.New("malloc failed")))
	}
	eng.scratch = uint32(scratch)
	for _, v := range []struct {
		f   api.Function
		out *uint32
	}{{inst.mod.ExportedFunction("qjs_get_global"), &eng.global}, {inst.getUndefined, &eng.undefined}} {
		p, err := inst.do(ctx, v.f)
		if err != nil {
			return fail("values", err)
		}
		*v.out = uint32(p)
	}
	// The host function and the server's base URL, as globals the bridge
	// takes and deletes.
	name := []byte("__sandbot_host")
	np, err := inst.cstring(ctx, name)
	if err != nil {
		return fail("host function", err)
	}
	fn, err := inst.do(ctx, inst.newHostFunction, uint64(np), uint64(len(name)), 2)
	if err == nil {
		_, err = inst.do(ctx, inst.setPropString, uint64(eng.global), uint64(np), fn)
	}
	if err != nil {
		return fail("host function", err)
	}
	base := r.cfg.BaseURL
	if base == "" {
		base = "http://localhost:8103/"
	}
	if !strings.HasSuffix(base, "/") {
		base += "/"
	}
	steps := []struct{ name, code string }{
		{"base-url.js", "globalThis.__sandbot_base_url = " + strconv.Quote(base) + ";"},
		{"polyfills.js", jsPolyfills},
		// @medplum/core names the global WebSocket at load time (and the
		// reference's sandbox has none): a stand-in during its evaluation.
		{"@medplum/core", "globalThis.WebSocket = class WebSocket {};\nglobalThis.__sandbot_core = (function (module, exports) {" + string(core) +
			"\nreturn module.exports;\n})({ exports: {} }, {});\ndelete globalThis.WebSocket;"},
		{"bridge.js", jsBridge},
	}
	for _, s := range steps {
		v, err := inst.evalCode(ctx, eng, []byte(s.code), s.name, 0)
		if err != nil {
			return fail(s.name, err)
		}
		inst.do(ctx, inst.freeValue, uint64(v))
	}
	for _, v := range []struct {
		name string
		out  *uint32
	}{{"__sandbot_run", &eng.runFn}, {"__sandbot_timers", &eng.timersFn}, {"__sandbot_load_cjs", &eng.loadCJS},
		{"__sandbot_load_esm", &eng.loadESM}, {"__sandbot_describe", &eng.describe}} {
		if *v.out, err = inst.prop(ctx, eng, eng.global, v.name); err != nil {
			return fail(v.name, err)
		}
	}
	src, err := inst.prop(ctx, eng, eng.global, "__sandbot_core_module")
	if err != nil {
		return fail("core module", err)
	}
	if eng.coreModule, _, err = inst.readString(ctx, eng, src, 1<<20); err != nil {
		return fail("core module", err)
	}
	inst.do(ctx, inst.freeValue, uint64(src))
	if err := inst.runJobs(ctx, eng); err != nil {
		return fail("jobs", err)
	}
	if _, err := inst.do(ctx, inst.runGC); err != nil {
		return fail("gc", err)
	}
	if logs, _ := call.st.logs.result(); len(logs) > 0 {
		for _, l := range logs {
			r.log.Warn("JavaScript engine start-up logged", "text", l.Text)
		}
	}
	size := inst.mod.Memory().Size()
	b, _ := inst.mod.Memory().Read(0, size)
	eng.base = bytes.Clone(b)
	eng.sp = inst.sp.Get()
	r.log.Info("JavaScript engine ready", "base_image_bytes", len(eng.base), "duration", time.Since(start))
	return eng, nil
}

// newJSInstance instantiates the engine over mem.
func (r *Runtime) newJSInstance(ctx context.Context, cm wazero.CompiledModule, mem *jsMemory) (*jsInstance, error) {
	stdio := &jsStdio{}
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithSysWalltime().
		WithSysNanotime().
		WithRandSource(rand.Reader).
		WithStdout(stdio).
		WithStderr(stdio)
	mod, err := r.wz.InstantiateModule(experimental.WithMemoryAllocator(ctx, mem), cm, cfg)
	if err != nil {
		return nil, err
	}
	inst := &jsInstance{mod: mod, mem: mem, stdio: stdio}
	g, ok := mod.ExportedGlobal("__stack_pointer").(api.MutableGlobal)
	if !ok {
		mod.Close(ctx)
		return nil, errors.New("runtime: JavaScript engine does not export a mutable __stack_pointer")
	}
	inst.sp = g
	for _, g := range []struct {
		name string
		out  *api.MutableGlobal
	}{{fuelExport, &inst.fuel}, {depthExport, &inst.depth}} {
		if *g.out, ok = mod.ExportedGlobal(g.name).(api.MutableGlobal); !ok {
			mod.Close(ctx)
			return nil, fmt.Errorf("runtime: the JavaScript engine is not instrumented (no %s)", g.name)
		}
	}
	for _, f := range []struct {
		name string
		out  *api.Function
	}{
		{"wasm_malloc", &inst.malloc}, {"wasm_free", &inst.free}, {"qjs_new_string", &inst.newString},
		{"qjs_call", &inst.call}, {"qjs_execute_pending_job", &inst.execJob},
		{"qjs_get_string_len", &inst.getStringLen}, {"qjs_free_cstring", &inst.freeCString},
		{"qjs_free_value", &inst.freeValue}, {"qjs_get_undefined", &inst.getUndefined},
		{"qjs_is_exception", &inst.isException}, {"qjs_get_exception", &inst.getException},
		{"qjs_get_float64", &inst.getFloat64}, {"qjs_eval", &inst.eval},
		{"qjs_promise_state", &inst.promiseState}, {"qjs_promise_result", &inst.promiseResult},
		{"qjs_run_gc", &inst.runGC},
		{"qjs_get_prop_string", &inst.getPropString}, {"qjs_set_prop_string", &inst.setPropString},
		{"qjs_new_host_function", &inst.newHostFunction}, {"qjs_set_max_stack_size", &inst.setMaxStack},
		{"qjs_set_interrupt_handler", &inst.setInterrupt}, {"qjs_set_module_loader", &inst.setModuleLoader},
	} {
		if *f.out = mod.ExportedFunction(f.name); *f.out == nil {
			mod.Close(ctx)
			return nil, fmt.Errorf("runtime: JavaScript engine does not export %s", f.name)
		}
	}
	return inst, nil
}

// reset sets the stack pointer to sp and the instrumentation's counters to
// their initial values, for an instance kept from an execution that ended
// cleanly (its memory already put back to the image). Every call that ends
// normally takes off the call depth it added, so the depth is 0 already;
// setting it spares the next execution any doubt.
func (i *jsInstance) reset(sp uint64) {
	i.sp.Set(sp)
	i.fuel.Set(yieldFuel)
	i.depth.Set(0)
}

// restoreInstance instantiates the engine without its data segments over a
// memory that holds image.
func (r *Runtime) restoreInstance(ctx context.Context, eng *jsEngine, mem *jsMemory, size int, sp uint64) (*jsInstance, error) {
	inst, err := r.newJSInstance(ctx, eng.restore, mem)
	if err != nil {
		return nil, err
	}
	m := inst.mod.Memory()
	if cur := m.Size(); uint64(cur) < uint64(size) {
		if _, ok := m.Grow((uint32(size) - cur) / 65536); !ok {
			inst.close()
			return nil, errors.New("runtime: cannot grow a JavaScript instance to its image")
		}
	}
	inst.sp.Set(sp)
	return inst, nil
}

// CompileJS loads a JavaScript bot (CommonJS, or an ES module) into an image
// of the engine, once per distinct code: the module is evaluated, its
// handler found, and the engine's memory kept as the image every execution
// starts from. Code that does not compile or whose evaluation fails is a
// *ModuleError (with the line and column of a syntax error); a binary built
// without the engine returns ErrJSUnavailable.
func (r *Runtime) CompileJS(ctx context.Context, code []byte, filename string) (*Module, error) {
	if int64(len(code)) > r.cfg.Limits.ModuleBytes {
		return nil, moduleErrorf("code is %d bytes, over the limit of %d bytes", len(code), r.cfg.Limits.ModuleBytes)
	}
	eng, err := r.jsEngine(ctx)
	if err != nil {
		return nil, err
	}
	hash := HashBytes(code)
	if m, ok := r.Lookup(hash); ok && m.js != nil {
		r.metrics.cacheHits.Inc()
		return m, nil
	}
	return r.shared(ctx, "js:"+hash, func(ctx context.Context) (*Module, error) {
		if m, ok := r.Lookup(hash); ok && m.js != nil {
			return m, nil
		}
		release, err := r.slot(ctx) // evaluating the code is compiling it
		if err != nil {
			return nil, err
		}
		defer release()
		return r.compileJS(ctx, eng, hash, code, filename)
	})
}

// esmSyntax finds an import or export statement at the start of a line.
var esmSyntax = regexp.MustCompile(`(?m)^\s*(import\s*[\w{*'"]|export\s*[\w{*])`)

// jsModulePrefix wraps CommonJS code in a function, on the code's first line
// so that line numbers stay the code's own.
const jsModulePrefix = "(function (exports, require, module, __filename, __dirname) {"

func (r *Runtime) compileJS(ctx context.Context, eng *jsEngine, hash string, code []byte, filename string) (*Module, error) {
	r.metrics.cacheMisses.Inc()
	start := time.Now()
	if filename == "" {
		filename = "index.js"
	}
	ctx, cancel := context.WithTimeoutCause(ctx, r.cfg.Limits.BotTimeout, errTimeout)
	defer cancel()
	mem := &jsMemory{limit: r.memoryLimit, buf: bytes.Clone(eng.base)}
	inst, err := r.restoreInstance(ctx, eng, mem, len(eng.base), eng.sp)
	if err != nil {
		return nil, err
	}
	defer inst.close()
	call := &jsCall{inst: inst, eng: eng, st: &execState{logs: &logBuffer{max: int(max(r.cfg.Limits.BotLogBytes, 0))}}, output: 1 << 20}
	ctx = context.WithValue(ctx, jsCallKey{}, call)

	loadErr := func(err error, what string) error {
		if cause := context.Cause(ctx); cause != nil {
			return moduleErrorf("%s did not finish within %d ms", what, r.cfg.Limits.BotTimeout.Milliseconds())
		}
		if mem.wasRefused() {
			return moduleErrorf("%s exceeded the memory limit of %d bytes", what, mem.limit)
		}
		var je *jsError
		if errors.As(err, &je) {
			me := &ModuleError{Reason: je.Error(), Line: je.Line, Column: je.Column}
			if je.Line > 0 {
				me.Reason += fmt.Sprintf(" (%s, line %d, column %d)", filename, je.Line, je.Column)
			}
			return me
		}
		return moduleErrorf("%s failed: %v", what, err)
	}

	// CommonJS first (what bundlers emit for bots); code that does not
	// compile as a script and has import or export statements is an ES
	// module. (QuickJS's own detection takes "exports.handler" for one.)
	var fn uint32
	isModule := false
	src := make([]byte, 0, len(jsModulePrefix)+len(code)+4)
	src = append(append(append(src, jsModulePrefix...), code...), "\n})"...)
	fn, err = inst.evalCode(ctx, eng, src, filename, 0)
	if err != nil {
		var je *jsError
		if errors.As(err, &je) && je.Name == "SyntaxError" && esmSyntax.Match(code) {
			isModule = true
		} else {
			if je != nil && je.Line == 1 && je.Column > len(jsModulePrefix) {
				je.Column -= len(jsModulePrefix)
			}
			return nil, loadErr(err, "Loading the code")
		}
	}
	if isModule {
		p, err := inst.evalCode(ctx, eng, code, filename, 1)
		if err == nil {
			err = inst.runJobs(ctx, eng)
		}
		if err != nil {
			return nil, loadErr(err, "Evaluating the module")
		}
		state, _ := inst.do(ctx, inst.promiseState, uint64(p))
		res, _ := inst.do(ctx, inst.promiseResult, uint64(p))
		inst.do(ctx, inst.freeValue, uint64(p))
		switch state {
		case 1:
			v, err := inst.callFn(ctx, eng, eng.loadESM, uint32(res))
			if err == nil {
				err = inst.check(ctx, eng, v)
			}
			inst.do(ctx, inst.freeValue, res)
			if err != nil {
				return nil, loadErr(err, "Evaluating the module")
			}
		case 2:
			// The module threw while evaluating: describe the reason.
			d, err := inst.callFn(ctx, eng, eng.describe, uint32(res))
			inst.do(ctx, inst.freeValue, res)
			if err != nil {
				return nil, loadErr(err, "Evaluating the module")
			}
			b, _, _ := inst.readString(ctx, eng, d, 1<<16)
			je := &jsError{}
			if json.Unmarshal(b, je) != nil {
				je.Message = string(b)
			}
			return nil, loadErr(je, "Evaluating the module")
		default:
			return nil, moduleErrorf("the module's top-level await never finished")
		}
	} else {
		fname, err := inst.jsString(ctx, []byte(filename))
		if err != nil {
			return nil, loadErr(err, "Loading the code")
		}
		v, err := inst.callFn(ctx, eng, eng.loadCJS, fn, fname)
		if err == nil {
			err = inst.check(ctx, eng, v)
		}
		if err == nil {
			inst.do(ctx, inst.freeValue, uint64(v))
			err = inst.runJobs(ctx, eng)
		}
		inst.do(ctx, inst.freeValue, uint64(fn))
		inst.do(ctx, inst.freeValue, uint64(fname))
		if err != nil {
			return nil, loadErr(err, "Evaluating the code")
		}
	}
	if _, err := inst.do(ctx, inst.runGC); err != nil {
		return nil, loadErr(err, "Evaluating the code")
	}
	if err := r.setGCThreshold(ctx, inst); err != nil {
		return nil, loadErr(err, "Evaluating the code")
	}
	size := inst.mod.Memory().Size()
	b, _ := inst.mod.Memory().Read(0, size)
	img, err := newJSImage(b, inst.sp.Get())
	if err != nil {
		return nil, err
	}
	m := &Module{hash: hash, shape: JavaScript, size: len(code) + img.size, minMemory: uint64(img.size), js: &jsBot{img: img, idleTotal: &r.jsIdle}}
	d := time.Since(start)
	r.metrics.compileDuration.Observe(d.Seconds())
	r.log.Info("JavaScript bot loaded", "hash", hash, "bytes", len(code), "image_bytes", img.size, "duration", d)
	return m, nil
}

// jsGCHeadroom is how much an execution may allocate before the engine's
// first garbage collection (see setGCThreshold).
const jsGCHeadroom = 16 << 20

// setGCThreshold lets an execution allocate up to jsGCHeadroom (or a quarter
// of the memory limit) beyond the image before QuickJS collects cycles: a
// collection walks, and so writes to, every object of the heap, including
// @medplum/core's (4 ms, and a private copy of every heap page). Reference
// counting still frees acyclic garbage at once, and the memory limit holds.
func (r *Runtime) setGCThreshold(ctx context.Context, inst *jsInstance) error {
	get, set, usage := inst.mod.ExportedFunction("qjs_get_gc_threshold"), inst.mod.ExportedFunction("qjs_set_gc_threshold"),
		inst.mod.ExportedFunction("qjs_compute_memory_usage")
	if get == nil || set == nil || usage == nil {
		return errors.New("runtime: JavaScript engine lacks its GC threshold functions")
	}
	buf, err := inst.do(ctx, inst.malloc, 26*8)
	if err != nil || buf == 0 {
		return errors.Join(err, errors.New("malloc failed"))
	}
	defer inst.do(ctx, inst.free, buf)
	if _, err := inst.do(ctx, usage, buf); err != nil {
		return err
	}
	mallocSize, _ := inst.mod.Memory().ReadUint64Le(uint32(buf)) // field 0: malloc_size
	_, err = inst.do(ctx, set, mallocSize+min(jsGCHeadroom, r.memoryLimit/4))
	return err
}

// runJS runs one execution of a JavaScript bot. It returns the linear
// memory size at the end.
func (r *Runtime) runJS(parent context.Context, m *Module, ex Execution, lim Limits, logs *logBuffer, cpu *turn, res *Result, start time.Time) (uint64, error) {
	bot := m.js
	eng := r.jsEng
	if uint64(bot.img.size) > lim.MemoryBytes {
		return 0, failf(FailMemory, "Bot needs %d bytes of memory, over the limit of %d bytes", bot.img.size, lim.MemoryBytes)
	}
	ctx, cancelTimeout := context.WithTimeoutCause(parent, lim.Timeout, errTimeout)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logs.onFlood(func() { cancel(errLogFlood) })
	// Guest code runs on a core of its turn (admission.go): waiting for one
	// counts against the deadline.
	if err := cpu.acquire(ctx); err != nil {
		return 0, r.classifyJS(ctx, nil, nil, lim, start, err)
	}
	defer cpu.release()

	inst := bot.get()
	if inst == nil {
		buf, err := reserve(r.memoryLimit)
		if err != nil {
			return 0, fmt.Errorf("runtime: reserving memory: %w", err)
		}
		if err := bot.img.mapInto(buf); err != nil {
			release(buf)
			return 0, fmt.Errorf("runtime: mapping a JavaScript image: %w", err)
		}
		mem := &jsMemory{buf: buf, limit: lim.MemoryBytes, pooled: true}
		inst, err = r.restoreInstance(context.WithoutCancel(ctx), eng, mem, bot.img.size, bot.img.sp)
		if err != nil {
			release(buf)
			return 0, fmt.Errorf("runtime: restoring a JavaScript instance: %w", err)
		}
	} else {
		inst.reset(bot.img.sp)
	}
	inst.mem.arm(lim.MemoryBytes)
	stdout := &lineWriter{logs: logs, level: 1}
	inst.stdio.attach(stdout)
	call := &jsCall{inst: inst, eng: eng, st: &execState{fhir: ex.FHIR, logs: logs, cpu: cpu}, output: lim.OutputBytes}
	ctx = context.WithValue(ctx, jsCallKey{}, call)
	ctx = context.WithValue(ctx, stateKey{}, call.st)

	err := r.driveJS(ctx, inst, eng, call, ex)
	inst.stdio.attach(nil)
	used := inst.mem.size()
	clean := err == nil && call.done && !inst.mem.wasRefused() && context.Cause(ctx) == nil
	if err != nil {
		err = r.classifyJS(ctx, inst, call, lim, start, err)
	} else if call.overflow {
		err = failf(FailOutput, "Bot output exceeded the limit of %d bytes", lim.OutputBytes)
	} else if inst.mem.wasRefused() {
		err = failf(FailMemory, "Bot exceeded the memory limit of %d bytes", lim.MemoryBytes)
	}
	if clean {
		bot.put(inst)
	} else {
		inst.close()
	}
	if err != nil {
		return used, err
	}
	env, err := parseEnvelope(call.envelope)
	if err != nil {
		return used, err
	}
	res.Envelope = env
	return used, nil
}

var errJSStalled = errors.New("stalled")

// driveJS starts the bot's handler and runs its promise jobs and timers
// until the bridge reports the result.
func (r *Runtime) driveJS(ctx context.Context, inst *jsInstance, eng *jsEngine, call *jsCall, ex Execution) error {
	var seed [16]byte
	_, _ = rand.Read(seed[:])
	arg := make([]byte, 0, 32+len(ex.Event))
	arg = hex.AppendEncode(arg, seed[:])
	arg = append(arg, ex.Event...)
	v, err := inst.jsString(ctx, arg)
	if err != nil {
		return err
	}
	res, err := inst.callFn(ctx, eng, eng.runFn, v)
	if err != nil {
		return err
	}
	inst.do(ctx, inst.freeValue, uint64(v))
	if err := inst.check(ctx, eng, res); err != nil {
		return err
	}
	inst.do(ctx, inst.freeValue, uint64(res))
	for !call.done {
		if err := context.Cause(ctx); err != nil {
			return err
		}
		n, err := inst.do(ctx, inst.execJob)
		if err != nil {
			return err
		}
		if int32(n) < 0 {
			return inst.exception(ctx, eng)
		}
		if n > 0 {
			continue
		}
		t, err := inst.callFn(ctx, eng, eng.timersFn)
		if err != nil {
			return err
		}
		if err := inst.check(ctx, eng, t); err != nil {
			return err
		}
		next, err := inst.do(ctx, inst.getFloat64, uint64(t))
		inst.do(ctx, inst.freeValue, uint64(t))
		if err != nil {
			return err
		}
		if call.done {
			break
		}
		wait := api.DecodeF64(next)
		if wait < 0 {
			// Nothing left to run and no result: a promise nobody resolves.
			if n, _ := inst.do(ctx, inst.execJob); n == 0 && !call.done {
				return errJSStalled
			}
			continue
		}
		if wait > 0 {
			// A timer's wait holds no core.
			call.st.cpu.release()
			timer := time.NewTimer(time.Duration(wait * float64(time.Millisecond)))
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return context.Cause(ctx)
			}
			if err := call.st.cpu.acquire(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Runtime) classifyJS(ctx context.Context, inst *jsInstance, call *jsCall, lim Limits, start time.Time, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		switch {
		case errors.Is(cause, errTimeout):
			return failf(FailTimeout, "Bot execution timed out after %d ms", lim.Timeout.Milliseconds())
		case errors.Is(cause, context.DeadlineExceeded):
			return failf(FailTimeout, "Bot execution timed out after %d ms", time.Since(start).Milliseconds())
		case errors.Is(cause, errLogFlood):
			return r.logFlood()
		default:
			return fmt.Errorf("bot execution canceled: %w", cause)
		}
	}
	if inst.mem.wasRefused() {
		return failf(FailMemory, "Bot exceeded the memory limit of %d bytes", lim.MemoryBytes)
	}
	if call.overflow {
		return failf(FailOutput, "Bot output exceeded the limit of %d bytes", lim.OutputBytes)
	}
	if errors.Is(err, errJSStalled) {
		return failf(FailEnvelope, "Bot's handler returned a promise that never settles (nothing left to run: no pending timer or FHIR request)")
	}
	var je *jsError
	if errors.As(err, &je) {
		if je.Name == "InternalError" && strings.Contains(je.Message, "out of memory") {
			return failf(FailMemory, "Bot exceeded the memory limit of %d bytes", lim.MemoryBytes)
		}
		return failf(FailTrap, "Bot failed: %s", je.Error())
	}
	msg := err.Error()
	if errors.Is(err, errStackExceeded) || strings.Contains(msg, "stack overflow") {
		return failf(FailStack, "Bot exceeded the call stack limit of %d bytes (recursion too deep)", r.jsStackBytes())
	}
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return failf(FailTrap, "Bot trapped in the JavaScript engine: %s", msg)
}

// stripDataSegments returns the engine with every data segment emptied (made
// passive and zero-length, so that segment indices stay valid): an instance
// restored over an image must not have its memory written at instantiation.
func stripDataSegments(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 {
		return nil, errTruncated
	}
	r := &reader{b: wasm, off: 8}
	out := append(make([]byte, 0, len(wasm)), wasm[:8]...)
	for r.off < len(wasm) {
		start := r.off
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		size, err := r.u32()
		if err != nil {
			return nil, err
		}
		body, err := r.bytes(size)
		if err != nil {
			return nil, err
		}
		if id != secData {
			out = append(out, wasm[start:r.off]...)
			continue
		}
		br := &reader{b: body}
		n, err := br.u32()
		if err != nil {
			return nil, err
		}
		nb := appendU32(nil, n)
		for i := uint32(0); i < n; i++ {
			nb = append(nb, 0x01, 0x00) // passive, no bytes
		}
		out = append(out, secData)
		out = appendU32(out, uint32(len(nb)))
		out = append(out, nb...)
	}
	return out, nil
}

// instantiateJSHost provides the engine's "env" imports.
func instantiateJSHost(ctx context.Context, wz wazero.Runtime) error {
	i32 := api.ValueTypeI32
	b := wz.NewHostModuleBuilder(jsHostModule)
	fn := func(f api.GoModuleFunc, params, results []api.ValueType, name string) {
		b.NewFunctionBuilder().WithGoModuleFunction(f, params, results).Export(name)
	}
	fn(jsHostCall, []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}, "host_call")
	fn(func(ctx context.Context, _ api.Module, stack []uint64) {
		stack[0] = 0
		if ctx.Err() != nil {
			stack[0] = 1
		}
	}, nil, []api.ValueType{i32}, "host_interrupt")
	// Bots run in UTC.
	fn(func(_ context.Context, _ api.Module, stack []uint64) { stack[0] = 0 }, []api.ValueType{i32, i32}, []api.ValueType{i32}, "host_get_timezone_offset")
	// The rejection tracker is never enabled.
	fn(func(context.Context, api.Module, []uint64) {}, []api.ValueType{i32, i32, i32}, nil, "host_promise_rejection")
	fn(jsModuleNormalize, []api.ValueType{i32, i32}, []api.ValueType{i32}, "host_module_normalize")
	fn(jsModuleLoad, []api.ValueType{i32, i32}, []api.ValueType{i32}, "host_module_load")
	_, err := b.Instantiate(ctx)
	return err
}

func cString(mem api.Memory, p uint32) (string, bool) {
	var b []byte
	for n := 0; n < 4096; n++ {
		c, ok := mem.ReadByte(p + uint32(n))
		if !ok {
			return "", false
		}
		if c == 0 {
			return string(b), true
		}
		b = append(b, c)
	}
	return "", false
}

// jsModuleNormalize keeps specifiers as they are: the only module a bot
// imports is @medplum/core.
func jsModuleNormalize(ctx context.Context, mod api.Module, stack []uint64) {
	call := jsCallFrom(ctx)
	name, ok := cString(mod.Memory(), uint32(stack[1]))
	if call == nil || !ok {
		stack[0] = 0
		return
	}
	p, err := call.inst.cstring(ctx, []byte(name))
	if err != nil {
		panic(err)
	}
	stack[0] = uint64(p)
}

func jsModuleLoad(ctx context.Context, mod api.Module, stack []uint64) {
	call := jsCallFrom(ctx)
	name, ok := cString(mod.Memory(), uint32(stack[0]))
	if call == nil || !ok || name != "@medplum/core" {
		stack[0] = 0 // "could not load module"
		return
	}
	src := call.eng.coreModule
	p, err := call.inst.cstring(ctx, src)
	if err != nil {
		panic(err)
	}
	mod.Memory().WriteUint32Le(uint32(stack[1]), uint32(len(src)))
	stack[0] = uint64(p)
}

// jsHostCall answers __sandbot_host(op, arg) for the bridge.
func jsHostCall(ctx context.Context, mod api.Module, stack []uint64) {
	stopIfDone(ctx)
	argc, argv := uint32(stack[3]), uint32(stack[4])
	call := jsCallFrom(ctx)
	if call == nil || argc < 2 {
		panic(hostError("sandbot JavaScript host call outside an execution"))
	}
	inst, eng := call.inst, call.eng
	mem := mod.Memory()
	opPtr, _ := mem.ReadUint32Le(argv)
	argPtr, _ := mem.ReadUint32Le(argv + 4)
	op, _, err := inst.readString(ctx, eng, opPtr, 16)
	if err != nil {
		panic(err)
	}
	limit := 64 << 20
	if string(op) == "done" {
		limit = call.output
	}
	arg, fits, err := inst.readString(ctx, eng, argPtr, limit)
	if err != nil {
		panic(err)
	}
	var reply []byte
	switch string(op) {
	case "log":
		if len(arg) > 0 {
			call.st.logs.add(int(min(max(arg[0]-'0', 0), 3)), arg[1:])
		}
	case "fhir":
		reply = fhirNotImplemented
		if call.st.fhir != nil {
			call.st.offCPU(ctx, func() { reply = call.st.fhir(ctx, arg) })
		}
	case "random":
		n, _ := strconv.Atoi(string(arg))
		n = min(max(n, 0), 65536)
		b := make([]byte, n)
		_, _ = rand.Read(b)
		reply = hex.AppendEncode(nil, b)
	case "done":
		call.done = true
		call.overflow = !fits
		call.envelope = arg
	}
	var v uint64
	if reply != nil {
		p, err := inst.jsString(ctx, reply)
		if err != nil {
			panic(err)
		}
		v = uint64(p)
	} else if v, err = inst.do(ctx, inst.getUndefined); err != nil {
		panic(err)
	}
	stack[0] = v
}
