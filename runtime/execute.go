package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"
)

// Limits bound one execution. They may only narrow the runtime's: a zero
// field takes the runtime's limit (Config.Limits: BotTimeout,
// BotMemoryBytes, BotOutputBytes, BotLogBytes) and a larger one is capped
// by it (Timeout by BotMaxTimeout).
type Limits struct {
	Timeout     time.Duration
	MemoryBytes uint64
	OutputBytes int
	LogBytes    int
}

func (r *Runtime) limits(l Limits) Limits {
	c := r.cfg.Limits
	if l.Timeout <= 0 {
		l.Timeout = c.BotTimeout
	}
	l.Timeout = min(l.Timeout, c.BotMaxTimeout)
	if l.MemoryBytes == 0 {
		l.MemoryBytes = r.memoryLimit
	}
	l.MemoryBytes = min(l.MemoryBytes, r.memoryLimit)
	if l.OutputBytes <= 0 {
		l.OutputBytes = int(c.BotOutputBytes)
	}
	l.OutputBytes = min(l.OutputBytes, int(c.BotOutputBytes))
	if l.LogBytes <= 0 {
		l.LogBytes = int(max(c.BotLogBytes, 0)) // negative keeps none
	}
	l.LogBytes = min(l.LogBytes, int(max(c.BotLogBytes, 0)))
	return l
}

// Execution is one run of a bot.
type Execution struct {
	// Event is the event JSON handed to the bot (bot ABI, "Event").
	Event  []byte
	Limits Limits
	// FHIR answers the bot's sandbot.fhir calls: it receives the request
	// JSON and returns the response JSON ({"status":...,"body":...}). Nil
	// answers every call with status 501. A reply larger than the output
	// limit reaches the bot as a 413.
	FHIR func(ctx context.Context, request []byte) []byte
	// Tenant is who the execution counts against besides the node (the
	// bot's project): the executions of one tenant may hold
	// ProjectExecutionPercent of the execution memory budget.
	Tenant string
}

// Result is what an execution produced. Logs are set even when Execute
// returns a *Failure.
type Result struct {
	Envelope     Envelope
	Logs         []LogLine
	LogTruncated bool
	Duration     time.Duration
	MemoryBytes  uint64 // linear memory size at the end of the execution
}

// Envelope is the bot's result envelope. Result and Error are nil when
// absent or null; Status is 0 when absent, else 200..499.
type Envelope struct {
	Result      json.RawMessage
	Error       json.RawMessage // a JSON string or an OperationOutcome object
	Status      int
	ContentType string
}

// FailureKind names what went wrong in a failed execution.
type FailureKind string

// The failure kinds. They are also the outcome label of
// sandbot_bot_executions_total (with "success" and "canceled").
const (
	FailTimeout  FailureKind = "timeout"
	FailMemory   FailureKind = "memory"
	FailOutput   FailureKind = "output"
	FailTrap     FailureKind = "trap"
	FailExit     FailureKind = "exit"
	FailEnvelope FailureKind = "envelope"
	FailStack    FailureKind = "stack"
)

// Failure is a guest failure: the bot, not the host, went wrong. The HTTP
// layer answers it with 400 and Message.
type Failure struct {
	Kind    FailureKind
	Message string
}

func (f *Failure) Error() string { return f.Message }

func failf(kind FailureKind, format string, args ...any) *Failure {
	return &Failure{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

var (
	errTimeout = errors.New("bot timeout")
	errOutput  = errors.New("bot output limit")
)

// Execute runs m once, in a fresh anonymous instance, on ex.Event. A guest
// failure is a *Failure and comes with the Result holding the logs; any
// other error (the caller's context canceled, a host problem) is returned
// as is.
func (r *Runtime) Execute(ctx context.Context, m *Module, ex Execution) (*Result, error) {
	if m == nil || (m.compiled == nil && m.js == nil) {
		return nil, errors.New("runtime: Execute with a nil module")
	}
	if !m.acquire() {
		return nil, ErrModuleEvicted
	}
	defer m.release()
	lim := r.limits(ex.Limits)
	release, refused := r.admission.acquire(ctx, ex.Tenant, r.reservation(m, lim))
	if refused != "" {
		r.metrics.admission.WithLabelValues(runtimeLabel(m), refused).Inc()
		if refused == "project" {
			return nil, &BusyError{Reason: "This project's bots are using their share of the server's execution memory; try again shortly", RetryAfter: retryAfter}
		}
		return nil, &BusyError{Reason: "Too many bot executions are running; try again shortly", RetryAfter: retryAfter}
	}
	if inner := ex.FHIR; inner != nil {
		ex.FHIR = func(ctx context.Context, req []byte) []byte {
			if resp := inner(ctx, req); len(resp) <= lim.OutputBytes {
				return resp
			}
			return fhirReplyTooLarge(lim.OutputBytes)
		}
	}
	r.metrics.reservedBytes.Set(float64(r.admission.reserved()))
	defer func() {
		release()
		r.metrics.reservedBytes.Set(float64(r.admission.reserved()))
	}()
	start := time.Now()
	r.metrics.inFlight.Inc()
	defer r.metrics.inFlight.Dec()

	res := &Result{}
	logs := &logBuffer{max: lim.LogBytes, writeMax: r.cfg.Limits.BotLogWriteBytes}
	cpu := &turn{c: r.cpu, tenant: ex.Tenant}
	defer func() { r.metrics.cpuWait.Observe(cpu.waited.Seconds()) }()
	var err error
	var used uint64
	if m.js != nil {
		used, err = r.runJS(ctx, m, ex, lim, logs, cpu, res, start)
	} else {
		mem := &guestMemory{limit: lim.MemoryBytes, image: m.image}
		if !r.cfg.noPool {
			mem.pool = r.pool
		}
		err = r.run(ctx, m, ex, lim, mem, logs, cpu, res, start)
		mem.Free() // in case wazero did not (idempotent)
		used, _ = mem.stats()
	}
	res.MemoryBytes = used
	res.Logs, res.LogTruncated = logs.result()
	res.Duration = time.Since(start)

	outcome := "success"
	var f *Failure
	switch {
	case errors.As(err, &f):
		outcome = string(f.Kind)
		r.log.Debug("bot execution failed", "hash", m.hash, "kind", f.Kind, "message", f.Message)
	case err != nil:
		outcome = "canceled"
	}
	r.metrics.executions.WithLabelValues(runtimeLabel(m), outcome).Inc()
	r.metrics.duration.WithLabelValues(runtimeLabel(m)).Observe(res.Duration.Seconds())
	r.metrics.guestMemory.Observe(float64(used))
	return res, err
}

func (r *Runtime) run(parent context.Context, m *Module, ex Execution, lim Limits, mem *guestMemory, logs *logBuffer, cpu *turn, res *Result, start time.Time) error {
	if m.minMemory > lim.MemoryBytes {
		return failf(FailMemory, "Bot needs %d bytes of memory, over the limit of %d bytes", m.minMemory, lim.MemoryBytes)
	}
	ctx, cancelTimeout := context.WithTimeoutCause(parent, lim.Timeout, errTimeout)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logs.onFlood(func() { cancel(errLogFlood) })
	ctx = context.WithValue(ctx, stateKey{}, &execState{fhir: ex.FHIR, logs: logs, cpu: cpu})
	ctx = experimental.WithMemoryAllocator(ctx, mem)

	stderr := &lineWriter{logs: logs, level: 1}
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithArgs("bot").
		WithSysWalltime().
		WithSysNanotime().
		WithRandSource(rand.Reader).
		WithStderr(stderr)
	var stdout *limitedBuffer
	stdoutLog := &lineWriter{logs: logs, level: 1} // a reactor's stdout is log
	if m.shape == Command {
		stdout = &limitedBuffer{max: lim.OutputBytes, over: func() { cancel(errOutput) }}
		cfg = cfg.WithStdin(bytes.NewReader(ex.Event)).WithStdout(stdout)
	} else {
		cfg = cfg.WithStdout(stdoutLog)
	}
	defer stdoutLog.flush()
	defer stderr.flush()

	// classify turns an error from wazero into the execution's error.
	classify := func(err error, what string) error {
		stderr.flush()
		if cause := context.Cause(ctx); cause != nil {
			switch {
			case errors.Is(cause, errOutput):
				return failf(FailOutput, "Bot output exceeded the limit of %d bytes", lim.OutputBytes)
			case errors.Is(cause, errLogFlood):
				return r.logFlood()
			case errors.Is(cause, errTimeout):
				return failf(FailTimeout, "Bot execution timed out after %d ms", lim.Timeout.Milliseconds())
			case errors.Is(cause, context.DeadlineExceeded):
				return failf(FailTimeout, "Bot execution timed out after %d ms", time.Since(start).Milliseconds())
			default:
				return fmt.Errorf("bot execution canceled: %w", cause)
			}
		}
		if _, refused := mem.stats(); refused {
			return failf(FailMemory, "Bot exceeded the memory limit of %d bytes", lim.MemoryBytes)
		}
		if errors.Is(err, errStackExceeded) || (err != nil && strings.Contains(err.Error(), "stack overflow")) {
			return failf(FailStack, "Bot exceeded the call stack limit of %d bytes (recursion too deep)", r.cfg.Limits.BotStackBytes)
		}
		var exit *sys.ExitError
		if errors.As(err, &exit) {
			msg := fmt.Sprintf("Bot exited with code %d", exit.ExitCode())
			if m.shape == Command && stderr.last != "" {
				msg = stderr.last
			} else if stderr.panic != "" {
				msg += ": " + stderr.panic
			} else if stderr.last != "" {
				msg += ": " + stderr.last
			}
			return &Failure{Kind: FailExit, Message: msg}
		}
		msg := "unknown error"
		if err != nil {
			msg = err.Error()
		}
		if i := strings.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		return failf(FailTrap, "Bot trapped in %s: %s", what, msg)
	}

	// Guest code runs on a core of its turn (admission.go): waiting for one
	// counts against the deadline.
	if err := cpu.acquire(ctx); err != nil {
		return classify(err, "the wait for a core")
	}
	defer cpu.release()
	inst, err := r.wz.InstantiateModule(ctx, m.compiled, cfg)
	if err != nil {
		return classify(err, "instantiation")
	}
	defer inst.Close(context.Background())

	var out []byte
	if m.shape == Command {
		if _, err := inst.ExportedFunction("_start").Call(ctx); err != nil {
			var exit *sys.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 0 || context.Cause(ctx) != nil {
				return classify(err, "_start")
			}
		}
		stderr.flush()
		if context.Cause(ctx) != nil {
			return classify(nil, "_start")
		}
		out = stdout.buf.Bytes()
		if len(bytes.TrimSpace(out)) == 0 {
			return failf(FailEnvelope, "Bot wrote no result envelope on stdout (a Go bot built as a command must call sdk.Handle from main, or be built with -buildmode=c-shared)")
		}
	} else {
		if m.initialize {
			if _, err := inst.ExportedFunction("_initialize").Call(ctx); err != nil {
				return classify(err, "_initialize")
			}
		}
		n := uint64(len(ex.Event))
		ret, err := inst.ExportedFunction("sandbot_alloc").Call(ctx, n)
		if err != nil {
			return classify(err, "sandbot_alloc")
		}
		ptr := uint32(ret[0])
		if ptr == 0 && n > 0 {
			if _, refused := mem.stats(); refused {
				return classify(nil, "sandbot_alloc")
			}
			return failf(FailTrap, "Bot's sandbot_alloc(%d) returned 0", n)
		}
		if !inst.Memory().Write(ptr, ex.Event) {
			return failf(FailTrap, "Bot's sandbot_alloc(%d) returned a pointer out of bounds", n)
		}
		ret, err = inst.ExportedFunction("sandbot_handle").Call(ctx, uint64(ptr), n)
		if err != nil {
			return classify(err, "sandbot_handle")
		}
		outPtr, outLen := uint32(ret[0]>>32), uint32(ret[0])
		if uint64(outLen) > uint64(lim.OutputBytes) {
			return failf(FailOutput, "Bot output exceeded the limit of %d bytes", lim.OutputBytes)
		}
		b, ok := inst.Memory().Read(outPtr, outLen)
		if !ok {
			return failf(FailEnvelope, "Bot returned a result envelope out of bounds of its memory")
		}
		out = b // parseEnvelope copies what it keeps
	}
	// A result that comes after the deadline is not a success: the bot
	// may have run past it between two checks.
	if context.Cause(ctx) != nil {
		return classify(nil, "the handler")
	}
	env, err := parseEnvelope(out)
	if err != nil {
		return err
	}
	res.Envelope = env
	return nil
}

func (r *Runtime) logFlood() error {
	return failf(FailOutput, "Bot wrote more than %d bytes of log (each line or write counts as at least %d bytes)",
		r.cfg.Limits.BotLogWriteBytes, minLogCharge)
}

func parseEnvelope(b []byte) (Envelope, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return Envelope{}, failf(FailEnvelope, "Bot result envelope is not a JSON object")
	}
	var raw struct {
		Result      json.RawMessage `json:"result"`
		Error       json.RawMessage `json:"error"`
		Status      *json.Number    `json:"status"`
		ContentType *string         `json:"contentType"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Envelope{}, failf(FailEnvelope, "Bot result envelope is not valid JSON: %v", err)
	}
	if dec.More() {
		return Envelope{}, failf(FailEnvelope, "Bot result envelope has data after the JSON object")
	}
	if !json.Valid(b) {
		return Envelope{}, failf(FailEnvelope, "Bot result envelope is not valid JSON")
	}
	env := Envelope{Result: nullToNil(raw.Result), Error: nullToNil(raw.Error)}
	if env.Error != nil && env.Error[0] != '"' && env.Error[0] != '{' {
		return Envelope{}, failf(FailEnvelope, "Bot result envelope: error must be a string or an OperationOutcome")
	}
	if raw.Status != nil {
		s, err := raw.Status.Int64()
		if err != nil || s < 200 || s > 499 {
			return Envelope{}, failf(FailEnvelope, "Bot result envelope: status %s is not an integer from 200 to 499", raw.Status.String())
		}
		env.Status = int(s)
	}
	if raw.ContentType != nil {
		env.ContentType = *raw.ContentType
	}
	return env, nil
}

func nullToNil(m json.RawMessage) json.RawMessage {
	if len(m) == 0 || string(m) == "null" {
		return nil
	}
	return m
}
