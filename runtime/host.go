package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// execState is the per-execution state the host functions reach through the
// call's context.
type execState struct {
	fhir func(ctx context.Context, request []byte) []byte
	logs *logBuffer
	// cpu is the execution's turn with the CPU: it yields at fuel yields,
	// and gives its core up while the host answers a FHIR call.
	cpu *turn
}

// offCPU runs fn, which waits on I/O, without holding a core, and takes a
// core again after it (stopping the execution if its deadline passes
// meanwhile).
func (st *execState) offCPU(ctx context.Context, fn func()) {
	if st == nil || st.cpu == nil {
		fn()
		return
	}
	st.cpu.release()
	fn()
	if err := st.cpu.acquire(ctx); err != nil {
		panic(err)
	}
}

type stateKey struct{}

func stateFrom(ctx context.Context) *execState {
	st, _ := ctx.Value(stateKey{}).(*execState)
	return st
}

// fhirNotImplemented answers the fhir import when the host gave no handler.
var fhirNotImplemented = []byte(`{"status":501,"body":{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"not-supported","details":{"text":"FHIR access is not available to this execution"}}]}}`)

// fhirReplyTooLarge answers a FHIR call whose reply is over the output
// limit: the host buffers at most that much for a guest.
func fhirReplyTooLarge(limit int) []byte {
	return fmt.Appendf(nil, `{"status":413,"body":{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"too-costly","details":{"text":"FHIR response over the bot's limit of %d bytes: ask for less (_count, _elements)"}}]}}`, limit)
}

// instantiateWASI instantiates wazero's WASI functions, but random_get,
// whose one call may fill the whole memory (64 MiB: a tenth of a second of
// CPU): sandbot's fills it a mebibyte at a time, checking the deadline and
// taking its turn with the CPU in between.
func instantiateWASI(ctx context.Context, wz wazero.Runtime) error {
	b := wz.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	i32 := api.ValueTypeI32
	b.NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostRandomGet), []api.ValueType{i32, i32}, []api.ValueType{i32}).
		WithParameterNames("buf", "buf_len").
		Export("random_get")
	_, err := b.Instantiate(ctx)
	return err
}

// randomChunk is how much random_get fills between two checks.
const randomChunk = 1 << 20

// hostRandomGet is WASI's random_get (errno 0 on success, 21 EFAULT for a
// buffer out of bounds).
func hostRandomGet(ctx context.Context, mod api.Module, stack []uint64) {
	buf, n := uint32(stack[0]), uint32(stack[1])
	b, ok := mod.Memory().Read(buf, n)
	if !ok {
		stack[0] = 21 // EFAULT
		return
	}
	st := stateFrom(ctx)
	for len(b) > 0 {
		stopIfDone(ctx)
		if st != nil {
			if err := st.cpu.yield(ctx); err != nil {
				panic(err)
			}
		}
		k := min(len(b), randomChunk)
		if _, err := rand.Read(b[:k]); err != nil {
			panic(err)
		}
		b = b[k:]
	}
	stack[0] = 0
}

func instantiateHost(ctx context.Context, wz wazero.Runtime) error {
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	_, err := wz.NewHostModuleBuilder("sandbot").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostLog), []api.ValueType{i32, i32, i32}, nil).
		WithParameterNames("level", "ptr", "len").
		Export("log").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostFHIR), []api.ValueType{i32, i32}, []api.ValueType{i64}).
		WithParameterNames("ptr", "len").
		WithResultNames("response").
		Export("fhir").
		Instantiate(ctx)
	if err != nil {
		return err
	}
	_, err = wz.NewHostModuleBuilder(yieldModule).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostYield), []api.ValueType{i32}, nil).
		WithParameterNames("reason").
		Export(yieldName).
		Instantiate(ctx)
	return err
}

// errStackExceeded stops an execution whose call depth passed the stack
// limit; errInstanceClosed one whose instance was closed under it (the
// runtime closing).
var (
	errStackExceeded  = errors.New("bot call stack limit exceeded")
	errInstanceClosed = errors.New("bot instance closed while running")
)

// hostYield is what the instrumented code calls when its fuel runs out
// (wasmrewrite.go): back in Go, the goroutine can be stopped by the garbage
// collector and the scheduler, and an execution past its deadline stops
// here, whatever the shape of its code. It is the only deadline of the
// code (the runtime has no close-on-context-done, engineConfig). It also
// stops an execution past the stack limit, and one whose instance was
// closed (Runtime.Close: without close-on-context-done, nothing else in
// compiled code looks).
func hostYield(ctx context.Context, mod api.Module, stack []uint64) {
	if uint32(stack[0]) == yieldStackExceeded {
		panic(errStackExceeded)
	}
	if ctx.Err() != nil {
		panic(context.Cause(ctx))
	}
	if mod.IsClosed() {
		panic(errInstanceClosed)
	}
	if st := stateFrom(ctx); st != nil {
		if err := st.cpu.yield(ctx); err != nil {
			panic(err)
		}
	}
}

// stopIfDone stops the execution calling a host function once its context
// is done: the deadline is checked at yields, up to yieldFuel instructions
// apart, and nothing the guest asks for in between (a FHIR call, a log
// line, a result) is done after it.
func stopIfDone(ctx context.Context) {
	if ctx.Err() != nil {
		panic(context.Cause(ctx))
	}
}

// hostError becomes a trap in the guest.
type hostError string

func (e hostError) Error() string { return string(e) }

func hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	stopIfDone(ctx)
	level, ptr, n := int32(stack[0]), uint32(stack[1]), uint32(stack[2])
	b, ok := mod.Memory().Read(ptr, n)
	if !ok {
		panic(hostError("sandbot.log: message out of bounds of memory"))
	}
	if st := stateFrom(ctx); st != nil && !st.logs.add(int(min(max(level, 0), 3)), b) {
		panic(errLogFlood) // the execution is over: stop now
	}
}

func hostFHIR(ctx context.Context, mod api.Module, stack []uint64) {
	stopIfDone(ctx)
	ptr, n := uint32(stack[0]), uint32(stack[1])
	req, ok := mod.Memory().Read(ptr, n)
	if !ok {
		panic(hostError("sandbot.fhir: request out of bounds of memory"))
	}
	req = bytes.Clone(req) // the guest's memory may move when it grows
	resp := fhirNotImplemented
	if st := stateFrom(ctx); st != nil && st.fhir != nil {
		st.offCPU(ctx, func() { resp = st.fhir(ctx, req) })
	}
	alloc := mod.ExportedFunction("sandbot_alloc")
	if alloc == nil {
		panic(hostError("sandbot.fhir: module does not export sandbot_alloc"))
	}
	res, err := alloc.Call(ctx, uint64(len(resp)))
	if err != nil {
		panic(err) // a trap, exit or timeout inside sandbot_alloc
	}
	out := uint32(res[0])
	if out == 0 {
		stack[0] = 0
		return
	}
	if !mod.Memory().Write(out, resp) {
		panic(hostError("sandbot.fhir: sandbot_alloc returned memory out of bounds"))
	}
	stack[0] = uint64(out)<<32 | uint64(len(resp))
}

// LogLine is one line a bot logged. Level is 0 debug, 1 info, 2 warn,
// 3 error.
type LogLine struct {
	Level int    `json:"level"`
	Text  string `json:"text"`
}

// minLogCharge is what every log line and every write to a log stream
// costs against the execution's log write limit, however short: an empty
// line or a zero-length WASI iovec is not free.
const minLogCharge = 64

// logBuffer keeps the last max bytes of an execution's log, and counts
// everything written to it against writeMax.
type logBuffer struct {
	mu        sync.Mutex
	max       int
	size      int
	lines     []LogLine // kept from start on
	costs     []int     // what each line costs against max
	start     int
	truncated bool

	writeMax int64 // 0: no write limit
	written  int64
	flooded  bool
	flood    func() // called once when written passes writeMax
}

// charge counts a write of n bytes (at least minLogCharge) and reports
// whether the execution is still within its log write limit.
func (l *logBuffer) charge(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chargeLocked(n)
}

func (l *logBuffer) chargeLocked(n int) bool {
	if l.writeMax <= 0 {
		return true
	}
	if l.flooded {
		return false
	}
	l.written += int64(max(n, minLogCharge))
	if l.written <= l.writeMax {
		return true
	}
	l.flooded = true
	if l.flood != nil {
		l.flood()
	}
	return false
}

// onFlood sets what happens when the write limit is passed.
func (l *logBuffer) onFlood(f func()) {
	l.mu.Lock()
	l.flood = f
	l.mu.Unlock()
}

// add charges and keeps a line (a line from sandbot.log or the JavaScript
// console: each call is a write); false: past the log write limit, the
// line is dropped.
func (l *logBuffer) add(level int, text []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.chargeLocked(len(text)) {
		return false
	}
	l.keep(level, text)
	return true
}

// keep keeps a line. A line costs its length plus one (its newline), and at
// least minLogCharge, against max, so that the lines kept, even empty ones,
// hold a bounded amount of host memory. Dropping the oldest lines is
// amortized (they are sliced off the front and compacted when half the
// slice is dropped): a log full of short lines used to copy all of them for
// every new one.
func (l *logBuffer) keep(level int, text []byte) {
	if l.max <= 0 {
		l.truncated = true
		return
	}
	cost := max(len(text)+1, minLogCharge)
	if cost > l.max {
		text = text[len(text)-min(len(text), l.max-1):]
		cost = l.max
		l.truncated = true
	}
	l.lines = append(l.lines, LogLine{Level: level, Text: string(text)})
	l.costs = append(l.costs, cost)
	l.size += cost
	for l.size > l.max {
		l.size -= l.costs[l.start]
		l.lines[l.start] = LogLine{}
		l.start++
		l.truncated = true
	}
	if l.start > len(l.lines)/2 {
		n := copy(l.lines, l.lines[l.start:])
		copy(l.costs, l.costs[l.start:])
		l.lines, l.costs, l.start = l.lines[:n], l.costs[:n], 0
	}
}

// keepLine keeps a line already charged (a line of a stream write).
func (l *logBuffer) keepLine(level int, text []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keep(level, text)
}

func (l *logBuffer) result() ([]LogLine, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]LogLine(nil), l.lines[l.start:]...), l.truncated
}

// lineWriter turns a WASI output stream into log lines.
type lineWriter struct {
	logs    *logBuffer
	level   int
	partial []byte
	last    string // last non-empty line, for a command's failure message
	panic   string // first Go "panic: " or "fatal error: " line
}

// errLogFlood is what a log stream's Write returns past the log write
// limit: WASI's fd_write stops at the first failing iovec.
var errLogFlood = errors.New("bot log write limit")

func (w *lineWriter) Write(p []byte) (int, error) {
	if !w.logs.charge(len(p)) {
		return 0, errLogFlood
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			// Bound a line without newline to what the log can keep.
			w.partial = append(w.partial, p...)
			if len(w.partial) > 2*w.logs.max {
				w.partial = append(w.partial[:0], w.partial[len(w.partial)-w.logs.max:]...)
			}
			break
		}
		w.emit(append(w.partial, p[:i]...))
		w.partial = w.partial[:0]
		p = p[i+1:]
	}
	return n, nil
}

func (w *lineWriter) emit(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(bytes.TrimSpace(line)) > 0 {
		w.last = string(line)
		if w.panic == "" && (bytes.HasPrefix(line, []byte("panic: ")) || bytes.HasPrefix(line, []byte("fatal error: "))) {
			w.panic = string(line)
		}
	}
	w.logs.keepLine(w.level, line)
}

func (w *lineWriter) flush() {
	if len(w.partial) > 0 {
		w.emit(w.partial)
		w.partial = nil
	}
}

// limitedBuffer collects a command's stdout up to max bytes; past that it
// calls over once and drops the rest.
type limitedBuffer struct {
	buf  bytes.Buffer
	max  int
	over func()
	hit  bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.hit {
		return len(p), nil
	}
	if b.buf.Len()+len(p) > b.max {
		b.hit = true
		b.over()
		return len(p), nil
	}
	return b.buf.Write(p)
}
