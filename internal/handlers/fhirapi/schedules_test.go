package fhirapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

// tickerBot records each run as a Basic whose code.text is
// "<input Type>/<input id> <tick>" (the tick from the event's headers).
const tickerBot = `exports.handler = async (medplum, event) => {
  await medplum.createResource({ resourceType: 'Basic', code: { text:
    event.input.resourceType + '/' + event.input.id + ' ' + event.headers['x-sandbot-schedule-tick'] } });
  return { ok: true };
};`

// fastTicks lets tests use six-field cron expressions (seconds first).
func fastTicks(c *server.Config) { c.Limits.CronFields = 6 }

// enableCron adds "cron" to the project's features (a super admin's field).
func enableCron(t *testing.T, s *servertest.Server, project string) {
	t.Helper()
	r := s.SuperAdmin(t).Do("PATCH", "fhir/R4/Project/"+project, []any{map[string]any{"op": "add", "path": "/features", "value": []any{"cron"}}},
		"application/json-patch+json")
	if r.Status != 200 {
		t.Fatalf("enable cron: %d %s", r.Status, r.Body)
	}
}

// runs answers the Basic records of the project: their texts and authors.
func runs(t *testing.T, c *servertest.Client) (texts, authors []string) {
	t.Helper()
	r := c.Do("GET", "fhir/R4/Basic?_count=1000", nil, "")
	entries, _ := r.JSON()["entry"].([]any)
	for _, e := range entries {
		texts = append(texts, servertest.Field(e, "resource", "code", "text").(string))
		authors = append(authors, servertest.Field(e, "resource", "meta", "author", "reference").(string))
	}
	return texts, authors
}

// awaitRuns waits until the project has at least n runs (or 60 s).
func awaitRuns(t *testing.T, c *servertest.Client, n int) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		texts, _ := runs(t, c)
		if len(texts) >= n || time.Now().After(deadline) {
			return texts
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lateness logs how long after their ticks the runs wrote their records.
func lateness(t *testing.T, c *servertest.Client) {
	t.Helper()
	r := c.Do("GET", "fhir/R4/Basic?_count=1000", nil, "")
	entries, _ := r.JSON()["entry"].([]any)
	var worst, sum time.Duration
	for _, e := range entries {
		text := servertest.Field(e, "resource", "code", "text").(string)
		tick, err1 := time.Parse(time.RFC3339, text[strings.LastIndex(text, " ")+1:])
		written, err2 := time.Parse(time.RFC3339Nano, servertest.Field(e, "resource", "meta", "lastUpdated").(string))
		if err1 != nil || err2 != nil {
			t.Fatalf("run %q: %v %v", text, err1, err2)
		}
		d := written.Sub(tick)
		sum += d
		worst = max(worst, d)
	}
	if len(entries) > 0 {
		t.Logf("FIGURE cron lateness (tick to the bot's write): mean %v, worst %v over %d runs", (sum / time.Duration(len(entries))).Round(time.Millisecond), worst.Round(time.Millisecond), len(entries))
	}
}

// onceEach fails when two runs had the same tick.
func onceEach(t *testing.T, texts []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, x := range texts {
		if seen[x] {
			t.Errorf("tick run twice: %q (all: %q)", x, texts)
		}
		seen[x] = true
	}
}

// TestCronBotRunsOnSchedule: a Bot's cronString runs it on schedule, as
// itself (its writes' author is the Bot), with the Bot as input, once per
// tick; a changed schedule takes effect by the next tick; without the
// project feature nothing runs.
func TestCronBotRunsOnSchedule(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		off := s.NewProject(t, "no cron feature")
		quiet := deployJS(t, off, "ticker", tickerBot, nil)
		if r := off.Do("PATCH", "fhir/R4/Bot/"+quiet, []any{map[string]any{"op": "add", "path": "/cronString", "value": "* * * * * *"}}, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("cronString without the feature: %d %s", r.Status, r.Body)
		}

		c := s.NewProject(t, "cron")
		enableCron(t, s, c.ProjectID)
		bot := deployJS(t, c, "ticker", tickerBot, nil)
		if r := c.Do("PATCH", "fhir/R4/Bot/"+bot, []any{map[string]any{"op": "add", "path": "/cronString", "value": "*/2 * * * * *"}}, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("set cronString: %d %s", r.Status, r.Body)
		}
		texts := awaitRuns(t, c, 3)
		if len(texts) < 3 {
			t.Fatalf("%d runs in 60 s: %q", len(texts), texts)
		}
		_, authors := runs(t, c)
		for i, x := range texts {
			if !strings.HasPrefix(x, "Bot/"+bot+" ") || !strings.HasSuffix(x, "Z") {
				t.Errorf("run input %q, want the Bot and a tick", x)
			}
			if authors[i] != "Bot/"+bot {
				t.Errorf("run author %q, want the Bot itself", authors[i])
			}
		}
		onceEach(t, texts)
		lateness(t, c)

		// The schedule changed to once a year: by the next tick nothing more
		// runs (a tick already running may finish).
		if r := c.Do("PATCH", "fhir/R4/Bot/"+bot, []any{map[string]any{"op": "replace", "path": "/cronString", "value": "0 0 1 1 *"}}, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("change cronString: %d %s", r.Status, r.Body)
		}
		before, _ := runs(t, c)
		time.Sleep(8 * time.Second) // longer than a tick and River's scheduler interval
		after, _ := runs(t, c)
		if len(after) > len(before)+1 {
			t.Errorf("%d runs after the schedule changed, want at most 1", len(after)-len(before))
		}
		time.Sleep(5 * time.Second)
		if later, _ := runs(t, c); len(later) != len(after) {
			t.Errorf("the old schedule still runs: %d more runs", len(later)-len(after))
		}
		if texts, _ := runs(t, off); len(texts) != 0 {
			t.Errorf("a project without the cron feature ran %d ticks", len(texts))
		}
		// Turning the feature on schedules the project's Bots.
		enableCron(t, s, off.ProjectID)
		if texts := awaitRuns(t, off, 2); len(texts) < 2 || !strings.HasPrefix(texts[0], "Bot/"+quiet+" ") {
			t.Errorf("after the feature was turned on: %q", texts)
		}
	}, fastTicks)
}

// TestCronOncePerTickOnTwoServers: two servers on one database (replicas)
// run each tick once between them.
func TestCronOncePerTickOnTwoServers(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			url := b.NewURL(t)
			s1 := servertest.StartURL(t, b.Name, url, fastTicks)
			s2 := servertest.StartURL(t, b.Name, url, fastTicks)
			c := s1.NewProject(t, "replicas")
			enableCron(t, s1, c.ProjectID)
			bot := deployJS(t, c, "ticker", tickerBot, map[string]any{})
			// The schedule is written through the other server.
			c2 := s2.As(t, s2.Token(t, c.ClientID, c.Secret))
			if r := c2.Do("PATCH", "fhir/R4/Bot/"+bot, []any{map[string]any{"op": "add", "path": "/cronString", "value": "* * * * * *"}}, "application/json-patch+json"); r.Status != 200 {
				t.Fatalf("set cronString: %d %s", r.Status, r.Body)
			}
			texts := awaitRuns(t, c, 4)
			if len(texts) < 4 {
				t.Fatalf("%d runs in 60 s", len(texts))
			}
			onceEach(t, texts)
		})
	}
}

// TestCronResource: a Cron runs its target Bot with the Cron as input, on
// behalf of its onBehalfOf membership (the AuditEvent names the Cron);
// deleting it stops it; only project admins write Crons; an invalid
// schedule is a 400 on write, for Crons and Bots.
func TestCronResource(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "crons")
		enableCron(t, s, c.ProjectID)
		bot := deployJS(t, c, "ticker", tickerBot, nil)
		found, err := store.SearchResources(context.Background(), s.Store, store.AllProjects, "ProjectMembership", "profile="+c.Profile)
		if err != nil || len(found) != 1 {
			t.Fatalf("membership: %v %v", found, err)
		}
		me := found[0].ID()
		cron := func(expr string) map[string]any {
			return map[string]any{"resourceType": "Cron", "cronString": expr, "active": true,
				"targetReference": map[string]any{"reference": "Bot/" + bot},
				"onBehalfOf":      map[string]any{"reference": "ProjectMembership/" + me}}
		}

		for name, bad := range map[string]map[string]any{
			"not cron":          cron("every minute"),
			"four fields":       cron("* * * *"),
			"descriptor":        cron("@daily"),
			"minute 61":         cron("61 * * * *"),
			"seven fields":      cron("* * * * * * *"),
			"no target":         {"resourceType": "Cron", "cronString": "* * * * *", "active": true, "onBehalfOf": map[string]any{"reference": "ProjectMembership/" + me}},
			"unknown bot":       {"resourceType": "Cron", "cronString": "* * * * *", "active": true, "targetReference": map[string]any{"reference": "Bot/nope"}, "onBehalfOf": map[string]any{"reference": "ProjectMembership/" + me}},
			"no active":         {"resourceType": "Cron", "cronString": "* * * * *", "targetReference": map[string]any{"reference": "Bot/" + bot}, "onBehalfOf": map[string]any{"reference": "ProjectMembership/" + me}},
			"bot cronString":    {"resourceType": "Bot", "name": "x", "cronString": "*/5 * * *"},
			"bot timing: 7 min": {"resourceType": "Bot", "name": "x", "cronTiming": map[string]any{"repeat": map[string]any{"period": 7, "periodUnit": "min"}}},
			"bot timing: count": {"resourceType": "Bot", "name": "x", "cronTiming": map[string]any{"repeat": map[string]any{"count": 3, "period": 1, "periodUnit": "h"}}},
			"bot timing: event": {"resourceType": "Bot", "name": "x", "cronTiming": map[string]any{"event": []any{"2026-01-01"}}},
		} {
			r := c.Do("POST", "fhir/R4/"+bad["resourceType"].(string), bad, "application/fhir+json")
			if r.Status != 400 {
				t.Errorf("%s: %d %s", name, r.Status, r.Body)
			}
		}
		for _, timing := range []map[string]any{
			{"repeat": map[string]any{"period": 15, "periodUnit": "min"}},
			{"repeat": map[string]any{"frequency": 4, "period": 1, "periodUnit": "d", "dayOfWeek": []any{"mon", "fri"}}},
			{"repeat": map[string]any{"timeOfDay": []any{"08:30:00", "17:00:00"}, "dayOfWeek": []any{"sat"}}},
		} {
			if r := c.Do("POST", "fhir/R4/Bot", map[string]any{"resourceType": "Bot", "name": "timed", "cronTiming": timing}, "application/fhir+json"); r.Status != 201 {
				t.Errorf("timing %v: %d %s", timing, r.Status, r.Body)
			}
		}

		// A member who is not an admin may neither write nor read Crons.
		m := s.NewMember(t, c.ProjectID, "member", false)
		if r := m.Do("POST", "fhir/R4/Cron", cron("* * * * *"), "application/fhir+json"); r.Status != 403 {
			t.Errorf("a member's Cron: %d %s", r.Status, r.Body)
		}

		r := c.Do("POST", "fhir/R4/Cron", cron("*/2 * * * * *"), "application/fhir+json")
		if r.Status != 201 {
			t.Fatalf("Cron: %d %s", r.Status, r.Body)
		}
		id := r.JSON()["id"].(string)
		if r := m.Do("GET", "fhir/R4/Cron/"+id, nil, ""); r.Status != 403 {
			t.Errorf("a member reads a Cron: %d %s", r.Status, r.Body)
		}
		texts := awaitRuns(t, c, 2)
		if len(texts) < 2 {
			t.Fatalf("%d runs in 60 s", len(texts))
		}
		for _, x := range texts {
			if !strings.HasPrefix(x, "Cron/"+id+" ") {
				t.Errorf("run input %q, want the Cron", x)
			}
		}
		onceEach(t, texts)
		events := c.Do("GET", "fhir/R4/AuditEvent?entity=Cron/"+id+"&_count=1", nil, "").JSON()
		if entries, _ := events["entry"].([]any); len(entries) != 1 || servertest.Field(entries[0], "resource", "agent").([]any)[0].(map[string]any)["who"].(map[string]any)["reference"] != c.Profile {
			t.Errorf("AuditEvent of a Cron's run: %s", mustJSON(events))
		}

		if r := c.Do("DELETE", "fhir/R4/Cron/"+id, nil, ""); r.Status != 200 {
			t.Fatalf("delete Cron: %d %s", r.Status, r.Body)
		}
		before, _ := runs(t, c)
		time.Sleep(8 * time.Second)
		after, _ := runs(t, c)
		if len(after) > len(before)+1 {
			t.Errorf("%d runs after the Cron was deleted, want at most 1", len(after)-len(before))
		}
	}, fastTicks)
}

// TestCronSecondsNeedTheSetting: without the test setting a six-field
// expression is refused: production schedules are to the minute.
func TestCronSecondsNeedTheSetting(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	s := servertest.Start(t, storetest.Backends(t)[0])
	c := s.NewProject(t, "minutes")
	if r := c.Do("POST", "fhir/R4/Bot", map[string]any{"resourceType": "Bot", "name": "x", "cronString": "*/2 * * * * *"}, "application/fhir+json"); r.Status != 400 ||
		!strings.Contains(r.Issue(), "five-field") {
		t.Errorf("six fields: %d %s", r.Status, r.Body)
	}
	if r := c.Do("POST", "fhir/R4/Bot", map[string]any{"resourceType": "Bot", "name": "x", "cronString": "*/5 * * * 1-5"}, "application/fhir+json"); r.Status != 201 {
		t.Errorf("five fields: %d %s", r.Status, r.Body)
	}
}

// TestCronMissedTicksRunOnce: ticks that came while no server ran are run
// once, at the next start, not one by one: the server (the binary) is
// killed, five ticks pass, and a new process on the same store runs one of
// them before its schedule goes on. Skipped with -short.
func TestCronMissedTicksRunOnce(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	bin := servertest.BuildBinary(t)
	env := []string{"SANDBOT_CRON_FIELDS=6"}
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dataDir, dbURL := servertest.ProcessStore(t, b)
			p := servertest.StartProcess(t, bin, dataDir, dbURL, env...)
			su := p.SuperAdmin(t)
			r := su.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "missed", "features": []any{"cron"}}, "")
			if r.Status != 201 {
				t.Fatalf("project: %d %s", r.Status, r.Body)
			}
			r = su.Do("POST", "admin/projects/"+r.JSON()["id"].(string)+"/bot", map[string]any{"name": "ticker", "runtimeVersion": "vmcontext"}, "application/json")
			if r.Status != 201 {
				t.Fatalf("bot: %d %s", r.Status, r.Body)
			}
			bot := r.JSON()["id"].(string)
			r = su.Do("POST", "fhir/R4/Bot/"+bot+"/$deploy", map[string]any{"code": tickerBot, "filename": "ticker.js"}, "")
			if r.Status == 400 && strings.Contains(r.Issue(), "make js") {
				t.Skip("JavaScript engine not fetched (make js)")
			}
			if r.Status != 200 {
				t.Fatalf("deploy: %d %s", r.Status, r.Body)
			}
			if r := su.Do("PATCH", "fhir/R4/Bot/"+bot, []any{map[string]any{"op": "add", "path": "/cronString", "value": "*/2 * * * * *"}}, "application/json-patch+json"); r.Status != 200 {
				t.Fatalf("cronString: %d %s", r.Status, r.Body)
			}
			ticks := func(c *servertest.Client) []time.Time {
				texts, _ := runs(t, c)
				var out []time.Time
				for _, x := range texts {
					at, err := time.Parse(time.RFC3339, x[strings.LastIndex(x, " ")+1:])
					if err != nil {
						t.Fatalf("run %q: %v", x, err)
					}
					out = append(out, at)
				}
				return out
			}
			for deadline := time.Now().Add(60 * time.Second); len(ticks(su)) < 2; time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no runs in 60 s")
				}
			}
			p.Kill()
			time.Sleep(10 * time.Second) // five ticks
			restart := time.Now()
			p = servertest.StartProcess(t, bin, dataDir, dbURL, env...)
			su = p.SuperAdmin(t)
			before := ticks(su) // what the killed process ran
			var last time.Time
			for _, at := range before {
				if at.After(last) {
					last = at
				}
			}
			var all []time.Time
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				all = ticks(su)
				after := 0
				for _, at := range all {
					if at.After(restart) {
						after++
					}
				}
				if after >= 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the schedule did not go on after the restart: %v", all)
				}
			}
			missed := 0
			for _, at := range all {
				if at.After(last) && at.Before(restart) {
					missed++
				}
			}
			if missed != 1 {
				t.Errorf("%d of the ticks missed while no server ran were run, want 1 (last before the kill %v, restart %v, all %v)", missed, last, restart, all)
			}
		})
	}
}
