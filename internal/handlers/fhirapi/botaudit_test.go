package fhirapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store"
)

// awaitAudit waits for an AuditEvent matching query (and pred) to be
// written (in the background) and answers it.
func awaitAudit(t *testing.T, c *servertest.Client, query string, pred func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b := c.Do("GET", "fhir/R4/AuditEvent?"+query+"&_count=100", nil, "").JSON()
		entries, _ := b["entry"].([]any)
		for _, e := range entries {
			ev := e.(map[string]any)["resource"].(map[string]any)
			if pred == nil || pred(ev) {
				return ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no AuditEvent?%s matches: %s", query, mustJSON(b))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// storedAudits are the AuditEvents of a bot, read from the store.
func storedAudits(t *testing.T, s *servertest.Server, project, bot string) []fhir.Resource {
	t.Helper()
	found, err := store.SearchResources(context.Background(), s.Store, store.ProjectScope(project), "AuditEvent", "entity=Bot/"+bot+"&_count=100")
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestExecutionAudit: the AuditEvent of an execution, as the reference
// writes it, for a success and for failures, with the end of the log and
// the failure's message; Bot.auditEventTrigger and auditEventDestination;
// searches by entity, outcome, type and date. Every event queued is written
// by the time the server has closed.
func TestExecutionAudit(t *testing.T) {
	testBots := readWasm(t, "../../../runtime/testdata/bots.wasm")
	eventBot := readWasm(t, "testdata/event.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "audit")
		tb := deployBot(t, c, testBots, map[string]any{"name": "audited"})
		eb := deployBot(t, c, eventBot, map[string]any{"name": "events"})
		never := deployBot(t, c, testBots, map[string]any{"auditEventTrigger": "never"})
		onError := deployBot(t, c, testBots, map[string]any{"auditEventTrigger": "on-error"})
		onOutput := deployBot(t, c, testBots, map[string]any{"auditEventTrigger": "on-output"})
		toLog := deployBot(t, c, testBots, map[string]any{"auditEventDestination": []any{"log"}})

		before := time.Now().UTC().Add(-time.Second)
		// Success with 100 lines of ~210 bytes: the event keeps the last
		// 10 KiB.
		if r := c.Do("POST", "fhir/R4/Bot/"+tb+"/$execute", "log", "text/plain"); r.Status != 200 {
			t.Fatalf("log: %d %s", r.Status, r.Body)
		}
		// A trap after a log line: the line and the failure's message.
		trap := c.Do("POST", "fhir/R4/Bot/"+tb+"/$execute", "trap", "text/plain")
		if trap.Status != 400 {
			t.Fatalf("trap: %d %s", trap.Status, trap.Body)
		}
		// A bot that answers an error envelope, and one whose input is a
		// resource with an id.
		if r := c.Do("POST", "fhir/R4/Bot/"+eb+"/$execute", "fail-text", "text/plain"); r.Status != 400 {
			t.Fatalf("fail-text: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+eb+"/$execute", map[string]any{"resourceType": "Patient", "id": "p-1"}, "application/fhir+json"); r.Status != 200 {
			t.Fatalf("resource input: %d %s", r.Status, r.Body)
		}
		for _, id := range []string{never, onError, onOutput, toLog} {
			for _, word := range []string{"counter", "log", "trap"} {
				c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", word, "text/plain")
			}
		}
		after := time.Now().UTC().Add(time.Second)

		// Searchable as soon as written.
		ok := awaitAudit(t, c, "entity=Bot/"+tb+"&outcome=0&type=execute&date=ge"+before.Format(time.RFC3339), nil)
		failed := awaitAudit(t, c, "entity=Bot/"+tb+"&outcome=4&type=https://medplum.com/CodeSystem/audit-event|execute&date=le"+after.Format(time.RFC3339), nil)

		// The success: type, period, agents, source, entity, project, log.
		if ok["type"].(map[string]any)["code"] != "execute" || ok["type"].(map[string]any)["system"] != "https://medplum.com/CodeSystem/audit-event" {
			t.Errorf("type: %v", ok["type"])
		}
		start, err1 := time.Parse(time.RFC3339, servertest.Field(ok, "period", "start").(string))
		end, err2 := time.Parse(time.RFC3339, servertest.Field(ok, "period", "end").(string))
		if err1 != nil || err2 != nil || start.Before(before) || end.Before(start) || end.After(after) || ok["recorded"] == nil {
			t.Errorf("period: %v", ok["period"])
		}
		agent := ok["agent"].([]any)
		if len(agent) != 2 || servertest.Field(agent[0], "who", "reference") != c.Profile || servertest.Field(agent[0], "requestor") != true ||
			servertest.Field(agent[1], "who", "reference") != "Bot/"+tb || servertest.Field(agent[1], "requestor") != false {
			t.Errorf("agent: %v", agent)
		}
		if servertest.Field(ok, "source", "observer", "reference") != "Bot/"+tb || servertest.Field(ok, "source", "observer", "display") != "audited" {
			t.Errorf("source: %v", ok["source"])
		}
		entity := ok["entity"].([]any)
		if len(entity) != 1 || servertest.Field(entity[0], "what", "reference") != "Bot/"+tb || servertest.Field(entity[0], "role", "code") != "4" {
			t.Errorf("entity: %v", entity)
		}
		if servertest.Field(ok, "meta", "project") != c.ProjectID {
			t.Errorf("meta: %v", ok["meta"])
		}
		desc, _ := ok["outcomeDesc"].(string)
		if len(desc) > 10<<10 || len(desc) < 10<<10-300 || !strings.Contains(desc, "line 099 ") || strings.Contains(desc, "line 000 ") {
			t.Errorf("outcomeDesc of a long log: %d bytes, %.80q…%q", len(desc), desc, desc[max(0, len(desc)-40):])
		}

		// The failure: the log line, then the message the caller got.
		desc, _ = failed["outcomeDesc"].(string)
		if !strings.HasPrefix(desc, "about to trap\n") || !strings.HasSuffix(desc, trap.Issue()) {
			t.Errorf("outcomeDesc of a trap: %q (the caller got %q)", desc, trap.Issue())
		}
		awaitAudit(t, c, "entity=Bot/"+eb+"&outcome=4", func(ev map[string]any) bool { return ev["outcomeDesc"] == "it went wrong" })
		withInput := awaitAudit(t, c, "entity=Patient/p-1", nil)
		if e := withInput["entity"].([]any); len(e) != 2 || servertest.Field(e[0], "what", "reference") != "Bot/"+eb ||
			servertest.Field(e[1], "role", "code") != "1" {
			t.Errorf("entity of a resource input: %v", e)
		}

		// What the triggers and destinations let through, counted once the
		// server has closed (which writes everything queued).
		s.Server.Close()
		count := func(id string) (ok, failed int, descs []string) {
			for _, ev := range storedAudits(t, s, c.ProjectID, id) {
				if ev.String("outcome") == "0" {
					ok++
				} else {
					failed++
				}
				descs = append(descs, ev.String("outcomeDesc"))
			}
			return
		}
		if o, f, _ := count(never); o+f != 0 {
			t.Errorf("never: %d events", o+f)
		}
		if o, f, _ := count(onError); o != 0 || f != 1 {
			t.Errorf("on-error: %d successes, %d failures audited", o, f)
		}
		if o, f, descs := count(onOutput); o != 1 || f != 1 {
			t.Errorf("on-output: %d successes, %d failures audited (%q)", o, f, descs)
		}
		if o, f, _ := count(toLog); o+f != 0 {
			t.Errorf("destination log: %d AuditEvents", o+f)
		}
		if o, f, _ := count(tb); o != 1 || f != 1 {
			t.Errorf("audited bot: %d and %d", o, f)
		}
	})
}

// TestJSExecutionAudit: a JavaScript bot's console output and thrown error
// are its AuditEvent's outcomeDesc.
func TestJSExecutionAudit(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "jsaudit")
		id := deployJS(t, c, "thrower", `exports.handler = async (medplum, event) => {
  console.log('working on', event.input.name);
  if (event.input.fail) throw new Error('js went wrong');
  return { ok: true };
};`, nil)
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"name":"Ada"}`, "application/json"); r.Status != 200 {
			t.Fatalf("success: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"name":"Bob","fail":true}`, "application/json"); r.Status != 400 {
			t.Fatalf("failure: %d %s", r.Status, r.Body)
		}
		ev := awaitAudit(t, c, "entity=Bot/"+id+"&outcome=0", nil)
		if d, _ := ev["outcomeDesc"].(string); !strings.Contains(d, "working on Ada") {
			t.Errorf("success outcomeDesc: %q", d)
		}
		ev = awaitAudit(t, c, "entity=Bot/"+id+"&outcome=4", nil)
		if d, _ := ev["outcomeDesc"].(string); !strings.Contains(d, "working on Bob") || !strings.Contains(d, "js went wrong") {
			t.Errorf("failure outcomeDesc: %q", d)
		}
	})
}
