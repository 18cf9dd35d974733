// Package limits is sandbot's one configuration of limits: request body
// sizes, bot modules, bot executions, the compiled-module cache and the auth
// endpoints. Each limit's default, its environment variable and flag, and
// the range it is checked against are defined here and nowhere else;
// cmd/sandbot reads them from the environment and flags and passes one
// [Limits] down to the server, the FHIR and admin handlers, the bot runtime
// and "sandbot bot run". It has no HTTP or SQL dependencies, so that the
// runtime may import it (docs/decisions.md 14).
package limits

import (
	goruntime "runtime"
	"time"
)

// Cores is how many cores the node's executions share: the scheduler's
// default number of Ps (the CPUs, or the container's CPU quota), and never
// more than the CPUs, since serve runs more Ps than cores (docs/decisions.md
// 62). ExecutionsPerCore and GuestCores count per core of these. serve
// reads it (through the limits and the runtime) before it raises the Ps: in
// a container whose quota is below the CPUs, it is the raised count after.
func Cores() int {
	return min(goruntime.NumCPU(), goruntime.GOMAXPROCS(0))
}

// Limits are the limits sandbot enforces. Every component takes the whole
// struct and calls [Limits.WithDefaults] once, so a zero field means "the
// default" everywhere and a caller (a test) sets only the fields it cares
// about.
//
// A new limit goes here, not in the package that enforces it: add a field
// with its doc comment, its default in [Default], and, when operators may
// change it, a row in [Settings] (environment variable, flag, range). The
// README's configuration table lists the rows.
type Limits struct {
	// JSONBodyBytes bounds JSON request bodies (FHIR, admin, $execute with a
	// JSON media type); over it the answer is 413.
	JSONBodyBytes int64
	// TextBodyBytes bounds text, HL7 v2 and form bodies of $execute.
	TextBodyBytes int64
	// ModuleBytes bounds a bot module, and with it raw Binary uploads and
	// a raw $deploy body; a base64 $deploy body may be ModuleBytes×4/3 plus
	// 4 KiB.
	ModuleBytes int64
	// ModuleCacheBytes bounds the compiled bot modules the runtime keeps in
	// memory, counted in module bytes (the machine code is about twice
	// that); the least recently used beyond it is dropped.
	ModuleCacheBytes int64

	// BotTimeout is an execution's deadline when the Bot has no timeout.
	BotTimeout time.Duration
	// BotMaxTimeout caps every execution's deadline, whatever Bot.timeout
	// says.
	BotMaxTimeout time.Duration
	// BotMemoryBytes is the largest linear memory of an execution; modules
	// that declare more are rejected at deploy.
	BotMemoryBytes int64
	// BotOutputBytes bounds a bot's result envelope (and its stdout).
	BotOutputBytes int64
	// BotLogBytes is how much of an execution's log is kept (its end), in
	// the result and in the execution's AuditEvent; negative keeps none.
	BotLogBytes int64
	// BotLogWriteBytes bounds everything an execution writes to its log
	// (sandbot.log, stderr, a reactor's stdout, console), each line or
	// write counted as at least 64 bytes; past it the execution fails, so
	// that a flood of (even empty) lines stops early instead of running to
	// the deadline.
	BotLogWriteBytes int64
	// BotStackBytes bounds an execution's call stack (estimated from each
	// function's locals and operand stack); deeper recursion fails.
	BotStackBytes int64

	// ExecutionMemoryBytes is the node's memory budget for bot executions:
	// each running execution holds its memory limit (or its module's
	// smaller declared maximum), its tables, globals and stack, and what
	// the host buffers for it (its output and one FHIR reply); an execution
	// that does not fit is refused (429 with Retry-After) rather than
	// queued. cmd/sandbot derives the default from the machine's memory
	// when the operator does not set it.
	ExecutionMemoryBytes int64
	// ProjectExecutionPercent is the share of ExecutionMemoryBytes, and of
	// the executions admitted at once, that the running executions of one
	// project may hold together.
	ProjectExecutionPercent int64
	// ExecutionsPerCore is how many executions a node admits at once per
	// core (the node's are this times Cores()). Whatever is admitted,
	// only as many run guest code at a time as there are cores, taking
	// turns at their fuel yields in a fair order across projects.
	ExecutionsPerCore int64
	// GuestCores is how many executions run guest code at once, taking
	// turns at their fuel yields; by default twice the cores (Cores()):
	// with one turn per core, executions that wait on the turn of another of
	// their project's lengthened the tail of every bot's latency.
	GuestCores int64
	// ExecutionWaitMillis is how long an execution that does not fit (the
	// node's executions or memory, or its project's share of them) waits
	// for room before it is refused (429 with Retry-After); -1: none waits.
	ExecutionWaitMillis int64

	// CompileConcurrency is how many modules compile at once; others wait
	// (up to CompileQueue of them, then 429).
	CompileConcurrency int64
	// CompileQueue is how many compilations may wait for a slot.
	CompileQueue int64
	// CompileCPUSeconds and CompileMemoryBytes are the ceiling of one
	// module's compilation (a child process under rlimits): past them the
	// module is refused as too expensive to compile.
	CompileCPUSeconds  int64
	CompileMemoryBytes int64
	// CompileSeconds is the wall-clock limit of a compilation at $deploy,
	// where a caller waits for it; past it the module is refused as too
	// expensive to compile. A module already deployed is compiled again
	// (another replica, the cache) under CompileCPUSeconds alone.
	CompileSeconds int64
	// ModuleArtifactBytes bounds the compiled machine code of one module
	// that a replica shares with the others through the database (and
	// accepts from them); larger artifacts are compiled by each replica.
	ModuleArtifactBytes int64

	// Module structure, checked at deploy before wazero sees the module
	// (runtime/wasmparse.go): compile time and memory, and what each
	// instance allocates, grow with these.
	ModuleFunctions      int64 // functions, imported and defined
	ModuleFunctionBytes  int64 // bytes of one function body
	ModuleCodeBytes      int64 // bytes of all function bodies: compile time grows with them
	ModuleFunctionLocals int64 // locals of one function
	ModuleLocals         int64 // locals of all functions
	ModuleBrTableTargets int64 // targets of one br_table
	ModuleBlockDepth     int64 // nesting of block, loop and if
	// ModuleTableElements bounds the sum of all tables' initial and
	// maximum sizes, and the entries of element segments; an instance
	// allocates 8 bytes per element, counted against the memory budget.
	ModuleTableElements int64
	ModuleTypes         int64 // function types
	ModuleTypeArity     int64 // parameters, or results, of one type
	ModuleGlobals       int64
	ModuleDataSegments  int64

	// BundleEntries bounds the entries of a batch or transaction Bundle
	// (each entry is a request of its own; the body is bounded by
	// JSONBodyBytes too).
	BundleEntries int64
	// JobWorkers is how many asynchronous executions (Prefer:
	// respond-async) one server process runs at once; the others wait in
	// the store's queue for a process with a free worker.
	JobWorkers int64
	// JobQueue is how many asynchronous executions of one project may wait
	// or run at once; beyond it $execute with respond-async answers 429.
	JobQueue int64
	// JobRescueSeconds is how long after it started a running job is taken
	// for lost (its process died) and run again by any process. A job's
	// work ends at nine tenths of it, so it must exceed the longest bot
	// timeout (BotMaxTimeout) and a compilation.
	JobRescueSeconds int64
	// WebhookSeconds bounds one call of a Subscription's HTTP hook, its
	// redirects included.
	WebhookSeconds int64

	// GraphQLDepth, GraphQLSelections and GraphQLReads bound one $graphql
	// query: how deeply its selections nest (the standard introspection
	// query needs about 13), how many selections it has with its fragments
	// expanded, and how many reads and searches it makes (each list field
	// and each resolved reference is one).
	GraphQLDepth      int64
	GraphQLSelections int64
	GraphQLReads      int64

	// MLLPMessageBytes bounds one HL7 message received over MLLP; a larger
	// one is read to its end and answered AR.
	MLLPMessageBytes int64
	// MLLPIdleSeconds is how long an MLLP connection may wait between
	// messages before it is closed.
	MLLPIdleSeconds int64
	// MLLPReadSeconds is how long one MLLP message may take to arrive once
	// its start block came (a slow sender is disconnected), and the longest
	// its keeping may take before it is answered AE.
	MLLPReadSeconds int64
	// MLLPConnections bounds the open connections of one MLLP listener, and
	// MLLPConnectionsPerAddress those from one source address; beyond them
	// a new connection is closed at once.
	MLLPConnections           int64
	MLLPConnectionsPerAddress int64
	// MLLPDedupeSeconds is the window in which a message whose channel and
	// control id (MSH-10) were kept before is acknowledged without being
	// run again; it begins when the first was kept.
	MLLPDedupeSeconds int64

	// AuthRequestsPerMinute is how many /auth/* and /oauth2/* requests a
	// client IP may make per minute; negative means no limit.
	AuthRequestsPerMinute int64
	// AuthBodyBytes bounds the bodies of the login, token, profile and
	// set-password endpoints (small forms and JSON objects).
	AuthBodyBytes int64

	// WebhookRequestsPerMinute is how many public webhook requests
	// (POST /webhook/{membership}) a client IP may make per minute;
	// negative means no limit.
	WebhookRequestsPerMinute int64
	// CronFields is how many fields a cron expression of Bot.cronString and
	// Cron.cronString has: 5 (minute first, the default and the
	// reference's), or 6 (seconds first, also accepting five), which is for
	// tests that cannot wait minutes for a tick.
	CronFields int64
}

// Default returns the default limits.
func Default() Limits {
	return Limits{
		JSONBodyBytes:    1 << 20,
		TextBodyBytes:    1 << 20,
		ModuleBytes:      32 << 20,
		ModuleCacheBytes: 256 << 20,
		BotTimeout:       10 * time.Second,
		BotMaxTimeout:    900 * time.Second,
		BotMemoryBytes:   64 << 20,
		BotOutputBytes:   8 << 20,
		BotLogBytes:      10 << 10,
		BotLogWriteBytes: 8 << 20,
		BotStackBytes:    8 << 20,

		ExecutionMemoryBytes:    1 << 30,
		ProjectExecutionPercent: 50,
		ExecutionsPerCore:       8,
		GuestCores:              int64(2 * Cores()),
		ExecutionWaitMillis:     250,

		CompileConcurrency: 2,
		CompileQueue:       16,
		CompileCPUSeconds:  60,
		CompileMemoryBytes: 2 << 30,
		CompileSeconds:     4,
		// The Go hello example (3.6 MB of wasm) compiles to about 12 MB.
		ModuleArtifactBytes: 128 << 20,

		// Browsers' limits where they have one (V8: 50,000 locals per
		// function, 65,520 br_table targets); the others leave Go bots
		// (about 2,400 functions, 550 nested blocks, 40,000 data
		// segments, 6,400 table elements) far inside.
		ModuleFunctions:      100_000,
		ModuleFunctionBytes:  2 << 20,
		ModuleCodeBytes:      12 << 20,
		ModuleFunctionLocals: 50_000,
		ModuleLocals:         1_000_000,
		ModuleBrTableTargets: 65_520,
		ModuleBlockDepth:     10_000,
		ModuleTableElements:  100_000,
		ModuleTypes:          10_000,
		ModuleTypeArity:      128,
		ModuleGlobals:        10_000,
		ModuleDataSegments:   100_000,

		BundleEntries: 1000,

		GraphQLDepth:      24,
		GraphQLSelections: 10_000,
		GraphQLReads:      1000,

		JobWorkers:       4,
		JobQueue:         1000,
		JobRescueSeconds: 1020,
		WebhookSeconds:   10,

		MLLPMessageBytes:          1 << 20,
		MLLPIdleSeconds:           600,
		MLLPReadSeconds:           30,
		MLLPConnections:           256,
		MLLPConnectionsPerAddress: 32,
		MLLPDedupeSeconds:         86400,

		AuthRequestsPerMinute: 160, // the reference's strict auth limit
		AuthBodyBytes:         64 << 10,

		WebhookRequestsPerMinute: 600,
		CronFields:               5,
	}
}

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	d := Default()
	set := func(v *int64, def int64) {
		if *v == 0 {
			*v = def
		}
	}
	setDuration := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&l.JSONBodyBytes, d.JSONBodyBytes)
	set(&l.TextBodyBytes, d.TextBodyBytes)
	set(&l.ModuleBytes, d.ModuleBytes)
	set(&l.ModuleCacheBytes, d.ModuleCacheBytes)
	setDuration(&l.BotTimeout, d.BotTimeout)
	setDuration(&l.BotMaxTimeout, d.BotMaxTimeout)
	set(&l.BotMemoryBytes, d.BotMemoryBytes)
	set(&l.BotOutputBytes, d.BotOutputBytes)
	set(&l.BotLogBytes, d.BotLogBytes)
	set(&l.BotLogWriteBytes, d.BotLogWriteBytes)
	set(&l.BotStackBytes, d.BotStackBytes)
	set(&l.ExecutionMemoryBytes, d.ExecutionMemoryBytes)
	set(&l.ProjectExecutionPercent, d.ProjectExecutionPercent)
	set(&l.ExecutionsPerCore, d.ExecutionsPerCore)
	set(&l.GuestCores, d.GuestCores)
	set(&l.ExecutionWaitMillis, d.ExecutionWaitMillis)
	set(&l.CompileConcurrency, d.CompileConcurrency)
	set(&l.CompileQueue, d.CompileQueue)
	set(&l.CompileCPUSeconds, d.CompileCPUSeconds)
	set(&l.CompileMemoryBytes, d.CompileMemoryBytes)
	set(&l.CompileSeconds, d.CompileSeconds)
	set(&l.ModuleArtifactBytes, d.ModuleArtifactBytes)
	set(&l.ModuleFunctions, d.ModuleFunctions)
	set(&l.ModuleFunctionBytes, d.ModuleFunctionBytes)
	set(&l.ModuleCodeBytes, d.ModuleCodeBytes)
	set(&l.ModuleFunctionLocals, d.ModuleFunctionLocals)
	set(&l.ModuleLocals, d.ModuleLocals)
	set(&l.ModuleBrTableTargets, d.ModuleBrTableTargets)
	set(&l.ModuleBlockDepth, d.ModuleBlockDepth)
	set(&l.ModuleTableElements, d.ModuleTableElements)
	set(&l.ModuleTypes, d.ModuleTypes)
	set(&l.ModuleTypeArity, d.ModuleTypeArity)
	set(&l.ModuleGlobals, d.ModuleGlobals)
	set(&l.ModuleDataSegments, d.ModuleDataSegments)
	set(&l.BundleEntries, d.BundleEntries)
	set(&l.GraphQLDepth, d.GraphQLDepth)
	set(&l.GraphQLSelections, d.GraphQLSelections)
	set(&l.GraphQLReads, d.GraphQLReads)
	set(&l.JobWorkers, d.JobWorkers)
	set(&l.JobQueue, d.JobQueue)
	set(&l.JobRescueSeconds, d.JobRescueSeconds)
	set(&l.WebhookSeconds, d.WebhookSeconds)
	set(&l.MLLPMessageBytes, d.MLLPMessageBytes)
	set(&l.MLLPIdleSeconds, d.MLLPIdleSeconds)
	set(&l.MLLPReadSeconds, d.MLLPReadSeconds)
	set(&l.MLLPConnections, d.MLLPConnections)
	set(&l.MLLPConnectionsPerAddress, d.MLLPConnectionsPerAddress)
	set(&l.MLLPDedupeSeconds, d.MLLPDedupeSeconds)
	set(&l.AuthRequestsPerMinute, d.AuthRequestsPerMinute)
	set(&l.AuthBodyBytes, d.AuthBodyBytes)
	set(&l.WebhookRequestsPerMinute, d.WebhookRequestsPerMinute)
	set(&l.CronFields, d.CronFields)
	return l
}

// Setting describes a limit that operators set through an environment
// variable and the flag of the same name.
type Setting struct {
	// Env is the environment variable, e.g. SANDBOT_MAX_JSON_BYTES.
	Env string
	// Flag is the flag name, e.g. max-json-bytes.
	Flag  string
	Usage string
	// Min and Max bound the value given (inclusive).
	Min, Max int64
	// ZeroIsOff says that a value of 0 given by the operator turns the
	// limit off (stored as -1, since a zero field means the default).
	ZeroIsOff bool
	// Field returns the setting's field in l.
	Field func(l *Limits) *int64
}

// Settings lists the limits operators can set, in the order of the README's
// configuration table.
func Settings() []Setting {
	return []Setting{
		{Env: "SANDBOT_MAX_JSON_BYTES", Flag: "max-json-bytes", Usage: "largest JSON request body",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.JSONBodyBytes }},
		{Env: "SANDBOT_MAX_TEXT_BYTES", Flag: "max-text-bytes", Usage: "largest text, HL7 or form request body",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.TextBodyBytes }},
		{Env: "SANDBOT_MAX_MODULE_BYTES", Flag: "max-module-bytes", Usage: "largest bot module",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.ModuleBytes }},
		{Env: "SANDBOT_MAX_BUNDLE_ENTRIES", Flag: "max-bundle-entries", Usage: "most entries of a batch or transaction Bundle",
			Min: 1, Max: 100_000, Field: func(l *Limits) *int64 { return &l.BundleEntries }},
		{Env: "SANDBOT_BOT_MEMORY_BYTES", Flag: "bot-memory-bytes", Usage: "bot linear memory limit",
			Min: 1 << 16, Max: 4 << 30, Field: func(l *Limits) *int64 { return &l.BotMemoryBytes }},
		{Env: "SANDBOT_BOT_OUTPUT_BYTES", Flag: "bot-output-bytes", Usage: "largest bot result",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.BotOutputBytes }},
		{Env: "SANDBOT_BOT_LOG_BYTES", Flag: "bot-log-bytes", Usage: "bot log kept per execution (0: none)",
			Min: 0, Max: 1 << 30, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.BotLogBytes }},
		{Env: "SANDBOT_BOT_LOG_WRITE_BYTES", Flag: "bot-log-write-bytes", Usage: "most an execution may write to its log, each line or write counted as at least 64 bytes (over: the execution fails)",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.BotLogWriteBytes }},
		{Env: "SANDBOT_BOT_STACK_BYTES", Flag: "bot-stack-bytes", Usage: "bot call stack limit (estimated)",
			Min: 64 << 10, Max: 64 << 20, Field: func(l *Limits) *int64 { return &l.BotStackBytes }},
		{Env: "SANDBOT_EXECUTION_MEMORY_BYTES", Flag: "execution-memory-bytes", Usage: "memory budget of the bot executions running at once (over: 429); default a quarter of the machine's (or container's) memory, at least 512 MiB",
			Min: 1 << 20, Max: 1 << 44, Field: func(l *Limits) *int64 { return &l.ExecutionMemoryBytes }},
		{Env: "SANDBOT_PROJECT_EXECUTION_PERCENT", Flag: "project-execution-percent", Usage: "share of the execution memory budget one project's executions may hold (over: 429)",
			Min: 1, Max: 100, Field: func(l *Limits) *int64 { return &l.ProjectExecutionPercent }},
		{Env: "SANDBOT_EXECUTIONS_PER_CORE", Flag: "executions-per-core", Usage: "bot executions admitted at once per core (only as many as there are cores run guest code at a time, taking turns fairly across projects)",
			Min: 1, Max: 1024, Field: func(l *Limits) *int64 { return &l.ExecutionsPerCore }},
		{Env: "SANDBOT_GUEST_CORES", Flag: "guest-cores", Usage: "executions that run bots' code at once, taking turns fairly across projects (default: twice the cores)",
			Min: 1, Max: 1024, Field: func(l *Limits) *int64 { return &l.GuestCores }},
		{Env: "SANDBOT_EXECUTION_WAIT_MS", Flag: "execution-wait-ms", Usage: "how long an execution that does not fit waits for room before 429 (0: none waits)",
			Min: 0, Max: 60_000, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.ExecutionWaitMillis }},
		{Env: "SANDBOT_COMPILE_CONCURRENCY", Flag: "compile-concurrency", Usage: "bot modules compiled at once",
			Min: 1, Max: 256, Field: func(l *Limits) *int64 { return &l.CompileConcurrency }},
		{Env: "SANDBOT_COMPILE_QUEUE", Flag: "compile-queue", Usage: "compilations that may wait for a slot (more: 429; 0: none waits)",
			Min: 0, Max: 1 << 20, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.CompileQueue }},
		{Env: "SANDBOT_COMPILE_CPU_SECONDS", Flag: "compile-cpu-seconds", Usage: "CPU time ceiling of one module's compilation",
			Min: 1, Max: 3600, Field: func(l *Limits) *int64 { return &l.CompileCPUSeconds }},
		{Env: "SANDBOT_COMPILE_MEMORY_BYTES", Flag: "compile-memory-bytes", Usage: "address space ceiling of one module's compilation",
			Min: 64 << 20, Max: 1 << 40, Field: func(l *Limits) *int64 { return &l.CompileMemoryBytes }},
		{Env: "SANDBOT_COMPILE_SECONDS", Flag: "compile-seconds", Usage: "wall-clock limit of a compilation at $deploy (over: 400)",
			Min: 1, Max: 3600, Field: func(l *Limits) *int64 { return &l.CompileSeconds }},
		{Env: "SANDBOT_MODULE_ARTIFACT_BYTES", Flag: "module-artifact-bytes", Usage: "compiled code of one module shared between replicas through the database (larger: each replica compiles)",
			Min: 0, Max: 1 << 30, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.ModuleArtifactBytes }},
		{Env: "SANDBOT_MODULE_MAX_FUNCTIONS", Flag: "module-max-functions", Usage: "functions of a bot module, imported and defined",
			Min: 1, Max: 1 << 24, Field: func(l *Limits) *int64 { return &l.ModuleFunctions }},
		{Env: "SANDBOT_MODULE_MAX_FUNCTION_BYTES", Flag: "module-max-function-bytes", Usage: "bytes of one function body of a bot module",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.ModuleFunctionBytes }},
		{Env: "SANDBOT_MODULE_MAX_CODE_BYTES", Flag: "module-max-code-bytes", Usage: "bytes of all function bodies of a bot module (compile time grows with them)",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.ModuleCodeBytes }},
		{Env: "SANDBOT_MODULE_MAX_FUNCTION_LOCALS", Flag: "module-max-function-locals", Usage: "locals of one function of a bot module",
			Min: 1, Max: 1 << 24, Field: func(l *Limits) *int64 { return &l.ModuleFunctionLocals }},
		{Env: "SANDBOT_MODULE_MAX_LOCALS", Flag: "module-max-locals", Usage: "locals of all functions of a bot module",
			Min: 1, Max: 1 << 28, Field: func(l *Limits) *int64 { return &l.ModuleLocals }},
		{Env: "SANDBOT_MODULE_MAX_BR_TABLE_TARGETS", Flag: "module-max-br-table-targets", Usage: "targets of one br_table in a bot module",
			Min: 1, Max: 1 << 24, Field: func(l *Limits) *int64 { return &l.ModuleBrTableTargets }},
		{Env: "SANDBOT_MODULE_MAX_BLOCK_DEPTH", Flag: "module-max-block-depth", Usage: "nesting of blocks in a bot module's functions",
			Min: 1, Max: 1 << 20, Field: func(l *Limits) *int64 { return &l.ModuleBlockDepth }},
		{Env: "SANDBOT_MODULE_MAX_TABLE_ELEMENTS", Flag: "module-max-table-elements", Usage: "all tables' initial and maximum sizes together, and element segment entries, of a bot module",
			Min: 1, Max: 1 << 26, Field: func(l *Limits) *int64 { return &l.ModuleTableElements }},
		{Env: "SANDBOT_MODULE_CACHE_BYTES", Flag: "module-cache-bytes", Usage: "compiled bot modules kept in memory, in module bytes (least recently used dropped first)",
			Min: 1 << 20, Max: 1 << 40, Field: func(l *Limits) *int64 { return &l.ModuleCacheBytes }},
		{Env: "SANDBOT_JOB_WORKERS", Flag: "job-workers", Usage: "asynchronous bot executions one process runs at once",
			Min: 1, Max: 1024, Field: func(l *Limits) *int64 { return &l.JobWorkers }},
		{Env: "SANDBOT_JOB_QUEUE", Flag: "job-queue", Usage: "asynchronous bot executions one project may have waiting or running (more: 429)",
			Min: 1, Max: 1 << 20, Field: func(l *Limits) *int64 { return &l.JobQueue }},
		{Env: "SANDBOT_JOB_RESCUE_SECONDS", Flag: "job-rescue-seconds", Usage: "how long after it started a job whose process died is run again (a job's work ends at nine tenths of it)",
			Min: 2, Max: 86400, Field: func(l *Limits) *int64 { return &l.JobRescueSeconds }},
		{Env: "SANDBOT_WEBHOOK_SECONDS", Flag: "webhook-seconds", Usage: "how long one call of a Subscription's HTTP hook may take, redirects included",
			Min: 1, Max: 600, Field: func(l *Limits) *int64 { return &l.WebhookSeconds }},
		{Env: "SANDBOT_MLLP_MAX_BYTES", Flag: "mllp-max-bytes", Usage: "largest HL7 message received over MLLP (over: AR)",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.MLLPMessageBytes }},
		{Env: "SANDBOT_MLLP_IDLE_SECONDS", Flag: "mllp-idle-seconds", Usage: "how long an MLLP connection may wait between messages",
			Min: 1, Max: 86400, Field: func(l *Limits) *int64 { return &l.MLLPIdleSeconds }},
		{Env: "SANDBOT_MLLP_READ_SECONDS", Flag: "mllp-read-seconds", Usage: "how long one MLLP message may take to arrive once begun",
			Min: 1, Max: 3600, Field: func(l *Limits) *int64 { return &l.MLLPReadSeconds }},
		{Env: "SANDBOT_MLLP_CONNECTIONS", Flag: "mllp-connections", Usage: "open connections of one MLLP listener",
			Min: 1, Max: 1 << 20, Field: func(l *Limits) *int64 { return &l.MLLPConnections }},
		{Env: "SANDBOT_MLLP_CONNECTIONS_PER_ADDRESS", Flag: "mllp-connections-per-address", Usage: "open MLLP connections from one source address",
			Min: 1, Max: 1 << 20, Field: func(l *Limits) *int64 { return &l.MLLPConnectionsPerAddress }},
		{Env: "SANDBOT_MLLP_DEDUPE_SECONDS", Flag: "mllp-dedupe-seconds", Usage: "window in which a resent MSH-10 of a channel is acknowledged and not run again",
			Min: 1, Max: 365 * 86400, Field: func(l *Limits) *int64 { return &l.MLLPDedupeSeconds }},
		{Env: "SANDBOT_AUTH_RATE_LIMIT", Flag: "auth-rate-limit", Usage: "requests per minute per client IP on /auth and /oauth2 (0: no limit)",
			Min: 0, Max: 1 << 30, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.AuthRequestsPerMinute }},
		{Env: "SANDBOT_PUBLIC_WEBHOOK_RATE_LIMIT", Flag: "public-webhook-rate-limit", Usage: "requests per minute per client IP on /webhook (0: no limit)",
			Min: 0, Max: 1 << 30, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.WebhookRequestsPerMinute }},
		{Env: "SANDBOT_CRON_FIELDS", Flag: "cron-fields", Usage: "fields of a cron expression: 5 (minute first) or 6 (seconds first, for tests)",
			Min: 5, Max: 6, Field: func(l *Limits) *int64 { return &l.CronFields }},
	}
}
