package sdk

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

var handler Handler

// Context gives a handler access to the server: the FHIR API and the log.
type Context struct {
	event *Event
}

// FHIR returns a client for the server's FHIR API, acting as the bot.
func (c Context) FHIR() *FHIRClient { return &FHIRClient{} }

// Log writes an info line to the execution's log.
func (c Context) Log(msg string) { Log(msg) }

// Logf writes a formatted info line to the execution's log.
func (c Context) Logf(format string, args ...any) { Logf(format, args...) }

// Event returns the event being handled.
func (c Context) Event() Event {
	if c.event == nil {
		return Event{}
	}
	return *c.event
}

// Handle registers the bot's handler.
//
// Called from an init function of a module built with -buildmode=c-shared
// (a reactor), it only registers h; the server then calls it through the
// exported sandbot_handle. Called from main (a module built as a WASI
// command), it serves the command shape at once: it reads the event from
// stdin, runs h and writes the envelope to stdout.
func Handle(h Handler) {
	handler = h
	if calledFromMain() {
		serveCommand()
	}
}

func calledFromMain() bool {
	pcs := make([]uintptr, 16)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if f.Function == "main.main" {
			return true
		}
		if strings.HasPrefix(f.Function, "main.init") {
			return false
		}
		if !more {
			return false
		}
	}
}

// Invoke runs the registered handler on an event JSON and returns the
// result envelope JSON, exactly as sandbot_handle does. It is meant for
// unit tests of a bot on the host.
func Invoke(event []byte) []byte {
	return invoke(event)
}

func invoke(event []byte) (out []byte) {
	if handler == nil {
		return buildEnvelope(nil, &Error{Message: "sdk: no handler registered; call sdk.Handle from an init function when building with -buildmode=c-shared"})
	}
	e, err := parseEvent(event)
	if err != nil {
		return buildEnvelope(nil, fmt.Errorf("sdk: invalid event: %w", err))
	}
	defer func() {
		if p := recover(); p != nil {
			LogAt(LevelError, fmt.Sprintf("panic: %v\n%s", p, debug.Stack()))
			out = buildEnvelope(nil, fmt.Errorf("bot panicked: %v", p))
		}
	}()
	v, err := handler(Context{event: &e}, e)
	return buildEnvelope(v, err)
}
