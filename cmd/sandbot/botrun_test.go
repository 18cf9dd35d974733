package main

import (
	"bytes"
	"context"
	"encoding/json"
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
