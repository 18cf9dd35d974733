package fhirapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/mllp"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/hl7feed"
	"github.com/sandbot/sandbot/store"
)

// TestHL7FeedApplicationModeResend: on a channel in application mode, a
// message sent again within the deduplication window gets the ACK its
// first sending got, the bot's, byte for byte, and the bot does not run
// again: after the first run ended, even once the job engine has deleted
// its task (the ACK is kept with the window); while the first is still
// running (the resend waits for it); the same AE when the bot's answer was
// not HL7; and in enhanced mode, CA then the bot's ACK again.
func TestHL7FeedApplicationModeResend(t *testing.T) {
	// Slow (sockets, a bot that takes 1.5 s) and independent.
	t.Parallel()
	project := uuid.NewString()
	// LAG… takes 1.5 s before it answers.
	bot := strings.Replace(hl7AckBot, "  if (ctl.startsWith('TEXT'))",
		"  if (ctl.startsWith('LAG')) { const end = Date.now() + 1500; while (Date.now() < end) {} }\n  if (ctl.startsWith('TEXT'))", 1)
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedWith(t, s, project, map[string]any{"name": "hl7-ack", "runtimeVersion": "vmcontext", "timeout": 5},
			bot, ackModeExt(hl7feed.AckApplication))
		c := dialMLLP(t, f.addr)
		code, _, first := c.send(mllp.Frame(adt("APP1", "P1")))
		if code != "AA" || first.Value("MSH-10") != "APP1-ACK" || first.Value("MSA-3") != "handled by the bot" {
			t.Fatalf("APP1: %s %q", code, first.Bytes())
		}
		// The job engine deletes a completed task after an hour; here at
		// once.
		deleted := int64(0)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && deleted == 0; time.Sleep(20 * time.Millisecond) {
			r, err := s.Store.DB().ExecContext(context.Background(), `DELETE FROM river_job WHERE kind = 'hl7-message' AND state = 'completed'`)
			if err != nil {
				t.Fatal(err)
			}
			deleted, _ = r.RowsAffected()
		}
		if deleted != 1 {
			t.Fatalf("APP1's task was not completed")
		}
		if _, _, again := c.send(mllp.Frame(adt("APP1", "P1"))); string(again.Bytes()) != string(first.Bytes()) {
			t.Fatalf("APP1 again: %q, the first time %q", again.Bytes(), first.Bytes())
		}
		// Not HL7: the same AE.
		code, _, text := c.send(mllp.Frame(adt("TEXT1", "P1")))
		if code != "AE" || !strings.Contains(text.Value("MSA-3"), "not an HL7 message") {
			t.Fatalf("TEXT1: %s %q", code, text.Bytes())
		}
		if code, _, again := c.send(mllp.Frame(adt("TEXT1", "P1"))); code != "AE" || again.Value("MSA-3") != text.Value("MSA-3") {
			t.Fatalf("TEXT1 again: %s %q", code, again.Bytes())
		}
		// Sent again on another connection while its bot runs: the resend
		// waits for that run's ACK.
		c2 := dialMLLP(t, f.addr)
		c.Write(mllp.Frame(adt("LAG1", "P1")))
		time.Sleep(300 * time.Millisecond)
		c2.Write(mllp.Frame(adt("LAG1", "P1")))
		_, _, lag1 := c.readAck()
		_, _, lag2 := c2.readAck()
		if lag1.Value("MSA-3") != "handled by the bot" || string(lag2.Bytes()) != string(lag1.Bytes()) {
			t.Fatalf("LAG1: %q, and sent again meanwhile: %q", lag1.Bytes(), lag2.Bytes())
		}
		// Enhanced mode: CA, then the bot's ACK, both times.
		enhanced := []byte("MSH|^~\\&|S|F|R|F|20250101||ADT^A08|ENH1|P|2.5|||AL|AL\rPID|1||E1^^^MRN\r")
		var enh [2][]byte
		for i := range enh {
			if code, ctl, _ := c.send(mllp.Frame(enhanced)); code != "CA" || ctl != "ENH1" {
				t.Fatalf("ENH1 (%d) commit ACK: %s %s", i, code, ctl)
			}
			_, _, ack := c.readAck()
			enh[i] = ack.Bytes()
		}
		if !strings.Contains(string(enh[0]), "MSA|AA|ENH1|handled by the bot") || string(enh[1]) != string(enh[0]) {
			t.Fatalf("ENH1's application ACKs: %q, then %q", enh[0], enh[1])
		}
		recorded(t, f.c, 3)
		time.Sleep(300 * time.Millisecond)
		if got := recorded(t, f.c, 3); strings.Join(got, ",") != "APP1,LAG1,ENH1" {
			t.Fatalf("the bot recorded %q", got)
		}
		if v := servertest.MetricValue(t, s.Registry, "sandbot_mllp_duplicates_total"); v != 4 {
			t.Errorf("duplicates metric %v, want 4", v)
		}
	}, mllpOptions(project, nil))
}

// TestHL7FeedManyAgents: the Agent whose channel names the listener's port
// is found among more Agents than a page of the lookup (1,000), and after
// the first 100 in any order.
func TestHL7FeedManyAgents(t *testing.T) {
	t.Parallel()
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedFor(t, s, project, "")
		// 1,001 Agents before the feed's in the order of ids ("0-…" sorts
		// before any UUID) and of lastUpdated (the feed's is written again
		// after them).
		var others []fhir.Resource
		for i := range 1001 {
			others = append(others, fhir.Resource{"resourceType": "Agent", "id": fmt.Sprintf("0-other-%04d", i),
				"name": fmt.Sprintf("other %d", i), "status": "active"})
		}
		if err := s.Store.CreateMany(context.Background(), others, store.Write{Project: project,
			Author: fhir.Reference{Reference: "ClientApplication/test"}}); err != nil {
			t.Fatal(err)
		}
		agent := agentNamed(t, f, "feed")
		r := f.c.Do("GET", "fhir/R4/Agent/"+agent, nil, "").JSON()
		r["identifier"] = []any{map[string]any{"value": "written again"}}
		if put := f.c.Do("PUT", "fhir/R4/Agent/"+agent, r, "application/fhir+json"); put.Status != 200 {
			t.Fatalf("PUT Agent: %d %s", put.Status, put.Body)
		}
		c := dialMLLP(t, f.addr)
		if code, ctl, ack := c.send(mllp.Frame(adt("MANY1", "P1"))); code != "AA" || ctl != "MANY1" {
			t.Fatalf("MANY1: %s %s %q", code, ctl, ack.Bytes())
		}
		if got := recorded(t, f.c, 1); len(got) != 1 || !strings.HasPrefix(got[0], "MANY1 ") {
			t.Fatalf("the bot recorded %q", got)
		}
	}, mllpOptions(project, nil))
}

// agentNamed is the id of the feed's Agent of that name.
func agentNamed(t *testing.T, f *feed, name string) string {
	t.Helper()
	res := f.c.Do("GET", "fhir/R4/Agent?name="+name, nil, "").JSON()
	entries, _ := res["entry"].([]any)
	if len(entries) != 1 {
		t.Fatalf("agents named %s: %v", name, res)
	}
	return servertest.Field(entries[0], "resource", "id").(string)
}
