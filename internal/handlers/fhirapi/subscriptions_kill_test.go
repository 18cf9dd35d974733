package fhirapi_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// slowRecorderBot waits, then records the Patient it was given as an
// Observation whose identifier is the Patient's id.
const slowRecorderBot = `exports.handler = async (medplum, event) => {
  await new Promise((resolve) => setTimeout(resolve, 1500));
  await medplum.createResource({
    resourceType: 'Observation', status: 'final', code: { text: 'delivered' },
    identifier: [{ system: 'https://sandbot.test/delivered', value: event.input.id }],
  });
  return { ok: true };
};`

// TestSubscriptionDeliveriesSurviveKill: writes answered 201 are delivered
// even when the server is killed with SIGKILL right after them, with the
// first delivery running and the others queued: a new process on the same
// store delivers each once. (Delivery is at least once: a bot killed after
// its own write would run again; here the kill comes before any write.)
func TestSubscriptionDeliveriesSurviveKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	bin := servertest.BuildBinary(t)
	env := []string{"SANDBOT_JOB_WORKERS=1", "SANDBOT_JOB_RESCUE_SECONDS=3"}
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dataDir, dbURL := servertest.ProcessStore(t, b)
			p := servertest.StartProcess(t, bin, dataDir, dbURL, env...)
			su := p.SuperAdmin(t)
			r := su.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "Deliveries"}, "")
			if r.Status != 201 {
				t.Fatalf("project: %d %s", r.Status, r.Body)
			}
			pid := r.JSON()["id"].(string)
			r = su.Do("POST", "admin/projects/"+pid+"/bot", map[string]any{"name": "slow", "runtimeVersion": "vmcontext"}, "application/json")
			if r.Status != 201 {
				t.Fatalf("bot: %d %s", r.Status, r.Body)
			}
			bot := r.JSON()["id"].(string)
			r = su.Do("POST", "fhir/R4/Bot/"+bot+"/$deploy", map[string]any{"code": slowRecorderBot, "filename": "slow.js"}, "")
			if r.Status == 400 && strings.Contains(r.Issue(), "make js") && os.Getenv("CI") == "" {
				t.Skip("JavaScript engine not fetched (make js)")
			}
			if r.Status != 200 {
				t.Fatalf("deploy: %d %s", r.Status, r.Body)
			}
			// A member of the project (a ClientApplication) wires the bot
			// and writes the Patients.
			r = su.Do("POST", "admin/projects/"+pid+"/client", map[string]any{"name": "writer"}, "application/json")
			if r.Status != 201 {
				t.Fatalf("client: %d %s", r.Status, r.Body)
			}
			app := r.JSON()
			member := servertest.NewClient(t, p.Base, servertest.ClientToken(t, p.Base, app["id"].(string), app["secret"].(string)))
			if r := member.Do("POST", "fhir/R4/Subscription", subscription(bot, "Patient"), "application/fhir+json"); r.Status != 201 {
				t.Fatalf("subscription: %d %s", r.Status, r.Body)
			}
			var patients []string
			for i := 0; i < 3; i++ {
				r := member.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient"}, "application/fhir+json")
				if r.Status != 201 {
					t.Fatalf("patient: %d %s", r.Status, r.Body)
				}
				patients = append(patients, r.JSON()["id"].(string))
			}
			p.Kill()
			p = servertest.StartProcess(t, bin, dataDir, dbURL, env...)
			su = p.SuperAdmin(t)
			for _, id := range patients {
				q := fmt.Sprintf("fhir/R4/Observation?identifier=https://sandbot.test/delivered|%s&_total=accurate", id)
				n := awaitTotal(t, su, q, 1)
				if n != 1 {
					t.Errorf("Patient/%s delivered %d times, want once", id, n)
				}
			}
		})
	}
}

// awaitTotal polls a search until its total reaches want (or 30 s), then
// waits a moment more for any surplus, and answers the total.
func awaitTotal(t *testing.T, c *servertest.Client, query string, want int) int {
	t.Helper()
	total := func() int {
		n, _ := c.Do("GET", query, nil, "").JSON()["total"].(float64)
		return int(n)
	}
	for range 300 {
		if total() >= want {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	return total()
}
