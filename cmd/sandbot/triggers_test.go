package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
)

// Every trigger of a bot runs it the same way: a synchronous $execute, an
// asynchronous one (a job) and `sandbot bot run` go through the bots
// service, so that the same limits end the same executions with the same
// message, the same admission refuses them, and each leaves the same
// AuditEvent.

// triggerLimits are the limits of the three paths: a small memory limit, so
// that "grow" fails quickly.
var triggerLimits = limits.Limits{BotMemoryBytes: 4 << 20}

// withRuntime gives a test server a runtime of its own with lim.
func withRuntime(t *testing.T, lim limits.Limits) servertest.Option {
	rt, err := runtime.New(context.Background(), runtime.Config{Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	return func(cfg *server.Config) { cfg.Runtime = rt; cfg.Limits = lim }
}

// triggered is what one execution, by one trigger, showed.
type triggered struct {
	failure string // the failure's message ("" when the bot ran to its end)
	audit   map[string]any
}

// auditShape is what an AuditEvent must show the same whatever the trigger.
func auditShape(ev map[string]any) string {
	b, _ := json.Marshal(map[string]any{
		"type":        servertest.Field(ev, "type", "code"),
		"outcome":     ev["outcome"],
		"outcomeDesc": ev["outcomeDesc"],
		"agents":      len(ev["agent"].([]any)),
		"role":        servertest.Field(ev["entity"].([]any)[0], "role", "code"),
		"observer":    strings.HasPrefix(servertest.Field(ev, "source", "observer", "reference").(string), "Bot/"),
	})
	return string(b)
}

func TestEveryTriggerRunsTheSameWay(t *testing.T) {
	wasmPath := filepath.Join("..", "..", "runtime", "testdata", "bots.wasm")
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		t.Fatal(err)
	}
	inputs := []string{"log", "error", "grow", "trap"}
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "triggers")
		r := c.Do("POST", "admin/projects/"+c.ProjectID+"/bot", map[string]any{"name": "bots"}, "application/json")
		if r.Status != 201 {
			t.Fatalf("bot: %d %s", r.Status, r.Body)
		}
		bot := r.JSON()["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+bot+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
			t.Fatalf("deploy: %d %s", r.Status, r.Body)
		}
		audits := func(n int) []map[string]any {
			deadline := time.Now().Add(30 * time.Second)
			for {
				r := c.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+bot+"&_sort=_lastUpdated&_count=100", nil, "")
				entries, _ := r.JSON()["entry"].([]any)
				if len(entries) >= n || time.Now().After(deadline) {
					var out []map[string]any
					for _, e := range entries {
						out = append(out, e.(map[string]any)["resource"].(map[string]any))
					}
					return out
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		for _, in := range inputs {
			t.Run(in, func(t *testing.T) {
				body := map[string]any{in: true}
				seen := map[string]triggered{}

				// Synchronous: the answer, then its AuditEvent.
				before := len(audits(0))
				r := c.Do("POST", "fhir/R4/Bot/"+bot+"/$execute", body, "application/json")
				sync := triggered{}
				if r.Status == 400 && in != "error" {
					sync.failure = r.Issue()
				}
				sync.audit = audits(before + 1)[before]
				seen["sync"] = sync

				// Asynchronous: the job's outcome, then its AuditEvent.
				status := submitAsync(t, c, bot, body)
				job := awaitAsync(t, c, status)
				async := triggered{}
				if in == "grow" || in == "trap" {
					async.failure = servertest.Field(job, "output", "parameter").([]any)[0].(map[string]any)["resource"].(map[string]any)["issue"].([]any)[0].(map[string]any)["details"].(map[string]any)["text"].(string)
				}
				async.audit = audits(before + 2)[before+1]
				seen["async"] = async

				// Local: sandbot bot run --audit, with the same limits.
				input, _ := json.Marshal(body)
				code, _, errs := botRun(t, string(input), "run", wasmPath, "--input", "-", "--audit",
					"--bot-memory-bytes", strconv.FormatInt(triggerLimits.BotMemoryBytes, 10))
				local := triggered{}
				if i := strings.Index(errs, "bot failed ("); i >= 0 {
					_, msg, _ := strings.Cut(errs[i:], "): ")
					local.failure = strings.TrimSpace(strings.Split(msg, "\n")[0])
				}
				if i := strings.Index(errs, "[audit] "); i >= 0 {
					line, _, _ := strings.Cut(errs[i+len("[audit] "):], "\n")
					if err := json.Unmarshal([]byte(line), &local.audit); err != nil {
						t.Fatalf("local audit line %q: %v", line, err)
					}
				} else {
					t.Fatalf("no AuditEvent on bot run's stderr (exit %d): %s", code, errs)
				}
				seen["local"] = local

				want := seen["sync"]
				for _, path := range []string{"async", "local"} {
					got := seen[path]
					if got.failure != want.failure {
						t.Errorf("%s failure %q, sync %q", path, got.failure, want.failure)
					}
					if g, w := auditShape(got.audit), auditShape(want.audit); g != w {
						t.Errorf("%s AuditEvent\n  %s\nsync\n  %s", path, g, w)
					}
				}
				if (in == "grow" || in == "trap") == (want.failure == "") {
					t.Errorf("%s: failure %q", in, want.failure)
				}
				t.Logf("%s: failure %q, audit outcome %v, %d bytes of outcomeDesc", in, want.failure, want.audit["outcome"], len(fmt.Sprint(want.audit["outcomeDesc"])))
			})
		}
	}, withRuntime(t, triggerLimits))
}

// The same admission refuses every trigger: while one execution (a job
// spinning until it is cancelled) holds an execution budget too small for
// two, a synchronous $execute is a 429 with
// Retry-After, an asynchronous one waits in its queue (sent back, uncounted,
// for capacity) and runs once the budget is free, and a local run (the
// bots service's RunLocal, which sandbot bot run calls) on the same runtime
// is refused with the same reason.
func TestEveryTriggerMeetsTheSameAdmission(t *testing.T) {
	wasmPath := filepath.Join("..", "..", "runtime", "testdata", "bots.wasm")
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		t.Fatal(err)
	}
	tiny := limits.Limits{ExecutionMemoryBytes: 1 << 20}
	rt, err := runtime.New(context.Background(), runtime.Config{Limits: tiny})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "admission")
		r := c.Do("POST", "admin/projects/"+c.ProjectID+"/bot", map[string]any{"name": "bots", "timeout": 300}, "application/json")
		bot := r.JSON()["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+bot+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
			t.Fatalf("deploy: %d %s", r.Status, r.Body)
		}
		// One execution, a job, spins until it is cancelled, holding the
		// budget (it is itself sent back while a probe below runs, and
		// starts once that probe has ended).
		spinner := submitAsync(t, c, bot, map[string]any{"loop": true})
		var refusal string
		deadline := time.Now().Add(30 * time.Second)
		for refusal == "" {
			time.Sleep(20 * time.Millisecond)
			r := c.Do("POST", "fhir/R4/Bot/"+bot+"/$execute", map[string]any{"log": true}, "application/json")
			switch {
			case r.Status == 429 && r.Header.Get("Retry-After") != "":
				refusal = r.Issue()
			case time.Now().After(deadline):
				t.Fatalf("sync while the budget is held: %d %s", r.Status, r.Body)
			}
		}
		retriedBefore := retried(t, s)

		status := submitAsync(t, c, bot, map[string]any{"log": true})
		for retried(t, s) == retriedBefore {
			if time.Now().After(deadline) {
				t.Fatal("the job was never tried")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if job := c.Do("GET", status, nil, ""); job.Status != 202 {
			t.Errorf("async job refused admission: %d %s (it should wait)", job.Status, job.Body)
		}

		svc, err := bots.New(bots.Config{Runtime: rt, Limits: tiny})
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Close()
		mod, err := rt.Compile(context.Background(), wasm)
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.RunLocal(context.Background(), bots.Local{Module: mod, Name: "bots.wasm", MediaType: "application/json", Input: []byte(`{"log":true}`)})
		var busy *runtime.BusyError
		if !errors.As(err, &busy) || busy.Reason != refusal {
			t.Errorf("local run while the budget is held: %v; the server refused with %q", err, refusal)
		}

		if r := c.Do("DELETE", spinner, nil, ""); r.Status != 202 {
			t.Fatalf("cancel the spinning job: %d %s", r.Status, r.Body)
		}
		if job := awaitAsync(t, c, status); job["status"] != "completed" {
			t.Errorf("the waiting job, once the budget was free: %v", job)
		}
	}, func(cfg *server.Config) { cfg.Runtime = rt; cfg.Limits = tiny })
}

// retried is how many job starts were sent back for lack of capacity.
func retried(t *testing.T, s *servertest.Server) float64 {
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "sandbot_jobs_ended_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "how" && l.GetValue() == "retry" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

func submitAsync(t *testing.T, c *servertest.Client, bot string, body any) string {
	t.Helper()
	r := c.DoWith("POST", "fhir/R4/Bot/"+bot+"/$execute", body, "application/json", map[string]string{"Prefer": "respond-async"})
	if r.Status != 202 {
		t.Fatalf("async $execute: %d %s", r.Status, r.Body)
	}
	return strings.TrimPrefix(r.Header.Get("Content-Location"), c.Base())
}

func awaitAsync(t *testing.T, c *servertest.Client, status string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := c.Do("GET", status, nil, "")
		if r.Status == 200 {
			return r.JSON()
		}
		if r.Status != 202 || time.Now().After(deadline) {
			t.Fatalf("job: %d %s", r.Status, r.Body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
