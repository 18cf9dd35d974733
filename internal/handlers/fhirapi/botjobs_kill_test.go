package fhirapi_test

// Asynchronous executions survive a crash: the sandbot binary runs one job
// at a time of a slow JavaScript bot that, at its end, creates an
// Observation tagged with its input; it is killed with SIGKILL just as the
// second job starts; a new process on the same store runs the rest. Every
// job completes, and each Observation exists exactly once: the job that was
// running at the kill had not reached its write and ran again from the
// start, the others ran once. Skipped with -short.

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

const slowCreateBot = `exports.handler = async (medplum, event) => {
  await new Promise((resolve) => setTimeout(resolve, event.input.ms));
  const obs = await medplum.createResource({
    resourceType: 'Observation',
    status: 'final',
    code: { text: 'kill test' },
    identifier: [{ system: 'https://sandbot.test/kill', value: event.input.tag }],
  });
  return { tag: event.input.tag, observation: obs.id };
};`

func TestAsyncJobsSurviveKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	bin := servertest.BuildBinary(t)
	// One worker, so that the test knows which job runs when; a short rescue time,
	// so that the job the dead process held is run again soon.
	env := []string{"SANDBOT_JOB_WORKERS=1", "SANDBOT_JOB_RESCUE_SECONDS=3"}
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dataDir, dbURL := servertest.ProcessStore(t, b)
			p := servertest.StartProcess(t, bin, dataDir, dbURL, env...)
			su := p.SuperAdmin(t)
			r := su.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "Jobs"}, "")
			if r.Status != 201 {
				t.Fatalf("project: %d %s", r.Status, r.Body)
			}
			pid := r.JSON()["id"].(string)
			r = su.Do("POST", "admin/projects/"+pid+"/bot", map[string]any{"name": "slow", "runtimeVersion": "vmcontext"}, "application/json")
			if r.Status != 201 {
				t.Fatalf("bot: %d %s", r.Status, r.Body)
			}
			bot := r.JSON()["id"].(string)
			r = su.Do("POST", "fhir/R4/Bot/"+bot+"/$deploy", map[string]any{"code": slowCreateBot, "filename": "slow.js"}, "")
			if r.Status == 400 && strings.Contains(r.Issue(), "make js") && os.Getenv("CI") == "" {
				t.Skip("JavaScript engine not fetched (make js)")
			}
			if r.Status != 200 {
				t.Fatalf("deploy: %d %s", r.Status, r.Body)
			}

			const jobs = 5
			var status [jobs]string
			for i := range status {
				status[i] = submit(t, su, bot, map[string]any{"tag": fmt.Sprintf("job-%d", i), "ms": 1500}, "application/json")
			}
			// The second job starts once the first has completed: kill the
			// server then, 1.5 s before that job would write anything.
			awaitActive(t, su, status[1])
			p.Kill()
			killed := time.Now()
			p = servertest.StartProcess(t, bin, dataDir, dbURL, env...)
			su = p.SuperAdmin(t)
			for i, st := range status {
				job := awaitJob(t, su, st)
				var out map[string]any
				if job["status"] != "completed" || json.Unmarshal([]byte(outputParam(t, job, "responseBody")["valueString"].(string)), &out) != nil ||
					out["tag"] != fmt.Sprintf("job-%d", i) {
					t.Errorf("job %d: %s", i, mustJSON(job))
				}
				// The outcome was written once, by the last claim.
				id := strings.Split(st, "/")[3]
				versions := su.Do("GET", "fhir/R4/AsyncJob/"+id+"/_history", nil, "").JSON()
				completed := 0
				entries, _ := versions["entry"].([]any)
				for _, e := range entries {
					if servertest.Field(e, "resource", "status") == "completed" {
						completed++
					}
				}
				if completed != 1 {
					t.Errorf("job %d: %d completed versions", i, completed)
				}
				// The first job ended before the kill; the others, the one
				// that was running included, after it.
				done, err := time.Parse(time.RFC3339, job["transactionTime"].(string))
				if err != nil || (i == 0) != done.Before(killed) {
					t.Errorf("job %d ended at %v, the kill was at %v", i, job["transactionTime"], killed.UTC())
				}
			}
			for i := 0; i < jobs; i++ {
				found := su.Do("GET", fmt.Sprintf("fhir/R4/Observation?identifier=https://sandbot.test/kill|job-%d&_total=accurate", i), nil, "").JSON()
				if n, _ := found["total"].(float64); n != 1 {
					t.Errorf("job-%d's Observation exists %v times", i, found["total"])
				}
			}
		})
	}
}
