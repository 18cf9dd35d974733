package fhirapi_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/internal/mllp"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/hl7feed"
	"github.com/sandbot/sandbot/store/storetest"
)

// hl7AckBot answers each message with an ACK of its own (MSH-3 BOT, MSA-3
// "handled by the bot") after recording it, except: FAIL… throws, SLOW…
// spins past its timeout, TEXT… answers something that is not HL7, OBJ…
// answers the Hl7Message of buildAck().
const hl7AckBot = `exports.handler = async (medplum, event) => {
  const m = event.input;
  const ctl = m.getSegment('MSH').getField(10).toString();
  if (ctl.startsWith('FAIL')) throw new Error('cannot handle ' + ctl);
  if (ctl.startsWith('SLOW')) { const end = Date.now() + 5000; while (Date.now() < end) {} }
  if (ctl.startsWith('TEXT')) return 'not an ack';
  await medplum.createResource({ resourceType: 'Basic', code: { text: ctl } });
  if (ctl.startsWith('OBJ')) return m.buildAck();
  return 'MSH|^~\\&|BOT|FAC|S|F|20250101||ACK|' + ctl + '-ACK|P|2.5\rMSA|AA|' + ctl + '|handled by the bot';
};`

func ackModeExt(mode string) []any {
	return []any{map[string]any{"url": hl7feed.AckModeExtension, "valueCode": mode}}
}

// TestHL7FeedApplicationMode: a channel in application mode answers each
// message with the ACK its bot returned (an HL7 string, or an Hl7Message);
// AE when the bot throws, when it runs past its timeout, or when its answer
// is not HL7, and the connection goes on; a message that failed is sent
// again as a new one (the bot runs again), while a resend of one that was
// handled is a duplicate (the bot's ACK again, not run again). An unknown
// mode is AE.
func TestHL7FeedApplicationMode(t *testing.T) {
	// Slow (sockets, bots that time out) and independent.
	t.Parallel()
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedWith(t, s, project, map[string]any{"name": "hl7-ack", "runtimeVersion": "vmcontext", "timeout": 2},
			hl7AckBot, ackModeExt(hl7feed.AckApplication))
		c := dialMLLP(t, f.addr)
		code, ctl, ack := c.send(mllp.Frame(adt("APP1", "P1")))
		if code != "AA" || ctl != "APP1" || ack.Value("MSH-3") != "BOT" || ack.Value("MSA-3") != "handled by the bot" {
			t.Fatalf("APP1: %s %s %q", code, ctl, ack.Bytes())
		}
		if code, ctl, ack := c.send(mllp.Frame(adt("OBJ1", "P1"))); code != "AA" || ctl != "OBJ1" {
			t.Fatalf("OBJ1 (buildAck): %s %s %q", code, ctl, ack.Bytes())
		}
		if code, ctl, ack := c.send(mllp.Frame(adt("FAIL1", "P1"))); code != "AE" || ctl != "FAIL1" || !strings.Contains(ack.Value("MSA-3"), "bot failed") {
			t.Fatalf("FAIL1: %s %s %q", code, ctl, ack.Bytes())
		}
		if code, _, ack := c.send(mllp.Frame(adt("SLOW1", "P1"))); code != "AE" {
			t.Fatalf("SLOW1: %s %q", code, ack.Bytes())
		}
		if code, _, ack := c.send(mllp.Frame(adt("TEXT1", "P1"))); code != "AE" || !strings.Contains(ack.Value("MSA-3"), "not an HL7 message") {
			t.Fatalf("TEXT1: %s %q", code, ack.Bytes())
		}
		// The failed message sent again runs again (and fails again); the
		// handled one sent again is a duplicate: the bot's ACK, not run.
		if code, _, _ := c.send(mllp.Frame(adt("FAIL1", "P1"))); code != "AE" {
			t.Fatalf("FAIL1 again: %s", code)
		}
		if code, ctl, ack := c.send(mllp.Frame(adt("APP1", "P1"))); code != "AA" || ctl != "APP1" || ack.Value("MSA-3") != "handled by the bot" {
			t.Fatalf("APP1 again: %s %s %q", code, ctl, ack.Bytes())
		}
		if code, ctl, ack := c.send(mllp.Frame(adt("APP2", "P2"))); code != "AA" || ctl != "APP2" || ack.Value("MSA-3") != "handled by the bot" {
			t.Fatalf("APP2: %s %s %q", code, ctl, ack.Bytes())
		}
		// Enhanced mode (MSH-15): the commit ACK once the message is kept,
		// then the bot's.
		enhanced := []byte("MSH|^~\\&|S|F|R|F|20250101||ADT^A08|ENH1|P|2.5|||AL|AL\rPID|1||E1^^^MRN\r")
		if code, ctl, _ := c.send(mllp.Frame(enhanced)); code != "CA" || ctl != "ENH1" {
			t.Fatalf("ENH1 commit ACK: %s %s", code, ctl)
		}
		if code, ctl, ack := c.readAck(); code != "AA" || ctl != "ENH1" || ack.Value("MSA-3") != "handled by the bot" {
			t.Fatalf("ENH1 application ACK: %s %s %q", code, ctl, ack.Bytes())
		}
		time.Sleep(300 * time.Millisecond)
		if got := recorded(t, f.c, 4); strings.Join(got, ",") != "APP1,OBJ1,APP2,ENH1" {
			t.Fatalf("the bot recorded %q", got)
		}
		// FAIL1's two runs and SLOW1's failed, each with an AuditEvent, and
		// none was tried again (a retry would come a second later).
		agent := agentOf(t, f)
		failedRuns := func() int {
			events := f.c.Do("GET", "fhir/R4/AuditEvent?entity=Agent/"+agent+"&outcome=4&_count=50", nil, "").JSON()
			entries, _ := events["entry"].([]any)
			return len(entries)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && failedRuns() < 3; time.Sleep(50 * time.Millisecond) {
		}
		time.Sleep(2 * time.Second)
		if n := failedRuns(); n != 3 {
			t.Errorf("%d failed runs, want 3 (FAIL1 twice, SLOW1, none tried again)", n)
		}
		// Their senders were answered AE: they are not failed messages to
		// run again.
		if listed, _ := f.c.Do("GET", "fhir/R4/AsyncJob?type=hl7-message", nil, "").JSON()["entry"].([]any); len(listed) != 0 {
			t.Errorf("%d failed messages written, want none", len(listed))
		}
		// An unknown mode: AE, naming it.
		r := f.c.Do("GET", "fhir/R4/Agent/"+agent, nil, "").JSON()
		servertest.Field(r, "channel").([]any)[0].(map[string]any)["extension"] = ackModeExt("sometimes")
		if put := f.c.Do("PUT", "fhir/R4/Agent/"+agent, r, "application/fhir+json"); put.Status != 200 {
			t.Fatalf("PUT Agent: %d %s", put.Status, put.Body)
		}
		time.Sleep(2100 * time.Millisecond) // the channel is read again after 2 s
		if code, _, ack := c.send(mllp.Frame(adt("MODE1", "P1"))); code != "AE" || !strings.Contains(ack.Value("MSA-3"), "sometimes") {
			t.Fatalf("unknown mode: %s %q", code, ack.Bytes())
		}
	}, mllpOptions(project, nil))
}

// TestHL7FeedFailedMessagesRerun: a message whose bot failed for good is an
// AsyncJob (type hl7-message, status error) that the project's admins list
// with a search and run again with $rerun: 403 for a member, 404 for
// another project's admin, 409 while it runs again; once the bot is fixed
// the run again succeeds and the AsyncJob is completed.
func TestHL7FeedFailedMessagesRerun(t *testing.T) {
	// Slow (a failing bot's retries take about 7 s) and independent.
	t.Parallel()
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedWith(t, s, project, map[string]any{"name": "hl7-ack", "runtimeVersion": "vmcontext"}, hl7AckBot, nil)
		c := dialMLLP(t, f.addr)
		if code, _, _ := c.send(mllp.Frame(adt("FAIL1", "P1"))); code != "AA" {
			t.Fatalf("FAIL1: %s", code)
		}
		if code, _, _ := c.send(mllp.Frame(adt("OK1", "P1"))); code != "AA" {
			t.Fatalf("OK1: %s", code)
		}
		var entries []any
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && len(entries) == 0; time.Sleep(100 * time.Millisecond) {
			entries, _ = f.c.Do("GET", "fhir/R4/AsyncJob?type=hl7-message&status=error", nil, "").JSON()["entry"].([]any)
		}
		if len(entries) != 1 {
			t.Fatalf("%d failed messages listed", len(entries))
		}
		job := servertest.Field(entries[0], "resource").(map[string]any)
		id := job["id"].(string)
		params := map[string]any{}
		for _, p := range servertest.Field(job, "output", "parameter").([]any) {
			m := p.(map[string]any)
			for k, v := range m {
				if strings.HasPrefix(k, "value") {
					params[m["name"].(string)] = v
				}
			}
		}
		if params["controlId"] != "FAIL1" || !strings.HasPrefix(params["message"].(string), "MSH|") || params["attempts"] != float64(4) ||
			servertest.Field(params["bot"], "reference") != "Bot/"+f.bot || !strings.Contains(params["error"].(string), "failed") {
			t.Fatalf("the failed message: %v", params)
		}
		// Members neither list nor run it again; another project's admin
		// does not see it.
		member := s.NewMember(t, project, "member", false)
		if r := member.Do("POST", "fhir/R4/AsyncJob/"+id+"/$rerun", nil, ""); r.Status != 403 {
			t.Fatalf("member $rerun: %d %s", r.Status, r.Body)
		}
		if r := member.Do("GET", "fhir/R4/AsyncJob?type=hl7-message", nil, ""); r.Status != 403 {
			if listed, _ := r.JSON()["entry"].([]any); len(listed) != 0 {
				t.Fatalf("member search: %d %s", r.Status, r.Body)
			}
		}
		other := s.NewProject(t, "other")
		if r := other.Do("POST", "fhir/R4/AsyncJob/"+id+"/$rerun", nil, ""); r.Status != 404 {
			t.Fatalf("other project's $rerun: %d %s", r.Status, r.Body)
		}
		if r := f.c.Do("POST", "fhir/R4/AsyncJob/not-an-id!/$rerun", nil, ""); r.Status != 404 {
			t.Fatalf("$rerun of a bad id: %d %s", r.Status, r.Body)
		}
		// Fixed, and run again: accepted, then completed, and recorded.
		deployJSCode(t, f.c, f.bot, "hl7-ack", strings.Replace(hl7AckBot, "ctl.startsWith('FAIL')", "false", 1))
		r := f.c.Do("POST", "fhir/R4/AsyncJob/"+id+"/$rerun", nil, "")
		if r.Status != 202 || r.JSON()["status"] != "accepted" {
			t.Fatalf("$rerun: %d %s", r.Status, r.Body)
		}
		if r := f.c.Do("POST", "fhir/R4/AsyncJob/"+id+"/$rerun", nil, ""); r.Status != 409 {
			t.Fatalf("$rerun again: %d %s", r.Status, r.Body)
		}
		if got := recorded(t, f.c, 2); strings.Join(got, ",") != "OK1,FAIL1" {
			t.Fatalf("recorded %q", got)
		}
		var status any
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && status != "completed"; time.Sleep(50 * time.Millisecond) {
			status = f.c.Do("GET", "fhir/R4/AsyncJob/"+id, nil, "").JSON()["status"]
		}
		if status != "completed" {
			t.Fatalf("the failed message run again is %v", status)
		}
		if r := f.c.Do("POST", "fhir/R4/AsyncJob/"+id+"/$rerun", nil, ""); r.Status != 409 {
			t.Fatalf("$rerun of a completed message: %d %s", r.Status, r.Body)
		}
		if entries, _ := f.c.Do("GET", "fhir/R4/AsyncJob?type=hl7-message&status=error", nil, "").JSON()["entry"].([]any); len(entries) != 0 {
			t.Fatalf("%d failed messages still listed", len(entries))
		}
	}, mllpOptions(project, nil))
}

// TestHL7FeedWithMedplumCLI: `medplum hl7 send` of the pinned @medplum/cli
// (the reference's command line, unchanged) sends the ADT^A01 of the corpus
// to a channel in application mode and prints the bot's own ACK. Skipped
// without node and compat's node_modules (make compat installs them),
// unless CI is set.
func TestHL7FeedWithMedplumCLI(t *testing.T) {
	t.Parallel()
	cli := "../../../compat/node_modules/@medplum/cli/dist/cjs/index.cjs"
	if _, err := os.Stat(cli); err != nil && os.Getenv("CI") == "" {
		t.Skip("compat/node_modules not installed (cd compat && npm ci)")
	}
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedWith(t, s, project, map[string]any{"name": "hl7-ack", "runtimeVersion": "vmcontext"},
			hl7AckBot, ackModeExt(hl7feed.AckApplication))
		host, port, _ := net.SplitHostPort(f.addr)
		cmd := exec.Command("node", cli, "hl7", "send", host, port, "--file", "testdata/hl7/ADT-A01-01.hl7")
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "MSA|AA|MSG00001|handled by the bot") {
			t.Fatalf("medplum hl7 send: %v\n%s", err, out)
		}
		// Enhanced mode: the CLI's client skips the commit ACK (CA) and
		// prints the bot's.
		enhanced := filepath.Join(t.TempDir(), "enhanced.hl7")
		os.WriteFile(enhanced, []byte("MSH|^~\\&|S|F|R|F|20250101||ADT^A08|ENH1|P|2.5|||AL|AL\rPID|1||E1^^^MRN\r"), 0o644)
		cmd = exec.Command("node", cli, "hl7", "send", host, port, "--file", enhanced)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err = cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "MSA|AA|ENH1|handled by the bot") {
			t.Fatalf("medplum hl7 send (enhanced): %v\n%s", err, out)
		}
		if got := recorded(t, f.c, 2); len(got) != 2 || got[0] != "MSG00001" || got[1] != "ENH1" {
			t.Fatalf("the bot recorded %q", got)
		}
	}, mllpOptions(project, nil))
}

// TestHL7FeedApplicationModeAcrossReplicas: the replica that holds the
// connection runs no jobs; another replica on the same database runs the
// message's bot, and the first sends the bot's ACK, read from the task's
// recorded output. A message whose wait ended before any replica ran it
// (AE: kept) and whose bot then failed stays a failed message to run
// again; one whose failure was answered AE does not. A message whose wait
// ended before it ran, sent again, gets the bot's ACK once it has run on
// the other replica.
func TestHL7FeedApplicationModeAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			project := uuid.NewString()
			url := b.NewURL(t)
			front := servertest.StartURL(t, b.Name, url, mllpOptions(project, nil))
			front.StopJobs(context.Background())
			f := newFeedWith(t, front, project, map[string]any{"name": "hl7-ack", "runtimeVersion": "vmcontext", "timeout": 1},
				hl7AckBot, ackModeExt(hl7feed.AckApplication))
			c := dialMLLP(t, f.addr)
			// No replica runs jobs yet: the wait (1 s and 1 s to start) ends.
			if code, _, ack := c.send(mllp.Frame(adt("FAIL2", "P1"))); code != "AE" || !strings.Contains(ack.Value("MSA-3"), "kept") {
				t.Fatalf("FAIL2: %s %q", code, ack.Bytes())
			}
			if code, _, ack := c.send(mllp.Frame(adt("REP0", "P1"))); code != "AE" || !strings.Contains(ack.Value("MSA-3"), "kept") {
				t.Fatalf("REP0: %s %q", code, ack.Bytes())
			}
			runner := servertest.StartURL(t, b.Name, url, mllpOptions(project, nil))
			if code, ctl, ack := c.send(mllp.Frame(adt("REP0", "P1"))); code != "AA" || ctl != "REP0" || ack.Value("MSA-3") != "handled by the bot" {
				t.Fatalf("REP0 again: %s %s %q", code, ctl, ack.Bytes())
			}
			code, ctl, ack := c.send(mllp.Frame(adt("REP1", "P1")))
			if code != "AA" || ctl != "REP1" || ack.Value("MSA-3") != "handled by the bot" {
				t.Fatalf("REP1: %s %s %q", code, ctl, ack.Bytes())
			}
			if code, _, ack := c.send(mllp.Frame(adt("FAIL1", "P1"))); code != "AE" || !strings.Contains(ack.Value("MSA-3"), "bot failed") {
				t.Fatalf("FAIL1: %s %q", code, ack.Bytes())
			}
			runs := func(s *servertest.Server) (n float64) {
				for _, m := range gatherMetric(t, s, "sandbot_mllp_bot_runs_total") {
					n += m.GetCounter().GetValue()
				}
				return n
			}
			if r, f := runs(runner), runs(front); r != 4 || f != 0 {
				t.Errorf("bot runs: %v on the other replica, %v on the one with the connection; want 4 and 0", r, f)
			}
			// FAIL1's record is deleted once its AE is written.
			var listed []string
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				entries, _ := f.c.Do("GET", "fhir/R4/AsyncJob?type=hl7-message&status=error", nil, "").JSON()["entry"].([]any)
				listed = nil
				for _, e := range entries {
					for _, p := range servertest.Field(e, "resource", "output", "parameter").([]any) {
						if servertest.Field(p, "name") == "controlId" {
							listed = append(listed, servertest.Field(p, "valueString").(string))
						}
					}
				}
				if strings.Join(listed, ",") == "FAIL2" {
					break
				}
			}
			if strings.Join(listed, ",") != "FAIL2" {
				t.Errorf("failed messages listed: %q, want FAIL2 only", listed)
			}
			// FAIL2 sent again: its sender hears of the failure now (AE, send
			// again), so it is no longer a failed message to run again; sent
			// once more, it is a new message and runs (and fails) again.
			if code, _, ack := c.send(mllp.Frame(adt("FAIL2", "P1"))); code != "AE" || !strings.Contains(ack.Value("MSA-3"), "bot failed") {
				t.Fatalf("FAIL2 again: %s %q", code, ack.Bytes())
			}
			// (Deleted once the AE is written.)
			failed := -1
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && failed != 0; time.Sleep(50 * time.Millisecond) {
				entries, _ := f.c.Do("GET", "fhir/R4/AsyncJob?type=hl7-message&status=error", nil, "").JSON()["entry"].([]any)
				failed = len(entries)
			}
			if failed != 0 {
				t.Errorf("%d failed messages listed after FAIL2's resend was answered", failed)
			}
			if code, _, ack := c.send(mllp.Frame(adt("FAIL2", "P1"))); code != "AE" || !strings.Contains(ack.Value("MSA-3"), "bot failed") {
				t.Fatalf("FAIL2 once more: %s %q", code, ack.Bytes())
			}
			if r := runs(runner); r != 5 {
				t.Errorf("bot runs on the other replica: %v, want 5 (FAIL2's third sending ran)", r)
			}
		})
	}
}
