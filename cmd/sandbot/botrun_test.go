package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func botRun(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	var out, errb bytes.Buffer
	code := runBotCommand(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestBotRunCEcho(t *testing.T) {
	wasm := filepath.Join("..", "..", "examples", "c-echo", "c-echo.wasm")
	code, out, errs := botRun(t, `{"a": [1, 2]}`, "run", wasm, "--input", "-")
	if code != 0 || out != `{"result":{"a":[1,2]}}`+"\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	code, out, _ = botRun(t, "a=1&b=2&b=3", "run", wasm, "--content-type", "application/x-www-form-urlencoded; charset=utf-8", "--input=-")
	var env struct{ Result map[string]any }
	if code != 0 || json.Unmarshal([]byte(out), &env) != nil || env.Result["a"] != "1" || len(env.Result["b"].([]any)) != 2 {
		t.Fatalf("code %d out %q", code, out)
	}
	code, out, _ = botRun(t, "hello", "run", wasm, "--content-type", "text/plain", "--input", "-")
	if code != 0 || out != `{"result":"hello"}`+"\n" {
		t.Fatalf("code %d out %q", code, out)
	}
}

func TestBotRunUsage(t *testing.T) {
	if code, _, _ := botRun(t, "", "run"); code != 2 {
		t.Fatalf("code %d", code)
	}
	if code, _, errs := botRun(t, "", "run", "x.wasm", "--bogus"); code != 2 || !strings.Contains(errs, "unknown flag") {
		t.Fatalf("code %d %q", code, errs)
	}
	wasm := filepath.Join("..", "..", "examples", "c-echo", "c-echo.wasm")
	if code, _, errs := botRun(t, "{", "run", wasm, "--input", "-"); code != 2 || !strings.Contains(errs, "could not be parsed") {
		t.Fatalf("code %d %q", code, errs)
	}
	if code, _, errs := botRun(t, "", "run", filepath.Join("..", "..", "examples", "c-echo", "echo.c")); code != 1 || !strings.Contains(errs, "invalid module") {
		t.Fatalf("code %d %q", code, errs)
	}
}

func TestBotRunFailure(t *testing.T) {
	wasm := filepath.Join("..", "..", "runtime", "testdata", "bots.wasm")
	code, out, errs := botRun(t, `"trap"`, "run", wasm, "--input", "-")
	if code != 1 || out != "" || !strings.Contains(errs, "[error] about to trap") || !strings.Contains(errs, "bot failed (trap)") {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
}

// TestBotRunLimits: bot run takes serve's limit flags and variables, checked
// the same way.
func TestBotRunLimits(t *testing.T) {
	wasm := filepath.Join("..", "..", "examples", "c-echo", "c-echo.wasm")
	big := `"` + strings.Repeat("x", 4000) + `"`
	if code, out, errs := botRun(t, big, "run", wasm, "--input", "-"); code != 0 || len(out) < 4000 {
		t.Fatalf("default limits: code %d err %q", code, errs)
	}
	code, _, errs := botRun(t, big, "run", wasm, "--bot-output-bytes", "2048", "--input", "-")
	if code != 1 || !strings.Contains(errs, "bot failed (output)") || !strings.Contains(errs, "2048 bytes") {
		t.Fatalf("flag: code %d err %q", code, errs)
	}
	t.Setenv("SANDBOT_BOT_OUTPUT_BYTES", "3000")
	code, _, errs = botRun(t, big, "run", wasm, "--input=-")
	if code != 1 || !strings.Contains(errs, "3000 bytes") {
		t.Fatalf("variable: code %d err %q", code, errs)
	}
	code, _, errs = botRun(t, big, "run", wasm, "--bot-output-bytes=5", "--input=-")
	if code != 2 || !strings.Contains(errs, "SANDBOT_BOT_OUTPUT_BYTES=5 must be a number between") {
		t.Fatalf("out of range: code %d err %q", code, errs)
	}
}

// jsAvailable skips a JavaScript test in a build without the engine (`make
// js` not run), except in CI.
func jsAvailable(t *testing.T, code int, errs string) {
	t.Helper()
	if code != 0 && strings.Contains(errs, "make js") && os.Getenv("CI") == "" {
		t.Skip("JavaScript engine not fetched (make js)")
	}
}

func TestBotRunJavaScript(t *testing.T) {
	js := filepath.Join("..", "..", "examples", "js")
	code, out, errs := botRun(t, `{"name":"Ada"}`, "run", filepath.Join(js, "hello.js"), "--input", "-")
	jsAvailable(t, code, errs)
	if code != 0 || out != `{"result":{"greeting":"Hello, Ada"}}`+"\n" || !strings.Contains(errs, "[info] greeting Ada") {
		t.Fatalf("hello: code %d out %q err %q", code, out, errs)
	}
	msg := "MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240102030405||ORU^R01|CTRL-42|P|2.5.1\rPID|1||123||Doe^Jane\r"
	code, out, errs = botRun(t, msg, "run", filepath.Join(js, "hl7-ack.js"), "--content-type", "x-application/hl7-v2+er7", "--input", "-")
	if code != 0 || !strings.Contains(out, `MSA|AA|CTRL-42|OK`) {
		t.Fatalf("hl7-ack: code %d out %q err %q", code, out, errs)
	}
	// Without --fhir-base, FHIR calls are answered 501: the bot's client
	// throws, and the bot fails.
	code, out, errs = botRun(t, `{"family":"Lovelace"}`, "run", filepath.Join(js, "patients.js"), "--input", "-")
	if code != 1 || !strings.Contains(out, "not available") {
		t.Fatalf("patients without a server: code %d out %q err %q", code, out, errs)
	}
	// With --fhir-base, they go to that server with the token.
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls = append(calls, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/fhir+json")
		if r.Method == http.MethodPost {
			w.WriteHeader(201)
			w.Write([]byte(`{"resourceType":"Patient","id":"p1"}`))
			return
		}
		w.Write([]byte(`{"resourceType":"Bundle","type":"searchset","entry":[{"resource":{"resourceType":"Patient","id":"p1"}}]}`))
	}))
	defer srv.Close()
	code, out, errs = botRun(t, `{"family":"Lovelace"}`, "run", filepath.Join(js, "patients.js"), "--input", "-",
		"--fhir-base", srv.URL+"/fhir/R4", "--token", "t0k")
	if code != 0 || out != `{"result":{"created":{"reference":"Patient/p1"},"found":["Patient/p1"]}}`+"\n" {
		t.Fatalf("patients: code %d out %q err %q", code, out, errs)
	}
	if len(calls) != 2 || calls[0] != "POST /fhir/R4/Patient Bearer t0k" || !strings.HasPrefix(calls[1], "GET /fhir/R4/Patient ") {
		t.Fatalf("calls %q", calls)
	}
	// A syntax error names the line.
	bad := filepath.Join(t.TempDir(), "bad.js")
	os.WriteFile(bad, []byte("exports.handler = () => {\n  return (;\n};\n"), 0o644)
	if code, _, errs := botRun(t, "", "run", bad); code != 1 || !strings.Contains(errs, "invalid bot code") || !strings.Contains(errs, "bad.js, line 2") {
		t.Fatalf("syntax error: code %d err %q", code, errs)
	}
}
