// Package limits is sandbot's one configuration of limits: request body
// sizes, bot modules, bot executions, the compiled-module cache and the auth
// endpoints. Each limit's default, its environment variable and flag, and
// the range it is checked against are defined here and nowhere else;
// cmd/sandbot reads them from the environment and flags and passes one
// [Limits] down to the server, the FHIR and admin handlers, the bot runtime
// and "sandbot bot run". It has no HTTP or SQL dependencies, so that the
// runtime may import it (docs/decisions.md 14).
package limits

import "time"

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

	// AuthRequestsPerMinute is how many /auth/* and /oauth2/* requests a
	// client IP may make per minute; negative means no limit.
	AuthRequestsPerMinute int64
	// AuthBodyBytes bounds the bodies of the login, token, profile and
	// set-password endpoints (small forms and JSON objects).
	AuthBodyBytes int64
}

// Default returns the default limits.
func Default() Limits {
	return Limits{
		JSONBodyBytes:         1 << 20,
		TextBodyBytes:         1 << 20,
		ModuleBytes:           32 << 20,
		ModuleCacheBytes:      256 << 20,
		BotTimeout:            10 * time.Second,
		BotMaxTimeout:         900 * time.Second,
		BotMemoryBytes:        64 << 20,
		BotOutputBytes:        8 << 20,
		BotLogBytes:           10 << 10,
		AuthRequestsPerMinute: 160, // the reference's strict auth limit
		AuthBodyBytes:         64 << 10,
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
	set(&l.AuthRequestsPerMinute, d.AuthRequestsPerMinute)
	set(&l.AuthBodyBytes, d.AuthBodyBytes)
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
		{Env: "SANDBOT_BOT_MEMORY_BYTES", Flag: "bot-memory-bytes", Usage: "bot linear memory limit",
			Min: 1 << 16, Max: 4 << 30, Field: func(l *Limits) *int64 { return &l.BotMemoryBytes }},
		{Env: "SANDBOT_BOT_OUTPUT_BYTES", Flag: "bot-output-bytes", Usage: "largest bot result",
			Min: 1 << 10, Max: 1 << 30, Field: func(l *Limits) *int64 { return &l.BotOutputBytes }},
		{Env: "SANDBOT_BOT_LOG_BYTES", Flag: "bot-log-bytes", Usage: "bot log kept per execution (0: none)",
			Min: 0, Max: 1 << 30, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.BotLogBytes }},
		{Env: "SANDBOT_MODULE_CACHE_BYTES", Flag: "module-cache-bytes", Usage: "compiled bot modules kept in memory, in module bytes (least recently used dropped first)",
			Min: 1 << 20, Max: 1 << 40, Field: func(l *Limits) *int64 { return &l.ModuleCacheBytes }},
		{Env: "SANDBOT_AUTH_RATE_LIMIT", Flag: "auth-rate-limit", Usage: "requests per minute per client IP on /auth and /oauth2 (0: no limit)",
			Min: 0, Max: 1 << 30, ZeroIsOff: true, Field: func(l *Limits) *int64 { return &l.AuthRequestsPerMinute }},
	}
}
