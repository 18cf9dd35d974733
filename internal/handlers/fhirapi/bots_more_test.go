package fhirapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// deployBot creates a Bot and deploys a module to it; extra fields go on the Bot.
func deployBot(t *testing.T, c *servertest.Client, wasm []byte, extra map[string]any) string {
	t.Helper()
	bot := map[string]any{"resourceType": "Bot", "name": "test bot"}
	for k, v := range extra {
		bot[k] = v
	}
	id := c.Create(bot)["id"].(string)
	if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
		t.Fatalf("deploy: %d %s", r.Status, r.Body)
	}
	return id
}

func updateProject(t *testing.T, s *servertest.Server, projectID string, fn func(p fhir.Resource)) {
	t.Helper()
	_, err := s.Store.Update(context.Background(), store.AllProjects, "Project", projectID, store.Write{}, func(p fhir.Resource) (fhir.Resource, error) {
		fn(p)
		return p, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Written straight to the store, not through the API: the store
	// announces the change to the server's caches all the same.
}

func TestBotEventAndEnvelopes(t *testing.T) {
	wasm := readWasm(t, "testdata/event.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "events")
		updateProject(t, s, c.ProjectID, func(p fhir.Resource) {
			p["secret"] = []any{map[string]any{"name": "API_KEY", "valueString": "s3cret"}}
		})
		id := deployBot(t, c, wasm, map[string]any{"name": "inspector"})
		run := func(input, ct string, headers map[string]string) *servertest.Response {
			return c.DoWith("POST", "fhir/R4/Bot/"+id+"/$execute", input, ct, headers)
		}

		r := run(`{"k":"v"}`, "application/json", map[string]string{
			"X-Trace-Id": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "Cookie": "session=1", "X-Custom": "yes"})
		if r.Status != 200 {
			t.Fatalf("event: %d %s", r.Status, r.Body)
		}
		var ev struct {
			Bot         map[string]string `json:"bot"`
			Requester   map[string]string `json:"requester"`
			ContentType string            `json:"contentType"`
			Input       map[string]string `json:"input"`
			Secrets     map[string]map[string]string
			TraceID     string            `json:"traceId"`
			Headers     map[string]string `json:"headers"`
		}
		if err := json.Unmarshal(r.Body, &ev); err != nil {
			t.Fatalf("event %s: %v", r.Body, err)
		}
		if ev.Bot["reference"] != "Bot/"+id || ev.Bot["display"] != "inspector" || ev.Requester["reference"] != c.Profile {
			t.Errorf("bot/requester = %v %v", ev.Bot, ev.Requester)
		}
		if ev.ContentType != "application/json" || ev.Input["k"] != "v" {
			t.Errorf("contentType/input = %q %v", ev.ContentType, ev.Input)
		}
		if ev.Secrets["API_KEY"]["valueString"] != "s3cret" {
			t.Errorf("secrets = %v", ev.Secrets)
		}
		if ev.TraceID != "7c9e6679-7425-40de-944b-e07fc1f90ae7" {
			t.Errorf("traceId = %q", ev.TraceID)
		}
		if ev.Headers["x-custom"] != "yes" || ev.Headers["authorization"] != "" || ev.Headers["cookie"] != "" {
			t.Errorf("headers = %v", ev.Headers)
		}
		// traceparent is used when there is no X-Trace-Id.
		r = run(`{}`, "application/json", map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
		json.Unmarshal(r.Body, &ev)
		if ev.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("traceId from traceparent = %q", ev.TraceID)
		}

		cases := []struct {
			input, ct string
			status    int
			wantCT    string
			wantBody  string
			wantIssue string
		}{
			{"string", "application/fhir+json", 200, "application/json; charset=utf-8", `"hello"`, ""},
			{"string", "text/plain", 200, "text/plain; charset=utf-8", `hello`, ""},
			{"null", "text/plain", 200, "application/fhir+json; charset=utf-8", "", "All OK"},
			{"html", "text/plain", 200, "text/html", "<b>hi</b>", ""},
			{"oo", "text/plain", 422, "application/fhir+json; charset=utf-8", "", "custom"},
			{"fail-text", "text/plain", 400, "application/fhir+json; charset=utf-8", "", "it went wrong"},
		}
		for _, tc := range cases {
			body := tc.input
			if tc.ct == "application/fhir+json" {
				body = `{"resourceType":"Basic","id":"string"}`
			}
			r := run(body, tc.ct, nil)
			if tc.ct == "application/fhir+json" {
				// The fixture only switches on text input; a JSON request's
				// string result is checked with a text bot below.
				continue
			}
			if r.Status != tc.status || r.Header.Get("Content-Type") != tc.wantCT {
				t.Errorf("%s: %d %q %s", tc.input, r.Status, r.Header.Get("Content-Type"), r.Body)
				continue
			}
			if tc.wantBody != "" && string(r.Body) != tc.wantBody {
				t.Errorf("%s: body %q, want %q", tc.input, r.Body, tc.wantBody)
			}
			if tc.wantIssue != "" && r.Issue() != tc.wantIssue {
				t.Errorf("%s: issue %q, want %q (%s)", tc.input, r.Issue(), tc.wantIssue, r.Body)
			}
		}
	})
}

func TestBotStringResultToJSONRequestIsJSON(t *testing.T) {
	wasm := readWasm(t, "../../../runtime/testdata/bots.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "json-string")
		id := deployBot(t, c, wasm, nil)
		// "status" answers {"result":"made","status":201,"contentType":"text/plain"}.
		r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"x":"status"}`, "application/json")
		if r.Status != 201 || r.Header.Get("Content-Type") != "text/plain" || string(r.Body) != "made" {
			t.Errorf("status override: %d %q %q", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
		// "unknown" answers {"result":"unknown"}: to a JSON request it is a JSON string.
		r = c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"x":"y"}`, "application/json")
		var s2 string
		if r.Status != 200 || json.Unmarshal(r.Body, &s2) != nil || s2 != "unknown" {
			t.Errorf("string result to JSON request: %d %q", r.Status, r.Body)
		}
	})
}

func TestBotLimitsAndFailures(t *testing.T) {
	wasm := readWasm(t, "../../../runtime/testdata/bots.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "limits")
		// Only "loop" is about the deadline: the other cases run on a Bot
		// whose deadline is far away, so that on a loaded machine "grow"
		// (64 MiB written 1 MiB at a time) and "bigout" meet their own limit
		// and not the timeout.
		quick := deployBot(t, c, wasm, map[string]any{"timeout": 1})
		slow := deployBot(t, c, wasm, map[string]any{"timeout": 120})
		cases := []struct{ word, issue, id string }{
			{"loop", "timed out after 1000 ms", quick},
			{"grow", "memory", slow},
			{"bigout", "output", slow},
			{"trap", "", slow},
			{"badjson", "", slow},
			{"badstatus", "", slow},
		}
		for _, tc := range cases {
			r := c.Do("POST", "fhir/R4/Bot/"+tc.id+"/$execute", tc.word, "text/plain")
			if r.Status != 400 || !strings.Contains(strings.ToLower(r.Issue()), tc.issue) {
				t.Errorf("%s: %d %s (want 400 naming %q)", tc.word, r.Status, r.Body, tc.issue)
			}
		}
		// Fresh instances: a global counter is 1 on every call.
		for i := 0; i < 3; i++ {
			if r := c.Do("POST", "fhir/R4/Bot/"+slow+"/$execute", "counter", "text/plain"); string(r.Body) != "1" {
				t.Errorf("counter call %d: %d %q", i, r.Status, r.Body)
			}
		}
		// The executions are audited with their outcome (written in the background).
		s.Server.Close()
		audited := 0
		for _, id := range []string{quick, slow} {
			req, _ := fhir.ParseSearch("AuditEvent", "entity=Bot/"+id+"&outcome=4")
			res, err := s.Store.Search(context.Background(), store.ProjectScope(c.ProjectID), req)
			if err != nil {
				t.Fatal(err)
			}
			audited += len(res.Records)
		}
		if audited < len(cases) {
			t.Errorf("failed executions audited: %d of %d", audited, len(cases))
		}
	})
}

func TestBotConcurrentExecutions(t *testing.T) {
	wasm := readWasm(t, "../../../examples/c-echo/c-echo.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "concurrent")
		id := deployBot(t, c, wasm, nil)
		var wg sync.WaitGroup
		errs := make(chan string, 50)
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				want := fmt.Sprintf("caller-%02d", i)
				r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", want, "text/plain")
				if r.Status != 200 || string(r.Body) != want {
					errs <- fmt.Sprintf("%s got %d %q", want, r.Status, r.Body)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	})
}

func TestBotRedeployAndGates(t *testing.T) {
	echo := readWasm(t, "../../../examples/c-echo/c-echo.wasm")
	event := readWasm(t, "testdata/event.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "redeploy")
		id := deployBot(t, c, echo, map[string]any{"identifier": []any{map[string]any{"system": "s", "value": "dup"}}})
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "null", "text/plain"); string(r.Body) != "null" {
			t.Fatalf("echo: %d %q", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", event, "application/wasm"); r.Status != 200 {
			t.Fatalf("redeploy: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "null", "text/plain"); r.Issue() != "All OK" {
			t.Errorf("the next execution after a redeploy must use the new module: %d %q", r.Status, r.Body)
		}
		// Redeploy without code recompiles what the Bot points at.
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", map[string]any{}, ""); r.Status != 200 {
			t.Errorf("redeploy without code: %d %s", r.Status, r.Body)
		}
		// So does no body at all, without a media type (the web app's Deploy button).
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", nil, ""); r.Status != 200 {
			t.Errorf("redeploy without a body: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "null", "text/plain"); r.Issue() != "All OK" {
			t.Errorf("after an empty redeploy the stored module runs: %d %q", r.Status, r.Body)
		}
		// A body without a media type is still refused.
		req, _ := http.NewRequest("POST", s.URL+"fhir/R4/Bot/"+id+"/$deploy", strings.NewReader("AGFzbQ=="))
		req.Header.Set("Authorization", "Bearer "+c.Token)
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 415 {
			t.Errorf("untyped body: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
		// A Bot never deployed has nothing to redeploy.
		fresh := c.Create(map[string]any{"resourceType": "Bot", "name": "empty"})["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+fresh+"/$deploy", nil, ""); r.Status != 400 {
			t.Errorf("redeploy of a Bot without code: %d %s", r.Status, r.Body)
		}
		// Two bots with one identifier in a project: 412.
		deployBot(t, c, echo, map[string]any{"identifier": []any{map[string]any{"system": "s", "value": "dup"}}})
		if r := c.Do("GET", "fhir/R4/Bot/$execute?identifier=s|dup", nil, ""); r.Status != 412 {
			t.Errorf("ambiguous identifier: %d %s", r.Status, r.Body)
		}
		// An unsupported runtime (the reference's fission); a JavaScript
		// runtime over a WebAssembly module (DECISIONS 12).
		js := deployBot(t, c, echo, nil)
		c.Do("PATCH", "fhir/R4/Bot/"+js, `[{"op":"add","path":"/runtimeVersion","value":"fission"}]`, "application/json-patch+json")
		if r := c.Do("POST", "fhir/R4/Bot/"+js+"/$execute", "x", "text/plain"); r.Status != 400 || r.Issue() != "Unsupported bot runtime" {
			t.Errorf("fission bot: %d %s", r.Status, r.Body)
		}
		c.Do("PATCH", "fhir/R4/Bot/"+js, `[{"op":"replace","path":"/runtimeVersion","value":"vmcontext"}]`, "application/json-patch+json")
		if r := c.Do("POST", "fhir/R4/Bot/"+js+"/$execute", "x", "text/plain"); r.Status != 400 || !strings.Contains(r.Issue(), "deploy JavaScript code") {
			t.Errorf("vmcontext bot with a wasm module: %d %s", r.Status, r.Body)
		}
		// A project may switch bots off.
		updateProject(t, s, c.ProjectID, func(p fhir.Resource) {
			p["setting"] = []any{map[string]any{"name": "bots", "valueBoolean": false}}
		})
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "x", "text/plain"); r.Status != 400 || r.Issue() != "Bots not enabled" {
			t.Errorf("bots off: %d %s", r.Status, r.Body)
		}
	})
}

func TestBotFHIRImportActsAsBotMembership(t *testing.T) {
	wasm := readWasm(t, "../../../examples/fhir-patient/fhir-patient.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "fhir-import")
		other := s.NewProject(t, "elsewhere")
		hidden := other.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
		// The Bot got its membership when it was created.
		id := deployBot(t, c, wasm, nil)
		patient := `{"resourceType":"Patient","name":[{"family":"FromBot"}]}`
		r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", patient, "application/fhir+json")
		if r.Status != 201 {
			t.Fatalf("bot create: %d %s", r.Status, r.Body)
		}
		created := r.JSON()
		meta, _ := created["meta"].(map[string]any)
		author, _ := meta["author"].(map[string]any)
		if meta["project"] != c.ProjectID || author["reference"] != "Bot/"+id {
			t.Errorf("bot-created Patient meta = %v", meta)
		}
		// The bot cannot see another project's patient.
		r = c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"id":"`+hidden+`"}`, "application/json")
		if r.Status != 404 {
			t.Errorf("bot read across projects: %d %s", r.Status, r.Body)
		}
		// Without its membership (removed here behind the API's back) the
		// bot runs but its FHIR calls are refused.
		ms, err := store.SearchResources(context.Background(), s.Store, store.AllProjects, "ProjectMembership", "user=Bot/"+id)
		if err != nil || len(ms) != 1 {
			t.Fatalf("the bot's membership: %v %v", ms, err)
		}
		if err := s.Store.Delete(context.Background(), store.AllProjects, "ProjectMembership", ms[0].ID(), store.Write{}); err != nil {
			t.Fatal(err)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", patient, "application/fhir+json"); r.Status == 201 || !strings.Contains(string(r.Body), "Bot has no project membership") {
			t.Errorf("a bot without a membership must not write: %d %s", r.Status, r.Body)
		}
	})
}

// TestBotModuleCacheEviction: with room for one compiled module, two bots
// executed in turn evict each other at every call; each execution compiles
// its module again from the stored Binary and answers correctly.
func TestBotModuleCacheEviction(t *testing.T) {
	echo := readWasm(t, "../../../examples/c-echo/c-echo.wasm")
	event := readWasm(t, "testdata/event.wasm")
	reg := prometheus.NewRegistry()
	rt, err := runtime.New(context.Background(), runtime.Config{Limits: limits.Limits{ModuleCacheBytes: int64(max(len(echo), len(event)) + 1)}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	withRuntime := func(cfg *server.Config) { cfg.Runtime = rt }
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "evict")
		a := deployBot(t, c, echo, nil)
		b := deployBot(t, c, event, nil)
		for i := 0; i < 3; i++ {
			if r := c.Do("POST", "fhir/R4/Bot/"+a+"/$execute", "ping", "text/plain"); r.Status != 200 || string(r.Body) != "ping" {
				t.Fatalf("echo, round %d: %d %q", i, r.Status, r.Body)
			}
			if r := c.Do("POST", "fhir/R4/Bot/"+b+"/$execute", "null", "text/plain"); r.Issue() != "All OK" {
				t.Fatalf("event bot, round %d: %d %q", i, r.Status, r.Body)
			}
		}
	}, withRuntime)
	if n := servertest.MetricValue(t, reg, "sandbot_bot_module_cache_evictions_total"); n < 6 {
		t.Errorf("evictions %v, want at least 6", n)
	}
}
