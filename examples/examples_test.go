package examples

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
)

var (
	rtOnce sync.Once
	rt     *runtime.Runtime
	rtErr  error
)

func testRuntime(t *testing.T) *runtime.Runtime {
	t.Helper()
	rtOnce.Do(func() {
		// A compilation cache shared by test runs: the Go examples are
		// compiled by the optimizing compiler once, not on every run.
		// A minute per compilation: packages run side by side in go test
		// ./..., and a starved compilation would answer 429.
		cfg := runtime.Config{Limits: limits.Limits{CompileSeconds: 60}}
		if dir, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(dir, "sandbot", "wazero-test-cache")
			if os.MkdirAll(dir, 0o755) == nil {
				cfg.CacheDir = dir
			}
		}
		rt, rtErr = runtime.New(context.Background(), cfg)
	})
	if rtErr != nil {
		t.Fatal(rtErr)
	}
	return rt
}

func module(t *testing.T, name string) *runtime.Module {
	t.Helper()
	wasm, err := os.ReadFile(filepath.Join(name, name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := testRuntime(t).Compile(context.Background(), wasm)
	if err != nil {
		t.Fatalf("compile %s: %v", name, err)
	}
	return m
}

func event(contentType string, input any) []byte {
	b, err := json.Marshal(map[string]any{
		"bot":         map[string]string{"reference": "Bot/example", "display": "example"},
		"requester":   map[string]string{"reference": "Practitioner/1"},
		"contentType": contentType,
		"input":       input,
		"traceId":     "00000000-0000-0000-0000-000000000000",
		"headers":     map[string]string{},
	})
	if err != nil {
		panic(err)
	}
	return b
}

func run(t *testing.T, m *runtime.Module, ex runtime.Execution) *runtime.Result {
	t.Helper()
	res, err := testRuntime(t).Execute(context.Background(), m, ex)
	if err != nil {
		t.Fatalf("execute: %v (logs %+v)", err, res.Logs)
	}
	return res
}

func TestHello(t *testing.T) {
	m := module(t, "hello")
	res := run(t, m, runtime.Execution{Event: event("application/json", map[string]string{"name": "Ada"})})
	if got := string(res.Envelope.Result); got != `{"greeting":"Hello, Ada"}` {
		t.Fatalf("result %s", got)
	}
	if len(res.Logs) != 1 || res.Logs[0].Text != "greeting Ada" {
		t.Fatalf("logs %+v", res.Logs)
	}
	res = run(t, m, runtime.Execution{Event: event("text/plain", "Ada")})
	if res.Envelope.Status != 400 || !strings.Contains(string(res.Envelope.Error), "expected a JSON object") {
		t.Fatalf("envelope %+v", res.Envelope)
	}
}

const adt = "MSH|^~\\&|SENDER|FAC|RECEIVER|RFAC|20240102030405||ADT^A01^ADT_A01|MSG00042|P|2.5\rEVN|A01|20240102030405\rPID|1||123^^^MRN||Doe^John\r"

func TestHL7Ack(t *testing.T) {
	m := module(t, "hl7-ack")
	res := run(t, m, runtime.Execution{Event: event("x-application/hl7-v2+er7", adt)})
	var ack string
	if err := json.Unmarshal(res.Envelope.Result, &ack); err != nil {
		t.Fatalf("result %s: %v", res.Envelope.Result, err)
	}
	segs := strings.Split(strings.TrimRight(ack, "\r"), "\r")
	if len(segs) < 2 || !strings.HasPrefix(segs[0], "MSH|^~\\&|RECEIVER|RFAC|SENDER|FAC|") || !strings.Contains(segs[0], "|ACK^A01^ACK|") {
		t.Fatalf("ack %q", ack)
	}
	if !strings.HasPrefix(segs[1], "MSA|AA|MSG00042") {
		t.Fatalf("MSA %q", segs[1])
	}
	res = run(t, m, runtime.Execution{Event: event("x-application/hl7-v2+er7", "not hl7")})
	if res.Envelope.Status != 400 || res.Envelope.Error == nil {
		t.Fatalf("envelope %+v", res.Envelope)
	}
}

// fakeFHIR is an in-memory Patient store answering the fhir import.
type fakeFHIR struct {
	mu       sync.Mutex
	patients map[string]map[string]any
	requests []string
}

func (f *fakeFHIR) handle(ctx context.Context, raw []byte) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	var req struct {
		Method string         `json:"method"`
		URL    string         `json:"url"`
		Body   map[string]any `json:"body"`
	}
	if err := json.Unmarshal(raw, &req); err != nil {
		return []byte(`{"status":400}`)
	}
	f.requests = append(f.requests, req.Method+" "+req.URL)
	answer := func(status int, body any) []byte {
		b, _ := json.Marshal(map[string]any{"status": status, "body": body})
		return b
	}
	switch {
	case req.Method == "POST" && req.URL == "Patient":
		id := fmt.Sprintf("p%d", len(f.patients)+1)
		req.Body["id"] = id
		f.patients[id] = req.Body
		return answer(201, req.Body)
	case req.Method == "GET" && strings.HasPrefix(req.URL, "Patient/"):
		if p, ok := f.patients[strings.TrimPrefix(req.URL, "Patient/")]; ok {
			return answer(200, p)
		}
		return answer(404, map[string]any{"resourceType": "OperationOutcome", "issue": []any{map[string]any{"severity": "error", "code": "not-found", "details": map[string]any{"text": "Not found"}}}})
	case req.Method == "GET" && strings.HasPrefix(req.URL, "Patient?family="):
		family := strings.TrimPrefix(req.URL, "Patient?family=")
		var entries []any
		for _, p := range f.patients {
			for _, n := range p["name"].([]any) {
				if n.(map[string]any)["family"] == family {
					entries = append(entries, map[string]any{"resource": p, "search": map[string]string{"mode": "match"}})
				}
			}
		}
		return answer(200, map[string]any{"resourceType": "Bundle", "type": "searchset", "entry": entries})
	}
	return answer(400, nil)
}

func TestFHIRPatient(t *testing.T) {
	m := module(t, "fhir-patient")
	store := &fakeFHIR{patients: map[string]map[string]any{}}
	exec := func(contentType string, input any) *runtime.Result {
		return run(t, m, runtime.Execution{Event: event(contentType, input), FHIR: store.handle})
	}
	res := exec("application/fhir+json", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Curie", "given": []string{"Marie"}}}})
	if res.Envelope.Status != 201 {
		t.Fatalf("create: %+v", res.Envelope)
	}
	var created map[string]any
	if err := json.Unmarshal(res.Envelope.Result, &created); err != nil || created["id"] != "p1" {
		t.Fatalf("created %s", res.Envelope.Result)
	}
	res = exec("application/json", map[string]string{"id": "p1"})
	if !strings.Contains(string(res.Envelope.Result), `"family":"Curie"`) {
		t.Fatalf("read %s", res.Envelope.Result)
	}
	res = exec("application/json", map[string]string{"id": "nope"})
	if res.Envelope.Status != 404 || string(res.Envelope.Error) != `"Patient nope not found"` {
		t.Fatalf("read missing %+v", res.Envelope)
	}
	res = exec("application/json", map[string]string{"family": "Curie"})
	var found []map[string]any
	if err := json.Unmarshal(res.Envelope.Result, &found); err != nil || len(found) != 1 || found[0]["id"] != "p1" {
		t.Fatalf("search %s", res.Envelope.Result)
	}
	want := []string{"POST Patient", "GET Patient/p1", "GET Patient/nope", "GET Patient?family=Curie"}
	if fmt.Sprint(store.requests) != fmt.Sprint(want) {
		t.Fatalf("requests %v", store.requests)
	}
	// Without a FHIR handler the import answers 501, which the bot reports.
	res = run(t, m, runtime.Execution{Event: event("application/json", map[string]string{"id": "p1"})})
	if !strings.Contains(string(res.Envelope.Error), "501") {
		t.Fatalf("no FHIR: %+v", res.Envelope)
	}
}

func TestCEcho(t *testing.T) {
	m := module(t, "c-echo")
	for _, in := range []string{`{"a":[1,"}]\"",{"b":null}],"c":true}`, `"text with \"quotes\""`, `42`, `[]`} {
		res := run(t, m, runtime.Execution{Event: event("application/json", json.RawMessage(in))})
		if string(res.Envelope.Result) != in {
			t.Fatalf("echo %s: got %s", in, res.Envelope.Result)
		}
	}
	// Input not first in the event, and absent.
	res := run(t, m, runtime.Execution{Event: []byte(`{"bot":{"reference":"Bot/1"},"headers":{"input":"no"},"input":{"x":1},"traceId":"t"}`)})
	if string(res.Envelope.Result) != `{"x":1}` {
		t.Fatalf("got %s", res.Envelope.Result)
	}
	res = run(t, m, runtime.Execution{Event: []byte(`{"bot":{"reference":"Bot/1"}}`)})
	if res.Envelope.Result != nil {
		t.Fatalf("got %s", res.Envelope.Result)
	}
}

func TestWASICommand(t *testing.T) {
	m := module(t, "wasi-command")
	if m.Shape() != runtime.Command {
		t.Fatalf("shape %v", m.Shape())
	}
	res := run(t, m, runtime.Execution{Event: event("text/plain", "stressed ✓")})
	if string(res.Envelope.Result) != `"✓ desserts"` {
		t.Fatalf("result %s", res.Envelope.Result)
	}
	if len(res.Logs) != 1 || res.Logs[0].Text != "reversing 12 bytes" {
		t.Fatalf("logs %+v", res.Logs)
	}
	res = run(t, m, runtime.Execution{Event: event("application/json", 1)})
	if res.Envelope.Error == nil {
		t.Fatalf("envelope %+v", res.Envelope)
	}
}

// TestBuildWithoutServerDependencies builds a Go example with an empty
// module cache and no network: the SDK must need nothing beyond the
// standard library (HL7 is its own package sdk/hl7), and every Go example's
// module graph is itself and the SDK, as a bot author's is (cmd/sandbot's
// TestBotNewGo builds one outside the repository).
func TestBuildWithoutServerDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a wasm module")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	for _, dir := range []string{"hello", "hl7-ack", "fhir-patient", "wasi-command"} {
		list := exec.Command(gobin, "list", "-m", "-f", "{{.Path}}", "all")
		list.Dir = dir
		list.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off")
		mods, err := list.Output()
		if err != nil {
			t.Fatalf("%s: go list -m all: %v", dir, err)
		}
		if got, want := strings.Fields(string(mods)), []string{"github.com/sandbot/sandbot/examples/" + dir, "github.com/sandbot/sandbot/sdk"}; !slices.Equal(got, want) {
			t.Errorf("%s: modules %q, want %q", dir, got, want)
		}
	}
	for _, dir := range []string{"hl7-ack"} {
		cache := t.TempDir()
		cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-o", filepath.Join(t.TempDir(), "bot.wasm"), ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOMODCACHE="+cache, "GOPROXY=off", "GOFLAGS=-mod=mod", "GOOS=wasip1", "GOARCH=wasm", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		// The module cache is read-only by default; let TempDir clean it.
		_ = filepath.WalkDir(cache, func(p string, d os.DirEntry, err error) error {
			if err == nil {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("%s: %v\n%s", dir, err, out)
			}
			t.Fatal(err)
		}
	}
}

func benchmarkExample(b *testing.B, name string, ev []byte) {
	wasm, err := os.ReadFile(filepath.Join(name, name+".wasm"))
	if err != nil {
		b.Fatal(err)
	}
	r, err := runtime.New(context.Background(), runtime.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(context.Background())
	m, err := r.Compile(context.Background(), wasm)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Execute(context.Background(), m, runtime.Execution{Event: ev}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCEcho(b *testing.B) {
	benchmarkExample(b, "c-echo", event("application/json", map[string]string{"hello": "world"}))
}

func BenchmarkHello(b *testing.B) {
	benchmarkExample(b, "hello", event("application/json", map[string]string{"name": "Ada"}))
}
