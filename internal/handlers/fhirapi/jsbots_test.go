package fhirapi_test

import (
	"encoding/json"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/testtiming"
)

// deployJS creates a JavaScript Bot (runtimeVersion vmcontext) and deploys
// code to it as `medplum bot deploy` does: JSON {code, filename} with the
// code as text. Without the engine (`make js` not run) the test is skipped,
// except in CI.
func deployJS(t *testing.T, c *servertest.Client, name, code string, extra map[string]any) string {
	t.Helper()
	bot := map[string]any{"resourceType": "Bot", "name": name, "runtimeVersion": "vmcontext"}
	for k, v := range extra {
		bot[k] = v
	}
	id := c.Create(bot)["id"].(string)
	deployJSCode(t, c, id, name, code)
	return id
}

// memberJSBot creates a JavaScript Bot through the admin API, which gives it
// a membership of its own (its MedplumClient then acts as the bot), and
// deploys code to it.
func memberJSBot(t testing.TB, c *servertest.Client, name, code string) string {
	t.Helper()
	id := createMemberBot(t, c, map[string]any{"name": name, "runtimeVersion": "vmcontext"})
	deployJSCode(t, c, id, name, code)
	return id
}

// deployJSCode deploys code to the Bot id, skipping the test when the
// engine was not fetched (outside CI).
func deployJSCode(t testing.TB, c *servertest.Client, id, name, code string) {
	t.Helper()
	r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", map[string]any{"code": code, "filename": name + ".js"}, "")
	if r.Status == 400 && strings.Contains(r.Issue(), "make js") && os.Getenv("CI") == "" {
		t.Skip("JavaScript engine not fetched (make js)")
	}
	if r.Status != 200 {
		t.Fatalf("deploy %s: %d %s", name, r.Status, r.Body)
	}
}

func TestJSBotDeployAndExecute(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "jsbots")
		hello := deployJS(t, c, "hello", `exports.handler = async function handler(medplum, event) {
  console.log('greeting', event.input.name);
  return { greeting: 'Hello, ' + event.input.name, contentType: event.contentType };
};`, nil)
		r := c.Do("POST", "fhir/R4/Bot/"+hello+"/$execute", `{"name":"Ada"}`, "application/json")
		if r.Status != 200 || string(r.Body) != `{"greeting":"Hello, Ada","contentType":"application/json"}` ||
			r.Header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Fatalf("hello: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
		var saved map[string]any
		json.Unmarshal(c.Do("GET", "fhir/R4/Bot/"+hello, nil, "").Body, &saved)
		code, _ := saved["executableCode"].(map[string]any)
		if code["contentType"] != "application/javascript" || code["title"] != "hello.js" {
			t.Errorf("executableCode = %v", code)
		}
		bin := c.DoWith("GET", "fhir/R4/"+code["url"].(string), nil, "", map[string]string{"Accept": "application/fhir+json"}).JSON()
		if bin["contentType"] != "application/javascript" {
			t.Errorf("Binary = %v", bin)
		}

		// A raw application/javascript body, a string result to a text
		// request, and to a JSON request (DECISIONS 7: valid JSON).
		echo := c.Create(map[string]any{"resourceType": "Bot", "name": "echo", "runtimeVersion": "awslambda"})["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+echo+"/$deploy", []byte(`exports.handler = (medplum, event) => typeof event.input === 'string' ? event.input.toUpperCase() : 'json';`), "application/javascript"); r.Status != 200 {
			t.Fatalf("raw deploy: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+echo+"/$execute", "shout", "text/plain"); r.Status != 200 || string(r.Body) != "SHOUT" ||
			r.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Errorf("text: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+echo+"/$execute", `{}`, "application/json"); r.Status != 200 || string(r.Body) != `"json"` {
			t.Errorf("string to JSON: %d %s", r.Status, r.Body)
		}
		// What executeBot sends by default: application/fhir+json, which for
		// a JavaScript bot (as on the reference) need not be a resource.
		if r := c.Do("POST", "fhir/R4/Bot/"+hello+"/$execute", `{"name":"Bo"}`, "application/fhir+json"); r.Status != 200 ||
			string(r.Body) != `{"greeting":"Hello, Bo","contentType":"application/fhir+json"}` {
			t.Errorf("fhir+json without resourceType: %d %s", r.Status, r.Body)
		}

		// HL7 input is an Hl7Message; an Hl7Message result is its text.
		ack := deployJS(t, c, "ack", `exports.handler = async (medplum, event) => {
  if (!(event.input instanceof Hl7Message)) throw new Error('not an Hl7Message');
  return event.input.buildAck();
};`, nil)
		r = c.Do("POST", "fhir/R4/Bot/"+ack+"/$execute", adtA01, "x-application/hl7-v2+er7")
		if r.Status != 200 || !strings.HasPrefix(string(r.Body), "MSH|^~\\&|RECV|FAC2|SENDER|FAC|") || !strings.Contains(string(r.Body), "\rMSA|AA|MSG00001|OK") ||
			r.Header.Get("Content-Type") != "x-application/hl7-v2+er7; charset=utf-8" {
			t.Errorf("ack: %d %s %q", r.Status, r.Header.Get("Content-Type"), r.Body)
		}

		// Errors: thrown message, OperationOutcomeError, a syntax error at
		// deploy with its line and column, sandbot's status extension.
		failing := deployJS(t, c, "failing", `const { OperationOutcomeError, notFound } = require('@medplum/core');
exports.handler = async (medplum, event) => {
  if (event.input.kind === 'outcome') throw new OperationOutcomeError(notFound);
  if (event.input.kind === 'status') return new Response(JSON.stringify({ created: true }), { status: 201, headers: { 'content-type': 'application/fhir+json' } });
  throw new Error('it broke: ' + event.input.kind);
};`, nil)
		r = c.Do("POST", "fhir/R4/Bot/"+failing+"/$execute", `{"kind":"plain"}`, "application/json")
		if r.Status != 400 || r.Issue() != "it broke: plain" {
			t.Errorf("thrown: %d %s", r.Status, r.Body)
		}
		r = c.Do("POST", "fhir/R4/Bot/"+failing+"/$execute", `{"kind":"outcome"}`, "application/json")
		if r.Status != 400 || r.Issue() != "Not found" {
			t.Errorf("OperationOutcomeError: %d %s", r.Status, r.Body)
		}
		r = c.Do("POST", "fhir/R4/Bot/"+failing+"/$execute", `{"kind":"status"}`, "application/json")
		if r.Status != 201 || string(r.Body) != `{"created":true}` || r.Header.Get("Content-Type") != "application/fhir+json" {
			t.Errorf("Response: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
		// A Binary result: its text to a GET, the resource to a POST.
		binary := deployJS(t, c, "binary", `exports.handler = () => ({ resourceType: 'Binary', contentType: 'text/plain', data: btoa('Hello, world!') });`, nil)
		if r := c.Do("GET", "fhir/R4/Bot/"+binary+"/$execute", nil, ""); r.Status != 200 || string(r.Body) != "Hello, world!" || r.Header.Get("Content-Type") != "text/plain" {
			t.Errorf("Binary to GET: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+binary+"/$execute", `{}`, "application/json"); r.Status != 200 || r.JSON()["resourceType"] != "Binary" || r.Header.Get("Content-Type") != "application/fhir+json" {
			t.Errorf("Binary to POST: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
		bad := c.Create(map[string]any{"resourceType": "Bot", "name": "bad", "runtimeVersion": "vmcontext"})["id"].(string)
		r = c.Do("POST", "fhir/R4/Bot/"+bad+"/$deploy", map[string]any{"code": "exports.handler = async () => {\n  return {;\n};", "filename": "bad.js"}, "")
		if r.Status != 400 || !strings.Contains(r.Issue(), "SyntaxError") || !strings.Contains(r.Issue(), "bad.js, line 2, column") {
			t.Errorf("syntax error: %d %s", r.Status, r.Body)
		}
		// WebAssembly sent to a JavaScript bot, JavaScript to a wasm bot.
		if r := c.Do("POST", "fhir/R4/Bot/"+bad+"/$deploy", readWasm(t, "../../../examples/c-echo/c-echo.wasm"), "application/wasm"); r.Status != 400 || !strings.Contains(r.Issue(), "runtimeVersion") {
			t.Errorf("wasm to a JS bot: %d %s", r.Status, r.Body)
		}
		wasmBot := c.Create(map[string]any{"resourceType": "Bot", "name": "native"})["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+wasmBot+"/$deploy", map[string]any{"code": "exports.handler = () => 1;"}, ""); r.Status != 400 || !strings.Contains(r.Issue(), "vmcontext") {
			t.Errorf("JS to a wasm bot: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+wasmBot+"/$deploy", map[string]any{"code": "x"}, ""); r.Status != 400 {
			t.Errorf("unknown runtime: %d %s", r.Status, r.Body)
		}

		// The log is the AuditEvent's outcomeDesc (written in the background).
		var audit map[string]any
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if audit = c.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+hello, nil, "").JSON(); strings.Contains(string(mustJSON(audit)), "greeting Ada") {
				break
			}
		}
		if !strings.Contains(string(mustJSON(audit)), "greeting Ada") {
			t.Errorf("AuditEvent does not hold the log: %s", mustJSON(audit))
		}
	})
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestJSBotUsesMedplum: the bot's MedplumClient creates and searches
// resources through the server, as the bot's own membership, and fetch
// reaches nothing else.
func TestJSBotUsesMedplum(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "jsmedplum")
		code := `const { createReference, getReferenceString } = require('@medplum/core');
exports.handler = async function handler(medplum, event) {
  const patient = await medplum.createResource({ resourceType: 'Patient', name: [{ given: ['Ada'], family: event.input.family }] });
  const found = await medplum.searchResources('Patient', { family: event.input.family });
  let refused = '';
  try { await fetch('https://example.com/'); } catch (err) { refused = err.message; }
  return { ref: getReferenceString(patient), display: createReference(patient).reference, found: found.length, refused };
};`
		id := memberJSBot(t, c, "patients", code)
		r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"family":"Lovelace"}`, "application/json")
		var out struct {
			Ref, Display, Refused string
			Found                 int
		}
		if r.Status != 200 || json.Unmarshal(r.Body, &out) != nil {
			t.Fatalf("execute: %d %s", r.Status, r.Body)
		}
		if !strings.HasPrefix(out.Ref, "Patient/") || out.Display != out.Ref || out.Found != 1 || !strings.Contains(out.Refused, "no network") {
			t.Errorf("result %+v", out)
		}
		got := c.Do("GET", "fhir/R4/"+out.Ref, nil, "").JSON()
		if got["resourceType"] != "Patient" {
			t.Errorf("the bot's Patient is not in the project: %v", got)
		}
	})
}

// TestJSBotLimits: every limit ends in a 4xx within its time (the timeout,
// or a few seconds for the other limits) plus a second with
// SANDBOT_STRICT_TIMING=1 (plus testtiming.Slack otherwise), while another
// bot keeps answering.
func TestJSBotLimits(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "jslimits")
		quick := deployJS(t, c, "quick", `exports.handler = () => ({ ok: true });`, nil)
		cases := []struct {
			name, code, want string
			timeout          int // seconds, the Bot's timeout
			// within is when the limit is expected to end the execution.
			// A case that is not about the deadline has a Bot timeout far
			// beyond it, so that on a loaded machine it meets its own limit
			// and not the timeout.
			within time.Duration
		}{
			{"loop", `exports.handler = () => { for (;;) {} };`, "timed out", 1, time.Second},
			{"await chain", `exports.handler = async () => { for (;;) { await null; } };`, "timed out", 1, time.Second},
			{"timer chain", `exports.handler = () => new Promise(() => { const again = () => setTimeout(again, 0); again(); });`, "timed out", 1, time.Second},
			{"memory", `exports.handler = () => { const a = []; for (;;) a.push(new Uint8Array(1 << 20).fill(1)); };`, "memory limit", 120, 5 * time.Second},
			{"output", `exports.handler = () => new Array(9 << 10).fill('x'.repeat(1024)).join('');`, "output exceeded", 120, 10 * time.Second},
			{"never settles", `exports.handler = () => new Promise(() => {});`, "never settles", 1, time.Second},
			{"deep recursion", `const f = (n) => f(n + 1) + 1; exports.handler = () => f(0);`, "call stack", 120, 5 * time.Second},
		}
		var wg sync.WaitGroup
		var running atomic.Int32
		running.Add(int32(len(cases)))
		for _, tc := range cases {
			id := deployJS(t, c, strings.ReplaceAll(tc.name, " ", "-"), tc.code, map[string]any{"timeout": tc.timeout})
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer running.Add(-1)
				start := time.Now()
				r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{}`, "application/json")
				took := time.Since(start)
				if r.Status < 400 || r.Status > 499 || !strings.Contains(r.Issue(), tc.want) {
					t.Errorf("%s: %d %s", tc.name, r.Status, r.Body)
				}
				if bound := testtiming.Bound(tc.within, time.Second); took > bound {
					t.Errorf("%s: answered after %v, over %v", tc.name, took, bound)
				}
			}()
		}
		// Meanwhile, the quick bot answers: count its answers that came
		// while a limited bot was still running (the three 1 s deadlines
		// keep them running for at least a second, however slow the
		// machine).
		n := 0
		for running.Load() > 0 {
			if r := c.Do("POST", "fhir/R4/Bot/"+quick+"/$execute", `{}`, "application/json"); r.Status != 200 || string(r.Body) != `{"ok":true}` {
				t.Fatalf("quick bot: %d %s", r.Status, r.Body)
			}
			if running.Load() > 0 {
				n++
			}
		}
		wg.Wait()
		if n < 3 {
			t.Errorf("the quick bot answered only %d times while the others ran", n)
		}
	})
}
