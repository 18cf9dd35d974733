package fhirapi_test

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/mllp"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/sdk/hl7"
	"github.com/sandbot/sandbot/store/storetest"
)

// hl7ObservationBot records a message as an Observation identified by its
// MSH-10, created only if none exists (a run repeated after a crash makes
// no second one).
const hl7ObservationBot = `exports.handler = async (medplum, event) => {
  const ctl = event.input.getSegment('MSH').getField(10).toString();
  await medplum.createResourceIfNoneExist({ resourceType: 'Observation', status: 'final', code: { text: 'hl7 kill test' },
    identifier: [{ system: 'https://sandbot.test/hl7', value: ctl }] }, 'identifier=https://sandbot.test/hl7|' + ctl);
  return event.input.buildAck();
};`

// TestHL7FeedSurvivesKill: the binary is killed with SIGKILL while a sender
// streams 1,000 messages; after a restart on the same store every message
// that was answered AA has been run by its bot, its Observation present
// once, and nothing beyond what was sent exists. Skipped with -short.
func TestHL7FeedSurvivesKill(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	bin := servertest.BuildBinary(t)
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dataDir, dbURL := servertest.ProcessStore(t, b)
			// First the project, its bot and its Agent; then the process
			// that listens for it.
			p := servertest.StartProcess(t, bin, dataDir, dbURL)
			su := p.SuperAdmin(t)
			r := su.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "Feed"}, "")
			if r.Status != 201 {
				t.Fatalf("project: %d %s", r.Status, r.Body)
			}
			pid := r.JSON()["id"].(string)
			r = su.Do("POST", "admin/projects/"+pid+"/bot", map[string]any{"name": "obs", "runtimeVersion": "vmcontext"}, "application/json")
			if r.Status != 201 {
				t.Fatalf("bot: %d %s", r.Status, r.Body)
			}
			bot := r.JSON()["id"].(string)
			r = su.Do("POST", "fhir/R4/Bot/"+bot+"/$deploy", map[string]any{"code": hl7ObservationBot, "filename": "obs.js"}, "")
			if r.Status == 400 && strings.Contains(r.Issue(), "make js") && os.Getenv("CI") == "" {
				t.Skip("JavaScript engine not fetched (make js)")
			}
			if r.Status != 200 {
				t.Fatalf("deploy: %d %s", r.Status, r.Body)
			}
			addr := servertest.FreeAddr(t)
			_, port, _ := net.SplitHostPort(addr)
			// The super admin writes in the project through its
			// X-Medplum-Project-free path: create with meta.project.
			ep := su.Do("POST", "fhir/R4/Endpoint", map[string]any{"resourceType": "Endpoint", "status": "active", "address": "mllp://0.0.0.0:" + port,
				"meta": map[string]any{"project": pid}, "connectionType": map[string]any{"code": "hl7-mllp"}, "payloadType": []any{map[string]any{"text": "HL7"}}}, "application/fhir+json")
			if ep.Status != 201 {
				t.Fatalf("endpoint: %d %s", ep.Status, ep.Body)
			}
			ag := su.Do("POST", "fhir/R4/Agent", map[string]any{"resourceType": "Agent", "name": "feed", "status": "active", "meta": map[string]any{"project": pid},
				"channel": []any{map[string]any{"name": "adt", "endpoint": map[string]any{"reference": "Endpoint/" + ep.JSON()["id"].(string)},
					"targetReference": map[string]any{"reference": "Bot/" + bot},
					"extension":       []any{map[string]any{"url": "https://sandbot.dev/fhir/StructureDefinition/hl7-partition-key", "valueString": "PID-3.1"}}}}}, "application/fhir+json")
			if ag.Status != 201 {
				t.Fatalf("agent: %d %s", ag.Status, ag.Body)
			}
			p.Kill()
			env := []string{"SANDBOT_MLLP_ADDRS=" + addr + "=" + pid, "SANDBOT_JOB_RESCUE_SECONDS=10"}
			p = servertest.StartProcess(t, bin, dataDir, dbURL, env...)

			const total = 1000
			var acked []string
			var sent atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				rd := mllp.NewReader(c, 1<<20)
				for i := range total {
					ctl := fmt.Sprintf("K%04d", i)
					sent.Add(1)
					if _, err := c.Write(mllp.Frame(adt(ctl, fmt.Sprintf("PAT%d", i%10)))); err != nil {
						return
					}
					c.SetReadDeadline(time.Now().Add(20 * time.Second))
					b, err := rd.ReadFrame()
					if err != nil {
						return // killed
					}
					m, err := hl7.Parse(b)
					if err != nil || m.Value("MSA-2") != ctl {
						t.Errorf("ACK of %s: %q %v", ctl, b, err)
						return
					}
					if m.Value("MSA-1") != "AA" {
						t.Errorf("ACK of %s: %s", ctl, m.Value("MSA-1"))
						return
					}
					acked = append(acked, ctl)
				}
			}()
			// Kill once a few hundred were acknowledged.
			for deadline := time.Now().Add(60 * time.Second); sent.Load() < 400 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			p.Kill()
			<-done
			if len(acked) < 300 || len(acked) >= total {
				t.Fatalf("%d acknowledged before the kill", len(acked))
			}
			p = servertest.StartProcess(t, bin, dataDir, dbURL, env...)
			su = p.SuperAdmin(t)
			count := func() int {
				res := su.Do("GET", "fhir/R4/Observation?identifier=https://sandbot.test/hl7|&_count=0&_total=accurate", nil, "").JSON()
				n, _ := res["total"].(float64)
				return int(n)
			}
			for deadline := time.Now().Add(120 * time.Second); count() < len(acked) && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond)
			}
			time.Sleep(time.Second)
			if n := count(); n < len(acked) || n > int(sent.Load()) {
				r := su.Do("GET", "fhir/R4/Observation?_count=2", nil, "")
				t.Logf("observations: %s\nlog: %s", r.Body, p.Output.String()[max(0, len(p.Output.String())-3000):])
				t.Fatalf("%d Observations; %d messages acknowledged, %d sent", n, len(acked), sent.Load())
			}
			for _, ctl := range acked {
				res := su.Do("GET", "fhir/R4/Observation?identifier=https://sandbot.test/hl7|"+ctl+"&_count=0&_total=accurate", nil, "").JSON()
				if n, _ := res["total"].(float64); n != 1 {
					t.Errorf("%s acknowledged, its Observation exists %v times", ctl, res["total"])
				}
			}
			t.Logf("%d messages acknowledged before the kill, all run after the restart", len(acked))
		})
	}
}
