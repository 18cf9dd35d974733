package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
)

// Compilation runs in a child process: the program's own executable started
// again (RunCompilerChild), under an address space and a CPU time rlimit, so
// that no module, whatever blow-up it finds in the compiler, can take the
// server's memory or CPU: past the ceiling the child is killed and the module
// refused. The child writes the machine code to wazero's on-disk compilation
// cache; the server then "compiles" the same bytes with the same
// configuration, which wazero answers from that cache (its key is the
// module's bytes, the configuration's termination flag, wazero's version and
// the CPU's features, all of which the child shares: it is the same
// executable, /proc/self/exe, on the same machine). The server's own call is
// made with a canceled context and two compilation workers, with which
// wazero's compiler stops before its first function: should the entry be
// missing, the server does not compile in-process, it fails.
//
// Compilations run at most CompileConcurrency at once; up to CompileQueue
// more wait for a slot, and beyond that Compile answers *BusyError. Callers
// asking for the same bytes share one compilation, which is abandoned (the
// child killed) when every one of them has gone.

const (
	childArg      = "__sandbot_compile"
	childEnv      = "SANDBOT_COMPILER_CHILD"
	childCacheEnv = "SANDBOT_COMPILER_CACHE_DIR"
	childMemEnv   = "SANDBOT_COMPILER_MEMORY_BYTES"
	childCPUEnv   = "SANDBOT_COMPILER_CPU_SECONDS"
	childMaxInput = 2 << 30
	// childInvalid is the child's exit code for a module wazero refused;
	// its message is on stdout.
	childInvalid = 3
)

var compilerChildEnabled atomic.Bool

// RunCompilerChild must be called first in main, and in TestMain of every
// test binary that compiles bots: in the compiler child process that Compile
// starts it compiles one module and exits; in any other process it returns
// at once, and enables Compile (which refuses to start a child from a
// program that would not run this).
func RunCompilerChild() {
	if len(os.Args) > 1 && os.Args[1] == childArg && os.Getenv(childEnv) == "1" {
		os.Exit(compilerChild())
	}
	compilerChildEnabled.Store(true)
}

// BusyError is a request refused for lack of capacity (compile slots, the
// execution memory budget): the caller may retry after RetryAfter.
type BusyError struct {
	Reason     string
	RetryAfter time.Duration
}

func (e *BusyError) Error() string { return e.Reason }

// engineConfig is the wazero configuration of both the server and the
// compiler child; everything in it that wazero's cache key depends on must
// be the same in both.
func engineConfig(cache wazero.CompilationCache) wazero.RuntimeConfig {
	return wazero.NewRuntimeConfigCompiler().
		// No close-on-context-done: every module that runs, bots' and the
		// JavaScript engine, is instrumented with fuel (wasmrewrite.go),
		// whose yields stop an execution past its deadline whatever the
		// shape of its code. wazero's check, compiled into every loop
		// header, made a tight loop over 10 times slower (26 ns an
		// iteration instead of 2.1-2.4 with fuel alone) and QuickJS about
		// 2-3 times (runtime/RATIONALE.md, "Fuel").
		WithCloseOnContextDone(false).
		// The engine allows the whole wasm32 space: the limit is enforced
		// by the allocator (guestMemory), so that every grow past it, of any
		// size, reaches the allocator, which refuses it and so knows that the
		// failure that follows is a memory failure. A cap just above the
		// limit let larger grows (a C malloc grows 16 pages at a time) be
		// refused by wazero unseen, and the trap looked like any other.
		WithMemoryLimitPages(wasm32MaxPages).
		// Custom sections are dropped by the rewrite; no debug information.
		WithDebugInfoEnabled(false).
		WithCompilationCache(cache)
}

// compileFlight is one compilation shared by the callers asking for the
// same bytes.
type compileFlight struct {
	done    chan struct{}
	mod     *Module
	err     error
	waiters int // under Runtime.mu
	cancel  context.CancelFunc
}

// Compile validates wasm against the ABI and the module budget, and compiles
// it, once per distinct content: later calls with the same bytes return the
// same *Module, and concurrent calls share one compilation. A rejected
// module is a *ModuleError; no free compile slot is a *BusyError; a caller
// that goes away gets its context's error (and the compilation stops when
// no caller is left).
func (r *Runtime) Compile(ctx context.Context, wasm []byte) (*Module, error) {
	if int64(len(wasm)) > r.cfg.Limits.ModuleBytes {
		return nil, moduleErrorf("module is %d bytes, over the limit of %d bytes", len(wasm), r.cfg.Limits.ModuleBytes)
	}
	hash := HashBytes(wasm)
	if m, ok := r.Lookup(hash); ok {
		r.metrics.cacheHits.Inc()
		return m, nil
	}
	return r.shared(ctx, hash, func(ctx context.Context) (*Module, error) {
		return r.compile(ctx, hash, wasm)
	})
}

// shared runs compile once for all the callers asking for key at the same
// time, and keeps its module. The compilation runs on a context of its own
// (with the first caller's values), canceled when the last caller waiting
// for it goes away.
func (r *Runtime) shared(ctx context.Context, key string, compile func(context.Context) (*Module, error)) (*Module, error) {
	r.mu.Lock()
	f := r.flights[key]
	if f == nil {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &compileFlight{done: make(chan struct{}), cancel: cancel}
		r.flights[key] = f
		go r.fly(fctx, key, compile, f)
	} else {
		r.metrics.cacheHits.Inc()
	}
	f.waiters++
	r.mu.Unlock()
	select {
	case <-f.done:
		return f.mod, f.err
	case <-ctx.Done():
		r.mu.Lock()
		f.waiters--
		if f.waiters == 0 {
			f.cancel()
			if r.flights[key] == f {
				delete(r.flights, key)
			}
		}
		r.mu.Unlock()
		return nil, ctx.Err()
	}
}

func (r *Runtime) fly(ctx context.Context, key string, compile func(context.Context) (*Module, error), f *compileFlight) {
	defer f.cancel()
	m, err := compile(ctx)
	if err == nil {
		r.keep(m)
	}
	f.mod, f.err = m, err
	r.mu.Lock()
	if r.flights[key] == f {
		delete(r.flights, key)
	}
	r.mu.Unlock()
	close(f.done)
}

func (r *Runtime) compile(ctx context.Context, hash string, wasm []byte) (*Module, error) {
	if m, ok := r.Lookup(hash); ok { // kept by a compilation that just ended
		return m, nil
	}
	r.metrics.cacheMisses.Inc()
	start := time.Now()
	if isDeploying(ctx) {
		// The deploy's limit covers the whole compilation, the pre-parse
		// and rewrite included.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, start.Add(time.Duration(r.cfg.Limits.CompileSeconds)*time.Second))
		defer cancel()
	}
	// Another replica's compiled code, if it shared it (artifact.go), with
	// the module as it prepared it.
	var cm wazero.CompiledModule
	var usage childUsage
	var art *Artifact
	var prepared []byte
	var info *moduleInfo
	sh := artifactsOf(ctx)
	fetched := false
	if sh != nil {
		if a := r.fetchArtifact(ctx, sh, hash); a != nil {
			fetched = true
			prepared, info = r.decodePrepared(a.Prepared)
		}
	}
	if prepared == nil {
		var imports []wasmImport
		var err error
		imports, prepared, info, err = prepareModule(wasm, &r.budget, r.stackSlots)
		if err != nil {
			var me *ModuleError
			if errors.As(err, &me) {
				return nil, err
			}
			return nil, moduleErrorf("invalid module: %v", err)
		}
		if err := r.checkImportNames(imports); err != nil {
			return nil, err
		}
	}
	var err error
	if fetched {
		if cm, err = r.load(prepared); err == nil {
			r.metrics.artifacts.WithLabelValues("loaded").Inc()
		} else {
			// Built for another CPU (wazero's file name differs) or
			// otherwise unusable here: compile.
			cm = nil
			r.metrics.artifacts.WithLabelValues("unusable").Inc()
		}
	}
	if cm == nil {
		if usage, art, err = r.compileInChild(ctx, prepared, hash); err != nil {
			return nil, err
		}
		if cm, err = r.load(prepared); err != nil {
			return nil, err
		}
	}
	m, err := r.checkShape(cm, info)
	if err != nil {
		_ = cm.Close(context.Background())
		return nil, err
	}
	if sh != nil && art != nil {
		// Stored before the compilation returns: a deploy answers once
		// every replica can load the module.
		art.Prepared = r.encodePrepared(prepared, info)
		r.storeArtifact(ctx, sh, art)
	}
	m.hash = hash
	m.size = len(wasm)
	if info.image != nil {
		if m.image, err = newJSImage(info.image, 0); err != nil {
			_ = cm.Close(context.Background())
			return nil, err
		}
	}
	d := time.Since(start)
	r.metrics.compileDuration.Observe(d.Seconds())
	r.log.Info("bot module compiled", "hash", hash, "bytes", len(wasm), "shape", m.shape.String(), "duration", d,
		"compiler_cpu", usage.cpu, "compiler_max_rss", usage.maxRSS)
	return m, nil
}

// load has wazero decode and validate the prepared module, whose machine
// code the child has put in the on-disk cache. The context is canceled and
// asks for two compilation workers: on a cache miss wazero's compiler stops
// before compiling anything.
func (r *Runtime) load(prepared []byte) (wazero.CompiledModule, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cm, err := r.wz.CompileModule(experimental.WithCompilationWorkers(ctx, 2), prepared)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil, errors.New("runtime: the compiled module is missing from the compilation cache (was the cache directory removed?)")
		}
		return nil, moduleErrorf("invalid module: %v", firstLine(err.Error()))
	}
	return cm, nil
}

// slot waits for a compile slot, or refuses when too many already wait.
func (r *Runtime) slot(ctx context.Context) (release func(), err error) {
	select {
	case r.compileSlots <- struct{}{}:
		return func() { <-r.compileSlots }, nil
	default:
	}
	if r.compileWaiting.Add(1) > max(r.cfg.Limits.CompileQueue, 0) {
		r.compileWaiting.Add(-1)
		r.metrics.compileRefused.Inc()
		return nil, &BusyError{Reason: "Too many bot modules are being compiled; try again shortly", RetryAfter: 5 * time.Second}
	}
	defer r.compileWaiting.Add(-1)
	select {
	case r.compileSlots <- struct{}{}:
		return func() { <-r.compileSlots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// childUsage is what a compiler child spent.
type childUsage struct {
	cpu    time.Duration
	maxRSS int64 // bytes
}

// compileInChild runs the compiler child on prepared, in a compile slot,
// writing into a directory of its own, whose file it then moves into the
// cache directory: the child's output is known exactly, to be shared
// (artifact.go). The artifact is nil when it cannot be shared.
func (r *Runtime) compileInChild(ctx context.Context, prepared []byte, hash string) (childUsage, *Artifact, error) {
	dir, err := os.MkdirTemp(r.cacheDir, ".child-")
	if err != nil {
		return childUsage{}, nil, fmt.Errorf("runtime: compiler child: %w", err)
	}
	defer os.RemoveAll(dir)
	u, err := r.runChild(ctx, prepared, dir)
	r.lastChild.Store(&u)
	if err != nil {
		return u, nil, err
	}
	a, err := r.childOutput(dir, hash)
	return u, a, err
}

func (r *Runtime) runChild(ctx context.Context, prepared []byte, dir string) (usage childUsage, err error) {
	if !compilerChildEnabled.Load() {
		return usage, errors.New("runtime: this program does not run the compiler child: call runtime.RunCompilerChild first in main (and in TestMain)")
	}
	release, err := r.slot(ctx)
	if err != nil {
		if isDeploying(ctx) && errors.Is(err, context.DeadlineExceeded) {
			// The deploy's time went on waiting for a compile slot.
			return usage, &BusyError{Reason: "Too many bot modules are being compiled; try again shortly", RetryAfter: 5 * time.Second}
		}
		return usage, err
	}
	defer release()
	lim := r.cfg.Limits
	// A deploy's caller waits for the compilation: it gets CompileSeconds.
	// A module already deployed compiles again (another replica, a cold
	// cache) in the background, under the CPU ceiling alone.
	deploy := isDeploying(ctx)
	wall := time.Duration(lim.CompileCPUSeconds)*2*time.Second + 10*time.Second
	if dl, ok := ctx.Deadline(); deploy && ok {
		wall = time.Until(dl)
	}
	ctx, cancel := context.WithTimeout(ctx, wall)
	defer cancel()
	exe, err := os.Executable()
	if goruntime.GOOS == "linux" {
		exe, err = "/proc/self/exe", nil // this very binary, even if the file was replaced
	}
	if err != nil {
		return usage, fmt.Errorf("runtime: compiler child: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe, childArg)
	cmd.Args[0] = os.Args[0]
	// Only what the child needs: the server's environment holds secrets.
	cmd.Env = []string{
		childEnv + "=1",
		childCacheEnv + "=" + dir,
		childMemEnv + "=" + strconv.FormatInt(lim.CompileMemoryBytes, 10),
		childCPUEnv + "=" + strconv.FormatInt(lim.CompileCPUSeconds, 10),
		"GOMAXPROCS=" + strconv.Itoa(compileThreads()),
	}
	cmd.Stdin = bytes.NewReader(prepared)
	var stdout, stderr cappedBuffer
	stdout.max, stderr.max = 4<<10, 16<<10
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	start := time.Now()
	err = cmd.Run()
	r.metrics.childCompiles.Inc()
	if ps := cmd.ProcessState; ps != nil {
		usage.cpu = ps.UserTime() + ps.SystemTime()
		usage.maxRSS = maxRSS(ps)
	}
	if err == nil {
		return usage, nil
	}
	if ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && time.Since(start) >= wall {
			limit := time.Duration(lim.CompileSeconds) * time.Second
			if deploy && usage.cpu < wall/2 {
				// The child was starved of CPU (the server is busy), not
				// held up by the module: the caller may try again.
				r.metrics.compileRefused.Inc()
				return usage, &BusyError{Reason: "The server is too busy to compile the module now; try again shortly", RetryAfter: 5 * time.Second}
			}
			if !deploy {
				limit = wall
			}
			return usage, moduleErrorf("module is too expensive to compile: not done within the compile time limit of %s", limit)
		}
		return usage, ctx.Err()
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return usage, fmt.Errorf("runtime: compiler child: %w", err)
	}
	msg := stderr.String()
	switch {
	case exit.ExitCode() == childInvalid:
		return usage, moduleErrorf("invalid module: %s", firstLine(stdout.String()))
	case killedBySignal(exit.ProcessState) || usage.cpu >= time.Duration(lim.CompileCPUSeconds)*time.Second-100*time.Millisecond:
		// The kernel kills the child with SIGKILL at the RLIMIT_CPU hard
		// limit (the context was not done, so it was not us).
		r.log.Warn("bot module compilation stopped at the CPU time ceiling", "cpu", usage.cpu)
		return usage, moduleErrorf("module is too expensive to compile: over the compile CPU time limit of %d s", lim.CompileCPUSeconds)
	case childOutOfMemory(msg):
		r.log.Warn("bot module compilation stopped at the memory ceiling", "cpu", usage.cpu, "max_rss", usage.maxRSS)
		return usage, moduleErrorf("module is too expensive to compile: over the compile memory limit of %d bytes", lim.CompileMemoryBytes)
	default:
		// The compiler crashed on this module: the module's fault as far as
		// the caller can tell, and worth a look.
		r.log.Error("bot module compilation failed", "exit", exit.ProcessState.String(), "cpu", usage.cpu, "stderr", firstLine(msg))
		return usage, moduleErrorf("module could not be compiled (%s)", exit.ProcessState.String())
	}
}

// childOutOfMemory reports whether the child's last words say that it ran
// out of address space. A new thread's stack is mapped too, so under the
// ceiling the runtime may fail there first: with cgo, pthread_create answers
// EAGAIN ("Resource temporarily unavailable"), without it clone ENOMEM.
func childOutOfMemory(stderr string) bool {
	for _, s := range []string{"out of memory", "cannot allocate memory", "pthread_create failed", "failed to create new OS thread"} {
		if strings.Contains(stderr, s) {
			return true
		}
	}
	return false
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// compilerChild is the child process: it limits itself, reads the prepared
// module from stdin, compiles it into the cache directory and exits 0, or
// childInvalid with wazero's message on stdout.
func compilerChild() int {
	memory, _ := strconv.ParseInt(os.Getenv(childMemEnv), 10, 64)
	cpu, _ := strconv.ParseInt(os.Getenv(childCPUEnv), 10, 64)
	dir := os.Getenv(childCacheEnv)
	if memory <= 0 || cpu <= 0 || dir == "" {
		fmt.Fprintln(os.Stderr, "compiler child: missing limits or cache directory")
		return 2
	}
	// Compiling is background work: the server's request threads come
	// first on a busy machine.
	lowerPriority()
	if err := limitSelf(memory, cpu); err != nil {
		fmt.Fprintln(os.Stderr, "compiler child: rlimits:", err)
		return 2
	}
	// The collector works harder before the address space runs out.
	debug.SetMemoryLimit(memory * 3 / 4)
	wasm, err := io.ReadAll(io.LimitReader(os.Stdin, childMaxInput))
	if err != nil {
		fmt.Fprintln(os.Stderr, "compiler child: reading the module:", err)
		return 2
	}
	// As many compilation workers as the child may use threads: a module's
	// functions compile in parallel.
	ctx := experimental.WithCompilationWorkers(context.Background(), goruntime.GOMAXPROCS(0))
	cache, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compiler child: cache:", err)
		return 2
	}
	wz := wazero.NewRuntimeWithConfig(ctx, engineConfig(cache))
	if _, err := wz.CompileModule(ctx, wasm); err != nil {
		fmt.Fprintln(os.Stdout, err.Error())
		return childInvalid
	}
	_ = wz.Close(ctx)
	_ = cache.Close(ctx)
	return 0
}

type deployingKey struct{}

// Deploying marks ctx as a deploy's: compilations asked under it are held to
// limits.CompileSeconds of wall-clock time, since a caller waits for them;
// a module that takes longer is refused as too expensive to compile (or,
// when the compiler got less than half that time of CPU, the caller is told
// to try again: the server was too busy). Other compilations (a module
// deployed before, compiled again on another replica or after the cache was
// lost) have the CPU ceiling alone.
func Deploying(ctx context.Context) context.Context {
	return context.WithValue(ctx, deployingKey{}, true)
}

func isDeploying(ctx context.Context) bool { b, _ := ctx.Value(deployingKey{}).(bool); return b }

// compileThreads is how many threads a compiler child uses: two where the
// machine has them, so that a module compiles in about half the time its
// caller waits, while one core is left to the server.
func compileThreads() int { return min(goruntime.NumCPU(), 2) }
