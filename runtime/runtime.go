package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/sandbot/sandbot/limits"
)

// ErrModuleEvicted is returned by Execute for a module that was evicted
// from the in-memory cache after the caller obtained it: compile the
// module's bytes again (the on-disk cache makes that fast) and retry.
var ErrModuleEvicted = errors.New("runtime: module evicted from the cache")

// Config configures a Runtime. The zero value is usable.
type Config struct {
	// CacheDir is wazero's on-disk compilation cache directory; "" keeps
	// compiled code in memory only.
	CacheDir string
	// Limits are the runtime's limits; zero fields take the defaults.
	// ModuleBytes is the largest module Compile accepts; BotMemoryBytes the
	// largest linear memory of any execution (modules declaring a larger
	// maximum are rejected); ModuleCacheBytes bounds the compiled modules
	// kept in memory (the least recently used beyond it is dropped, the
	// on-disk cache still holds its code). BotTimeout, BotMaxTimeout,
	// BotOutputBytes and BotLogBytes are each execution's defaults and
	// caps (see [Limits]).
	Limits limits.Limits
	// Registerer receives the runtime's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives compile and failure diagnostics; nil discards them.
	Logger *slog.Logger
	// BaseURL is the server's public base URL, the baseUrl of a JavaScript
	// bot's MedplumClient (its requests never leave the process); "" is
	// http://localhost:8103/.
	BaseURL string

	noPool bool // tests and benchmarks: plain Go memory instead of the pool
	noJS   bool // tests: behave as a build without the JavaScript engine
}

// Runtime compiles and executes bots. It is safe for concurrent use.
type Runtime struct {
	cfg Config
	// memoryLimit is cfg.Limits.BotMemoryBytes in whole pages.
	memoryLimit uint64
	wz          wazero.Runtime
	cache       wazero.CompilationCache
	wasi        map[string]api.FunctionDefinition
	pool        *memPool
	metrics     *metrics
	log         *slog.Logger

	jsOnce sync.Once // the JavaScript engine starts at the first JavaScript bot
	jsEng  *jsEngine
	jsErr  error
	jsIdle atomic.Int64 // idle JavaScript instances, all bots together
	// budget is the module structure limits of the pre-parse; stackSlots
	// the call depth limit in 8-byte slots.
	budget     moduleBudget
	stackSlots uint32
	// cacheDir is wazero's on-disk cache, which the compiler child writes;
	// ownCacheDir: a temporary one, removed at Close.
	cacheDir    string
	ownCacheDir bool
	// platform is wazero's cache directory name for this build, "" when
	// compiled code is not shared (artifact.go).
	platform       string
	compileSlots   chan struct{}
	compileWaiting atomic.Int64
	admission      *admission
	cpu            *cpuTurns
	lastChild      atomic.Pointer[childUsage] // for tests

	mu          sync.RWMutex
	modules     map[string]*Module
	cachedBytes int
	flights     map[string]*compileFlight
}

// wasm32MaxPages is the largest memory a 32-bit module can address (4 GiB).
const wasm32MaxPages = 65536

// New creates a Runtime: one wazero runtime using the optimizing compiler,
// with WASI and the sandbot host module instantiated once.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	cfg.Limits = cfg.Limits.WithDefaults()
	const page = 64 << 10
	if cfg.Limits.BotMemoryBytes < page {
		return nil, errors.New("runtime: BotMemoryBytes below one page")
	}
	memoryLimit := min(uint64(cfg.Limits.BotMemoryBytes)/page*page, 4<<30-page)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// The compiler child writes the machine code here and the server
	// reads it back: without a configured directory, a temporary one.
	cacheDir, ownCacheDir := cfg.CacheDir, false
	if cacheDir == "" {
		dir, err := os.MkdirTemp("", "sandbot-wasm-cache-")
		if err != nil {
			return nil, fmt.Errorf("runtime: compilation cache: %w", err)
		}
		cacheDir, ownCacheDir = dir, true
	}
	cache, err := wazero.NewCompilationCacheWithDir(cacheDir)
	if err != nil {
		if ownCacheDir {
			os.RemoveAll(cacheDir)
		}
		return nil, fmt.Errorf("runtime: compilation cache: %w", err)
	}
	l := cfg.Limits
	wz := wazero.NewRuntimeWithConfig(ctx, engineConfig(cache))
	r := &Runtime{
		cfg:         cfg,
		memoryLimit: memoryLimit,
		wz:          wz,
		cache:       cache,
		pool:        newMemPool(memoryLimit, 16),
		metrics:     newMetrics(cfg.Registerer),
		log:         logger,
		modules:     map[string]*Module{},
		flights:     map[string]*compileFlight{},
		budget: moduleBudget{
			functions:      uint64(l.ModuleFunctions),
			functionBytes:  uint64(l.ModuleFunctionBytes),
			codeBytes:      uint64(l.ModuleCodeBytes),
			functionLocals: uint64(l.ModuleFunctionLocals),
			locals:         uint64(l.ModuleLocals),
			brTableTargets: uint64(l.ModuleBrTableTargets),
			blockDepth:     uint64(l.ModuleBlockDepth),
			tableElements:  uint64(l.ModuleTableElements),
			types:          uint64(l.ModuleTypes),
			typeArity:      uint64(l.ModuleTypeArity),
			globals:        uint64(l.ModuleGlobals),
			dataSegments:   uint64(l.ModuleDataSegments),
			dataBytes:      memoryLimit,
		},
		stackSlots:   uint32(min(l.BotStackBytes/8, 1<<30)),
		cacheDir:     cacheDir,
		platform:     platform(cacheDir),
		ownCacheDir:  ownCacheDir,
		compileSlots: make(chan struct{}, max(l.CompileConcurrency, 1)),
		admission: newAdmission(l.ExecutionMemoryBytes, l.ProjectExecutionPercent, int(l.ExecutionsPerCore)*limits.Cores(),
			time.Duration(max(l.ExecutionWaitMillis, 0))*time.Millisecond),
		// GuestCores (by default twice the cores: runtime/RATIONALE.md,
		// "Sharing the CPU") is set by WithDefaults above.
		cpu: newCPUTurns(int(l.GuestCores)),
	}
	r.metrics.budgetBytes.Set(float64(r.admission.budget))
	if err := instantiateWASI(ctx, wz); err != nil {
		_ = r.Close(ctx)
		return nil, fmt.Errorf("runtime: WASI: %w", err)
	}
	r.wasi = wz.Module(wasi_snapshot_preview1.ModuleName).ExportedFunctionDefinitions()
	if err := instantiateHost(ctx, wz); err != nil {
		_ = r.Close(ctx)
		return nil, fmt.Errorf("runtime: host module: %w", err)
	}
	return r, nil
}

// Close releases the wazero runtime, every compiled module and the memory
// pool. Executions still running are stopped.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	for _, m := range r.modules {
		if m.js != nil || m.image != nil {
			m.evict() // a JavaScript or data image lives outside wazero
		}
	}
	r.mu.Unlock()
	err := r.wz.Close(ctx)
	if e := r.cache.Close(ctx); err == nil {
		err = e
	}
	r.pool.close()
	if r.ownCacheDir {
		os.RemoveAll(r.cacheDir)
	}
	return err
}

// Shape is how a module receives its event.
type Shape int

const (
	// Reactor modules export sandbot_alloc and sandbot_handle.
	Reactor Shape = iota
	// Command modules are WASI commands: event on stdin, envelope on stdout.
	Command
)

func (s Shape) String() string {
	switch s {
	case Command:
		return "command"
	case JavaScript:
		return "javascript"
	}
	return "reactor"
}

// Module is a validated, compiled bot module.
type Module struct {
	hash       string
	shape      Shape
	initialize bool
	minMemory  uint64 // bytes
	maxMemory  uint64 // bytes: the declared maximum, or the memory limit
	// instanceBytes estimates what an instance allocates outside its
	// linear memory (tables, globals, element and data instances).
	instanceBytes uint64
	size          int
	compiled      wazero.CompiledModule // nil for a JavaScript bot
	// image is the initial memory a module's large data segments make,
	// mapped copy-on-write into each instance's memory (the JavaScript
	// images' mechanism); nil when wazero copies the data in.
	image *jsImage
	js    *jsBot // a JavaScript bot's image and instances

	lastUse atomic.Int64 // UnixNano of when it was compiled or last executed

	// An evicted module's code is released when its last execution ends.
	mu      sync.Mutex
	running int
	evicted bool
}

// acquire marks an execution as using m; it fails once m is evicted.
func (m *Module) acquire() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.evicted {
		return false
	}
	m.running++
	m.lastUse.Store(time.Now().UnixNano())
	return true
}

func (m *Module) release() {
	m.mu.Lock()
	m.running--
	closeNow := m.evicted && m.running == 0
	m.mu.Unlock()
	if closeNow {
		m.closeCode()
	}
}

// closeCode releases the module's compiled code, or a JavaScript bot's image
// and idle instances.
func (m *Module) closeCode() {
	if m.js != nil {
		m.js.close()
		return
	}
	_ = m.compiled.Close(context.Background())
	if m.image != nil {
		m.image.close()
	}
}

// evict marks m evicted and releases its code unless executions still use it.
func (m *Module) evict() {
	m.mu.Lock()
	m.evicted = true
	closeNow := m.running == 0
	m.mu.Unlock()
	if closeNow {
		m.closeCode()
	}
}

// Hash is the hex SHA-256 of the module's bytes, its identity in the cache.
func (m *Module) Hash() string { return m.hash }

// Shape reports whether the module is a reactor or a WASI command.
func (m *Module) Shape() Shape { return m.shape }

// ModuleError is a module rejected by Compile: malformed, over a limit of
// the module budget, too expensive to compile, or not following the ABI; or
// JavaScript rejected by CompileJS, with the Line and Column (1-based) of a
// syntax error. Its message names the reason (and the limit).
type ModuleError struct {
	Reason       string
	Line, Column int
}

func (e *ModuleError) Error() string { return e.Reason }

func moduleErrorf(format string, args ...any) error {
	return &ModuleError{Reason: fmt.Sprintf(format, args...)}
}

// HashBytes returns the cache key of a module's bytes, as Module.Hash.
func HashBytes(wasm []byte) string {
	sum := sha256.Sum256(wasm)
	return hex.EncodeToString(sum[:])
}

// Lookup returns the compiled module with the given hash, if Compile has
// produced it in this process.
func (r *Runtime) Lookup(hash string) (*Module, bool) {
	r.mu.RLock()
	m, ok := r.modules[hash]
	r.mu.RUnlock()
	return m, ok
}

// keep adds m to the in-memory modules (if it is not there already) and
// evicts the least recently used others while the cache is over its budget.
func (r *Runtime) keep(m *Module) {
	m.lastUse.Store(time.Now().UnixNano())
	var evicted []*Module
	r.mu.Lock()
	if r.modules[m.hash] == m {
		r.mu.Unlock()
		return
	}
	r.modules[m.hash] = m
	r.cachedBytes += m.size
	for int64(r.cachedBytes) > r.cfg.Limits.ModuleCacheBytes && len(r.modules) > 1 {
		var lru *Module
		for _, c := range r.modules {
			if c != m && (lru == nil || c.lastUse.Load() < lru.lastUse.Load()) {
				lru = c
			}
		}
		delete(r.modules, lru.hash)
		r.cachedBytes -= lru.size
		evicted = append(evicted, lru)
	}
	r.metrics.cachedBytes.Set(float64(r.cachedBytes))
	r.mu.Unlock()
	for _, e := range evicted {
		e.evict()
		r.metrics.evictions.Inc()
		r.log.Info("bot module evicted from the cache", "hash", e.hash, "bytes", e.size)
	}
}

var hostSignatures = map[string]struct{ params, results []api.ValueType }{
	"log":  {[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, nil},
	"fhir": {[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}},
}

func (r *Runtime) checkImportNames(imports []wasmImport) error {
	for _, imp := range imports {
		switch {
		case imp.kind != 0:
			return moduleErrorf("import %q.%q is a %s; only functions from sandbot and wasi_snapshot_preview1 may be imported", imp.module, imp.name, imp.kindName())
		case imp.module == "sandbot":
			if _, ok := hostSignatures[imp.name]; !ok {
				return moduleErrorf("import %q.%q is not provided (sandbot provides log and fhir)", imp.module, imp.name)
			}
		case imp.module == wasi_snapshot_preview1.ModuleName:
			if _, ok := r.wasi[imp.name]; !ok {
				return moduleErrorf("import %q.%q is not a WASI preview 1 function", imp.module, imp.name)
			}
		default:
			return moduleErrorf("import %q.%q is not allowed; a bot may import only sandbot.log, sandbot.fhir and wasi_snapshot_preview1", imp.module, imp.name)
		}
	}
	return nil
}

func signature(params, results []api.ValueType) string {
	s := "("
	for i, p := range params {
		if i > 0 {
			s += ", "
		}
		s += api.ValueTypeName(p)
	}
	s += ") -> ("
	for i, p := range results {
		if i > 0 {
			s += ", "
		}
		s += api.ValueTypeName(p)
	}
	return s + ")"
}

func (r *Runtime) checkShape(cm wazero.CompiledModule, info *moduleInfo) (*Module, error) {
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod == yieldModule {
			continue // added by the rewrite
		}
		var want struct{ params, results []api.ValueType }
		if mod == "sandbot" {
			want = hostSignatures[name]
		} else {
			d := r.wasi[name]
			want.params, want.results = d.ParamTypes(), d.ResultTypes()
		}
		if !slices.Equal(f.ParamTypes(), want.params) || !slices.Equal(f.ResultTypes(), want.results) {
			return nil, moduleErrorf("import %q.%q has signature %s, want %s", mod, name,
				signature(f.ParamTypes(), f.ResultTypes()), signature(want.params, want.results))
		}
	}
	if len(cm.ImportedMemories()) > 0 {
		return nil, moduleErrorf("a bot may not import memory")
	}
	mems := cm.ExportedMemories()
	mem, ok := mems["memory"]
	if !ok {
		return nil, moduleErrorf("module does not export its memory as %q", "memory")
	}
	m := &Module{compiled: cm, minMemory: uint64(mem.Min()) << 16, maxMemory: r.memoryLimit, instanceBytes: info.instanceBytes}
	if max, ok := mem.Max(); ok {
		m.maxMemory = min(uint64(max)<<16, r.memoryLimit)
	}
	if m.minMemory > r.memoryLimit {
		return nil, moduleErrorf("initial memory %d bytes is over the limit of %d bytes", m.minMemory, r.memoryLimit)
	}
	if max, ok := mem.Max(); ok && uint64(max)<<16 > r.memoryLimit {
		return nil, moduleErrorf("memory maximum %d bytes is over the limit of %d bytes", uint64(max)<<16, r.memoryLimit)
	}

	fns := cm.ExportedFunctions()
	for _, f := range cm.ImportedFunctions() {
		if mod, name, _ := f.Import(); mod == "sandbot" && name == "fhir" {
			if _, ok := fns["sandbot_alloc"]; !ok {
				return nil, moduleErrorf("module imports sandbot.fhir but does not export sandbot_alloc")
			}
		}
	}
	check := func(name string, params, results []api.ValueType) error {
		f := fns[name]
		if !slices.Equal(f.ParamTypes(), params) || !slices.Equal(f.ResultTypes(), results) {
			return moduleErrorf("export %q has signature %s, want %s", name,
				signature(f.ParamTypes(), f.ResultTypes()), signature(params, results))
		}
		return nil
	}
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	_, hasStart := fns["_start"]
	_, hasInit := fns["_initialize"]
	// A module exporting _start and no _initialize is a command even if it
	// also exports sandbot_handle: Go's toolchain exports both when a bot
	// built as a command links the SDK, and calling sandbot_handle before
	// _start would find the Go runtime uninitialised.
	if _, ok := fns["sandbot_handle"]; ok && (hasInit || !hasStart) {
		m.shape = Reactor
		if _, ok := fns["sandbot_alloc"]; !ok {
			return nil, moduleErrorf("module exports sandbot_handle but not sandbot_alloc")
		}
		if err := check("sandbot_handle", []api.ValueType{i32, i32}, []api.ValueType{i64}); err != nil {
			return nil, err
		}
		if err := check("sandbot_alloc", []api.ValueType{i32}, []api.ValueType{i32}); err != nil {
			return nil, err
		}
		if hasInit {
			if err := check("_initialize", nil, nil); err != nil {
				return nil, err
			}
			m.initialize = true
		}
		return m, nil
	}
	if hasStart {
		m.shape = Command
		if err := check("_start", nil, nil); err != nil {
			return nil, err
		}
		return m, nil
	}
	return nil, moduleErrorf("module exports neither sandbot_handle (reactor) nor _start (WASI command)")
}
