package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
)

const botRunUsage = `Usage: sandbot bot run <module.wasm> [--content-type TYPE] [--input FILE|-] [limit flags]

Runs a bot module once, locally, as $execute would: the input (a file, or
stdin with -; none when --input is absent) is passed as event.input according
to its content type (default application/json):

  text/plain                          a JSON string
  application/json                    the JSON value
  application/fhir+json               the resource (an object with resourceType)
  application/x-www-form-urlencoded   an object of strings (arrays when repeated)
  x-application/hl7-v2+er7            the message as a JSON string

The result envelope is printed on stdout and the bot's log on stderr. The
exit status is 0 on success, 1 when the bot fails or returns an error, 2 on
a usage error. FHIR calls from the bot are answered with status 501.

The bot runs under the server's limits: the SANDBOT_* limit variables and
flags of "sandbot serve" (--max-module-bytes, --bot-memory-bytes,
--bot-output-bytes, --bot-log-bytes) apply here too, and the timeout is the
default Bot timeout.
`

// runBotCommand implements "sandbot bot run". args are the arguments after
// "bot" (a leading "run" is expected; it may be omitted).
func runBotCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	var modulePath, contentType, inputPath string
	hasInput := false
	// The limits come from the same variables and flags as serve's.
	var lim limits.Limits
	limitSet := flag.NewFlagSet("sandbot bot run", flag.ContinueOnError)
	limitSet.SetOutput(io.Discard)
	limitFlags(limitSet, &lim)
	var limitArgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || a == "-" {
			if modulePath != "" {
				fmt.Fprintf(stderr, "sandbot bot run: unexpected argument %q\n\n%s", a, botRunUsage)
				return 2
			}
			modulePath = a
			continue
		}
		if limitSet.Lookup(name) != nil {
			limitArgs = append(limitArgs, a) // parsed below, with its value
			if !hasValue && i+1 < len(args) {
				i++
				limitArgs = append(limitArgs, args[i])
			}
			continue
		}
		switch name {
		case "h", "help":
			fmt.Fprint(stdout, botRunUsage)
			return 0
		case "content-type", "input":
			if !hasValue {
				if i+1 >= len(args) {
					fmt.Fprintf(stderr, "sandbot bot run: %s needs a value\n\n%s", a, botRunUsage)
					return 2
				}
				i++
				value = args[i]
			}
			if name == "content-type" {
				contentType = value
			} else {
				inputPath, hasInput = value, true
			}
		default:
			fmt.Fprintf(stderr, "sandbot bot run: unknown flag %s\n\n%s", a, botRunUsage)
			return 2
		}
	}
	if modulePath == "" {
		fmt.Fprint(stderr, botRunUsage)
		return 2
	}
	if err := limitSet.Parse(limitArgs); err != nil {
		fmt.Fprintf(stderr, "sandbot bot run: %v\n\n%s", err, botRunUsage)
		return 2
	}
	if errs := validateLimits(&lim); len(errs) > 0 {
		fmt.Fprintf(stderr, "sandbot bot run: %v\n", errors.Join(errs...))
		return 2
	}
	wasm, err := os.ReadFile(modulePath)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot run: %v\n", err)
		return 2
	}

	var body []byte
	if hasInput {
		if inputPath == "-" {
			body, err = io.ReadAll(stdin)
		} else {
			body, err = os.ReadFile(inputPath)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sandbot bot run: reading input: %v\n", err)
			return 2
		}
	}
	event, err := botEvent(filepath.Base(modulePath), contentType, body, hasInput)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot run: %v\n", err)
		return 2
	}

	cfg := runtime.Config{Limits: lim}
	if dir, err := os.UserCacheDir(); err == nil {
		cfg.CacheDir = filepath.Join(dir, "sandbot", "wasm-cache")
	}
	rt, err := runtime.New(ctx, cfg)
	if err != nil && cfg.CacheDir != "" {
		cfg.CacheDir = "" // an unusable cache directory is not fatal
		rt, err = runtime.New(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot run: %v\n", err)
		return 1
	}
	defer rt.Close(context.WithoutCancel(ctx))

	mod, err := rt.Compile(ctx, wasm)
	if err != nil {
		var me *runtime.ModuleError
		if errors.As(err, &me) {
			fmt.Fprintf(stderr, "sandbot bot run: invalid module: %v\n", me)
		} else {
			fmt.Fprintf(stderr, "sandbot bot run: %v\n", err)
		}
		return 1
	}
	res, err := rt.Execute(ctx, mod, runtime.Execution{Event: event})
	if res != nil {
		levels := [...]string{"debug", "info", "warn", "error"}
		for _, l := range res.Logs {
			fmt.Fprintf(stderr, "[%s] %s\n", levels[min(max(l.Level, 0), 3)], l.Text)
		}
		if res.LogTruncated {
			fmt.Fprintln(stderr, "(log truncated: only its end was kept)")
		}
	}
	if err != nil {
		var f *runtime.Failure
		if errors.As(err, &f) {
			fmt.Fprintf(stderr, "bot failed (%s): %s\n", f.Kind, f.Message)
		} else {
			fmt.Fprintf(stderr, "bot failed: %v\n", err)
		}
		return 1
	}
	out, err := envelopeJSON(res.Envelope)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot run: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n", out)
	if res.Envelope.Error != nil {
		fmt.Fprintln(stderr, "bot returned an error")
		return 1
	}
	return 0
}

// botEvent builds the ABI event for a local run.
func botEvent(name, contentType string, body []byte, hasInput bool) ([]byte, error) {
	if contentType == "" {
		contentType = runtime.MediaJSON
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return nil, fmt.Errorf("content type %q: %v", contentType, err)
	}
	ev := runtime.Event{
		Bot:         runtime.Reference{Reference: "Bot/local", Display: name},
		Requester:   runtime.Reference{Reference: "ClientApplication/local"},
		ContentType: mt,
		Input:       json.RawMessage("null"),
		Secrets:     map[string]any{},
		TraceID:     newUUID(),
		Headers:     map[string]string{"content-type": contentType},
	}
	if hasInput {
		if ev.Input, err = runtime.Input(mt, body); err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
	}
	return ev.JSON()
}

func envelopeJSON(e runtime.Envelope) ([]byte, error) {
	out := struct {
		Result      json.RawMessage `json:"result,omitempty"`
		Error       json.RawMessage `json:"error,omitempty"`
		Status      int             `json:"status,omitempty"`
		ContentType string          `json:"contentType,omitempty"`
	}{e.Result, e.Error, e.Status, e.ContentType}
	return json.Marshal(out)
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
