package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
)

const botRunUsage = `Usage: sandbot bot run <module.wasm|bot.js> [--content-type TYPE] [--input FILE|-]
                     [--fhir-base URL [--token TOKEN]] [--audit] [limit flags]

Runs a bot once, locally, as $execute would: a WebAssembly module, or a
JavaScript bot (a .js, .cjs or .mjs file, run as a Bot with runtimeVersion
vmcontext: in the same JavaScript engine, with a MedplumClient). The input (a
file, or stdin with -; none when --input is absent) is passed as event.input
according to its content type (default application/json):

  text/plain                          a JSON string
  application/json                    the JSON value
  application/fhir+json               the resource (an object with resourceType)
  application/x-www-form-urlencoded   an object of strings (arrays when repeated)
  x-application/hl7-v2+er7            the message as a JSON string (an
                                      Hl7Message for a JavaScript bot)

The result envelope is printed on stdout and the bot's log on stderr. The
exit status is 0 on success, 1 when the bot fails or returns an error, 2 on
a usage error.

The bot's FHIR calls (sandbot.fhir, or a JavaScript bot's medplum client) are
answered with status 501, or, with --fhir-base, sent to that FHIR base URL
(e.g. http://localhost:8103/fhir/R4/) with --token (or SANDBOT_TOKEN) as the
bearer token.

With --audit, the execution's AuditEvent, as the server would store it, is
printed on stderr after the run, on a line beginning "[audit] ".

The bot runs through the server's execution path and under its limits: the SANDBOT_* limit variables and
flags of "sandbot serve" (--max-module-bytes, --bot-memory-bytes,
--bot-output-bytes, --bot-log-bytes) apply here too, and the timeout is the
default Bot timeout.
`

// runBotCommand implements "sandbot bot run" and dispatches "sandbot bot
// new" (botnew.go). args are the arguments after "bot" (a leading "run" is
// expected; it may be omitted).
func runBotCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "new" {
		return runBotNew(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	var modulePath, contentType, inputPath, fhirBase string
	token := os.Getenv("SANDBOT_TOKEN")
	hasInput, audit := false, false
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
		case "audit":
			audit = true
			continue
		case "h", "help":
			fmt.Fprint(stdout, botRunUsage)
			return 0
		case "content-type", "input", "fhir-base", "token":
			if !hasValue {
				if i+1 >= len(args) {
					fmt.Fprintf(stderr, "sandbot bot run: %s needs a value\n\n%s", a, botRunUsage)
					return 2
				}
				i++
				value = args[i]
			}
			switch name {
			case "content-type":
				contentType = value
			case "input":
				inputPath, hasInput = value, true
			case "fhir-base":
				fhirBase = value
			case "token":
				token = value
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
	if contentType == "" {
		contentType = runtime.MediaJSON
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot run: content type %q: %v\n", contentType, err)
		return 2
	}
	var isJS bool
	switch filepath.Ext(modulePath) {
	case ".js", ".cjs", ".mjs":
		isJS = true
	}

	cfg := runtime.Config{Limits: lim}
	var fhirCall func(context.Context, []byte) []byte
	if fhirBase != "" {
		u, err := url.Parse(fhirBase)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			fmt.Fprintf(stderr, "sandbot bot run: --fhir-base %q is not an http(s) URL\n", fhirBase)
			return 2
		}
		if !strings.HasSuffix(fhirBase, "/") {
			fhirBase += "/"
		}
		cfg.BaseURL = strings.TrimSuffix(fhirBase, "fhir/R4/")
		fhirCall = remoteFHIR(fhirBase, token, lim.WithDefaults().BotOutputBytes)
	}
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

	// The run goes through the bots service, as every execution does: the
	// same event, limits, admission and AuditEvent (on stderr with --audit).
	svcCfg := bots.Config{Runtime: rt, Limits: lim}
	if audit {
		svcCfg.AuditTo = func(ev fhir.Resource) {
			b, _ := json.Marshal(ev)
			fmt.Fprintf(stderr, "[audit] %s\n", b)
		}
	}
	svc, err := bots.New(svcCfg)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot run: %v\n", err)
		return 1
	}
	defer svc.Close()
	input := json.RawMessage("null")
	if hasInput {
		if input, err = svc.LocalInput(mediaType, body, isJS); err != nil {
			fmt.Fprintf(stderr, "sandbot bot run: input: %v\n", err)
			return 2
		}
	}

	var mod *runtime.Module
	if isJS {
		mod, err = rt.CompileJS(ctx, wasm, filepath.Base(modulePath))
	} else {
		mod, err = rt.Compile(ctx, wasm)
	}
	if err != nil {
		var me *runtime.ModuleError
		if errors.As(err, &me) {
			what := "module"
			if isJS {
				what = "bot code"
			}
			fmt.Fprintf(stderr, "sandbot bot run: invalid %s: %v\n", what, me)
		} else {
			fmt.Fprintf(stderr, "sandbot bot run: %v\n", err)
		}
		return 1
	}
	res, err := svc.RunLocal(ctx, bots.Local{Module: mod, Name: filepath.Base(modulePath), MediaType: mediaType, Input: input,
		Headers: map[string]string{"content-type": contentType}, TraceID: newUUID(), FHIR: fhirCall})
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

// remoteFHIR sends a bot's FHIR requests ({method, url, body}, the url
// relative to the FHIR base) to base over HTTP, as "sandbot bot run
// --fhir-base" does, and answers {status, body}.
func remoteFHIR(base, token string, maxBytes int64) func(context.Context, []byte) []byte {
	client := &http.Client{Timeout: time.Minute}
	reply := func(status int, body any) []byte {
		b, _ := json.Marshal(map[string]any{"status": status, "body": body})
		return b
	}
	return func(ctx context.Context, request []byte) []byte {
		var req struct {
			Method string          `json:"method"`
			URL    string          `json:"url"`
			Body   json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(request, &req); err != nil || req.URL == "" {
			return reply(400, "FHIR request must be {method, url, body}")
		}
		if req.Method == "" {
			req.Method = http.MethodGet
		}
		var body io.Reader
		if len(req.Body) > 0 {
			body = bytes.NewReader(req.Body)
		}
		hr, err := http.NewRequestWithContext(ctx, strings.ToUpper(req.Method), base+strings.TrimPrefix(req.URL, "/"), body)
		if err != nil {
			return reply(400, "invalid FHIR request URL")
		}
		if body != nil {
			hr.Header.Set("Content-Type", "application/fhir+json")
		}
		hr.Header.Set("Accept", "application/fhir+json")
		if token != "" {
			hr.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(hr)
		if err != nil {
			return reply(502, err.Error())
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes))
		if err != nil {
			return reply(502, err.Error())
		}
		if !json.Valid(out) {
			return reply(resp.StatusCode, string(out))
		}
		return reply(resp.StatusCode, json.RawMessage(out))
	}
}
