package fhirapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
)

var respondAsync = map[string]string{"Prefer": "respond-async"}

// memberBot creates a Bot with its own project membership through the admin
// API (so that its FHIR calls may write) and deploys wasm to it.
func memberBot(t *testing.T, c *servertest.Client, name string, wasm []byte) string {
	t.Helper()
	id := createMemberBot(t, c, map[string]any{"name": name})
	if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
		t.Fatalf("deploy: %d %s", r.Status, r.Body)
	}
	return id
}

// createMemberBot creates a Bot through the admin API, which gives it a
// project membership of its own, and answers its id.
func createMemberBot(t testing.TB, c *servertest.Client, bot map[string]any) string {
	t.Helper()
	r := c.Do("POST", "admin/projects/"+c.ProjectID+"/bot", bot, "application/json")
	if r.Status != 201 {
		t.Fatalf("create bot: %d %s", r.Status, r.Body)
	}
	return r.JSON()["id"].(string)
}

// submit posts an asynchronous $execute and checks the 202: Content-Location
// is the job's status URL, also in the outcome's diagnostics. It answers
// the status path (relative to the base).
func submit(t *testing.T, c *servertest.Client, bot string, body any, contentType string) string {
	t.Helper()
	r := c.DoWith("POST", "fhir/R4/Bot/"+bot+"/$execute", body, contentType, respondAsync)
	loc := r.Header.Get("Content-Location")
	if r.Status != 202 || !strings.HasPrefix(loc, c.Base()+"fhir/R4/job/") || !strings.HasSuffix(loc, "/status") {
		t.Fatalf("async $execute: %d %q %s", r.Status, loc, r.Body)
	}
	oo := r.JSON()
	issue, _ := oo["issue"].([]any)
	if oo["id"] != "accepted" || len(issue) != 1 || issue[0].(map[string]any)["diagnostics"] != loc {
		t.Errorf("accepted outcome: %s", r.Body)
	}
	return strings.TrimPrefix(loc, c.Base())
}

// awaitJob polls a job's status until it is no longer 202 and answers the
// final AsyncJob.
func awaitJob(t *testing.T, c *servertest.Client, status string) map[string]any {
	t.Helper()
	// A job whose process was killed runs again once River's rescuer (every
	// 30 s) has found it: allow for that.
	deadline := time.Now().Add(120 * time.Second)
	for {
		r := c.Do("GET", status, nil, "")
		switch r.Status {
		case 200:
			return r.JSON()
		case 202:
			if job := r.JSON(); job["resourceType"] != "AsyncJob" || (job["status"] != "accepted" && job["status"] != "active") || r.Header.Get("Content-Location") != c.Base()+status {
				t.Fatalf("pending job: %s (Content-Location %q)", r.Body, r.Header.Get("Content-Location"))
			}
		default:
			t.Fatalf("job status: %d %s", r.Status, r.Body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still pending after 120 s", status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outputParam is the job's output parameter of the name given.
func outputParam(t *testing.T, job map[string]any, name string) map[string]any {
	t.Helper()
	out, _ := job["output"].(map[string]any)
	params, _ := out["parameter"].([]any)
	for _, p := range params {
		if m := p.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("job output has no %q parameter: %s", name, mustJSON(job))
	return nil
}

// awaitActive waits until a runner has started a job (status active).
func awaitActive(t *testing.T, c *servertest.Client, status string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := c.Do("GET", status, nil, "")
		if r.Status == 202 && r.JSON()["status"] == "active" {
			return
		}
		if r.Status != 202 || time.Now().After(deadline) {
			t.Fatalf("job %s not running: %d %s", status, r.Status, r.Body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitMetric waits until a metric reaches want.
func awaitMetric(t *testing.T, s *servertest.Server, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for servertest.MetricValue(t, s.Registry, name) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v", name, servertest.MetricValue(t, s.Registry, name), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAsyncExecution(t *testing.T) {
	patientBot := readWasm(t, "../../../examples/fhir-patient/fhir-patient.wasm")
	testBots := readWasm(t, "../../../runtime/testdata/bots.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "async")
		pb := memberBot(t, c, "patients", patientBot)

		// The job runs the bot as the caller and completes with the bot's
		// result as responseBody, as the reference shapes it.
		status := submit(t, c, pb, map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Async-One"}}}, "application/fhir+json")
		job := awaitJob(t, c, status)
		if job["status"] != "completed" || !strings.HasSuffix(job["request"].(string), "/fhir/R4/Bot/"+pb+"/$execute") || job["transactionTime"] == nil {
			t.Fatalf("completed job: %s", mustJSON(job))
		}
		var created map[string]any
		if err := json.Unmarshal([]byte(outputParam(t, job, "responseBody")["valueString"].(string)), &created); err != nil || created["resourceType"] != "Patient" || created["id"] == nil {
			t.Errorf("responseBody: %v %v", created, err)
		}
		if n := countPatients(t, c, "Async-One"); n != 1 {
			t.Errorf("the job's Patient exists %d times", n)
		}
		// The job's id is its AsyncJob's; an admin reads it through the FHIR API too.
		jobID := strings.Split(status, "/")[3]
		if r := c.Do("GET", "fhir/R4/AsyncJob/"+jobID, nil, ""); r.Status != 200 || r.JSON()["status"] != "completed" {
			t.Errorf("AsyncJob read: %d %s", r.Status, r.Body)
		}
		// The execution is audited, with the submitter as requester.
		awaitAudit(t, c, "entity=Bot/"+pb+"&outcome=0", func(ev map[string]any) bool {
			agent, _ := ev["agent"].([]any)
			return len(agent) == 2 && servertest.Field(agent[0], "who", "reference") == c.Profile
		})

		// A bot's failure completes the job with the failure as its outcome;
		// a string result is responseBody's valueString.
		tb := deployBot(t, c, testBots, map[string]any{"timeout": 120})
		job = awaitJob(t, c, submit(t, c, tb, "trap", "text/plain"))
		if oo := outputParam(t, job, "outcome")["resource"].(map[string]any); job["status"] != "completed" || oo["resourceType"] != "OperationOutcome" ||
			servertest.Field(oo["issue"].([]any)[0], "code") != "invalid" {
			t.Errorf("failed execution: %s", mustJSON(job))
		}
		job = awaitJob(t, c, submit(t, c, tb, "anything", "text/plain"))
		if v := outputParam(t, job, "responseBody")["valueString"]; v != "unknown" {
			t.Errorf("string result: %v", v)
		}
		// A job that cannot be found is refused at once, as a synchronous
		// execution would be.
		if r := c.DoWith("POST", "fhir/R4/Bot/00000000-0000-4000-8000-000000000000/$execute", "x", "text/plain", respondAsync); r.Status != 404 {
			t.Errorf("async execution of a missing bot: %d %s", r.Status, r.Body)
		}

		// DELETE cancels a running execution: its context is canceled long
		// before the bot's 30 s deadline.
		status = submit(t, c, tb, "loop", "text/plain")
		awaitActive(t, c, status)
		// Active is written before the runner looks up the module: a cancel
		// in between ends the job before any execution, with no audit.
		// Wait for the execution itself (nothing else runs meanwhile).
		for deadline := time.Now().Add(30 * time.Second); servertest.MetricValue(t, servertest.RuntimeRegistry(), "sandbot_bot_executions_in_flight") < 1; {
			if time.Now().After(deadline) {
				t.Fatal("the job's execution never started")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if r := c.Do("DELETE", status, nil, ""); r.Status != 202 || r.JSON()["id"] != "accepted" {
			t.Fatalf("cancel: %d %s", r.Status, r.Body)
		}
		if job := awaitJob(t, c, status); job["status"] != "cancelled" || job["output"] != nil {
			t.Errorf("cancelled job: %s", mustJSON(job))
		}
		awaitMetric(t, s, "sandbot_jobs_running", 0)
		awaitAudit(t, c, "entity=Bot/"+tb+"&outcome=4", func(ev map[string]any) bool {
			return strings.Contains(fmt.Sprint(ev["outcomeDesc"]), "cancel")
		})
		// Cancelling again is no error; a completed job cannot be cancelled.
		if r := c.Do("DELETE", status, nil, ""); r.Status != 202 {
			t.Errorf("second cancel: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/AsyncJob/"+jobID+"/$cancel", nil, ""); r.Status != 400 || !strings.Contains(r.Issue(), "'completed'") {
			t.Errorf("cancel of a completed job: %d %s", r.Status, r.Body)
		}

		// Who reads a job: its submitter and the project's admins; not
		// another member (not even through /fhir/R4), nor another project.
		member := s.NewMember(t, c.ProjectID, "member", false)
		other := s.NewProject(t, "other")
		for who, cl := range map[string]*servertest.Client{"member": member, "other project": other} {
			if r := cl.Do("GET", "fhir/R4/job/"+jobID+"/status", nil, ""); r.Status != 404 {
				t.Errorf("%s reads the job: %d %s", who, r.Status, r.Body)
			}
			if r := cl.Do("DELETE", "fhir/R4/job/"+jobID+"/status", nil, ""); r.Status != 404 {
				t.Errorf("%s cancels the job: %d %s", who, r.Status, r.Body)
			}
		}
		if r := member.Do("GET", "fhir/R4/AsyncJob/"+jobID, nil, ""); r.Status != 403 {
			t.Errorf("member reads AsyncJob: %d %s", r.Status, r.Body)
		}
		mine := awaitJob(t, member, submit(t, member, tb, "anything", "text/plain"))
		if mine["status"] != "completed" {
			t.Errorf("member's own job: %s", mustJSON(mine))
		}
		if r := c.Do("GET", "fhir/R4/job/"+mine["id"].(string)+"/status", nil, ""); r.Status != 200 {
			t.Errorf("admin reads a member's job: %d %s", r.Status, r.Body)
		}
		// Nobody but the server writes an AsyncJob.
		if r := c.Do("PUT", "fhir/R4/AsyncJob/"+jobID, map[string]any{"resourceType": "AsyncJob", "id": jobID, "status": "completed",
			"request": "x", "requestTime": "2024-01-01T00:00:00Z"}, ""); r.Status != 403 {
			t.Errorf("admin writes an AsyncJob: %d %s", r.Status, r.Body)
		}
		if r := c.Do("GET", "fhir/R4/job/not-an-id!/status", nil, ""); r.Status != 404 {
			t.Errorf("bad job id: %d %s", r.Status, r.Body)
		}
	})
}

// TestAsyncExecutionQueue: with one worker, a queued job waits; a queued job
// cancelled never runs; a job whose submitter was revoked while it waited
// fails; the project's queue is bounded.
func TestAsyncExecutionQueue(t *testing.T) {
	patientBot := readWasm(t, "../../../examples/fhir-patient/fhir-patient.wasm")
	testBots := readWasm(t, "../../../runtime/testdata/bots.wasm")
	oneWorker := func(cfg *server.Config) { cfg.Limits.JobWorkers = 1; cfg.Limits.JobQueue = 4 }
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "queue")
		pb := memberBot(t, c, "patients", patientBot)
		tb := deployBot(t, c, testBots, map[string]any{"timeout": 60})
		member := s.NewMember(t, c.ProjectID, "member", false)

		blocker := submit(t, c, tb, "loop", "text/plain")
		awaitActive(t, c, blocker)
		cancelled := submit(t, c, pb, map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Never-Run"}}}, "application/fhir+json")
		revoked := submit(t, member, pb, map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Revoked-Caller"}}}, "application/fhir+json")
		waiting := submit(t, c, pb, map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Waited"}}}, "application/fhir+json")
		// Four jobs in the queue: the fifth is refused.
		if r := c.DoWith("POST", "fhir/R4/Bot/"+tb+"/$execute", "x", "text/plain", respondAsync); r.Status != 429 {
			t.Errorf("fifth job: %d %s", r.Status, r.Body)
		}
		if r := c.Do("GET", cancelled, nil, ""); r.Status != 202 || r.JSON()["status"] != "accepted" {
			t.Errorf("queued job: %d %s", r.Status, r.Body)
		}
		awaitActive(t, c, blocker)
		if r := c.Do("DELETE", cancelled, nil, ""); r.Status != 202 {
			t.Fatalf("cancel queued: %d %s", r.Status, r.Body)
		}
		// The member's client is deleted while its job waits.
		if r := c.Do("DELETE", "fhir/R4/ClientApplication/"+member.ClientID, nil, ""); r.Status != 200 {
			t.Fatalf("delete member client: %d %s", r.Status, r.Body)
		}
		if r := c.Do("DELETE", blocker, nil, ""); r.Status != 202 {
			t.Fatalf("cancel blocker: %d %s", r.Status, r.Body)
		}
		if job := awaitJob(t, c, waiting); job["status"] != "completed" {
			t.Errorf("waiting job: %s", mustJSON(job))
		}
		job := awaitJob(t, c, revoked)
		if oo := outputParam(t, job, "outcome")["resource"].(map[string]any); job["status"] != "error" || !strings.Contains(string(mustJSON(oo)), "no longer authorized") {
			t.Errorf("revoked caller's job: %s", mustJSON(job))
		}
		if job := awaitJob(t, c, cancelled); job["status"] != "cancelled" {
			t.Errorf("cancelled job: %s", mustJSON(job))
		}
		for family, want := range map[string]int{"Never-Run": 0, "Revoked-Caller": 0, "Waited": 1} {
			if n := countPatients(t, c, family); n != want {
				t.Errorf("%s: %d Patients, want %d", family, n, want)
			}
		}
	}, oneWorker)
}
