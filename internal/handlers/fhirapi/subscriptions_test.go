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

// recorderBot records each delivery as a Basic whose code.text says what it
// got: "<interaction> <Type>/<id> <gender>".
const recorderBot = `exports.handler = async (medplum, event) => {
  const r = event.input.deletedResource || event.input;
  await medplum.createResource({ resourceType: 'Basic', code: { text:
    event.headers['x-medplum-interaction'] + ' ' + r.resourceType + '/' + r.id + ' ' + (r.gender || '') } });
  return { ok: true };
};`

func subscription(bot, criteria string, interactions ...string) map[string]any {
	sub := map[string]any{"resourceType": "Subscription", "status": "active", "reason": "test", "criteria": criteria,
		"channel": map[string]any{"type": "rest-hook", "endpoint": "Bot/" + bot}}
	var exts []any
	for _, i := range interactions {
		exts = append(exts, map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/subscription-supported-interaction", "valueCode": i})
	}
	if exts != nil {
		sub["extension"] = exts
	}
	return sub
}

// recorded waits until the project has at least n Basic records (or 20 s)
// and answers their texts.
func recorded(t *testing.T, c *servertest.Client, n int) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := c.Do("GET", "fhir/R4/Basic?_count=100&_sort=_lastUpdated", nil, "")
		entries, _ := r.JSON()["entry"].([]any)
		if len(entries) >= n || time.Now().After(deadline) {
			var out []string
			for _, e := range entries {
				out = append(out, servertest.Field(e, "resource", "code", "text").(string))
			}
			return out
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSubscriptionsRunBots: a Subscription to a Bot runs it for the writes
// its criteria and interactions match, with the resource version as input
// (the deleted one on delete), and its AuditEvent names the Subscription; a
// transaction that rolls back delivers nothing.
func TestSubscriptionsRunBots(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "subscriptions")
		bot := deployJS(t, c, "recorder", recorderBot, nil)
		for _, sub := range []map[string]any{
			subscription(bot, "Patient?gender=female"),
			subscription(bot, "Patient", "delete"),
		} {
			if r := c.Do("POST", "fhir/R4/Subscription", sub, "application/fhir+json"); r.Status != 201 {
				t.Fatalf("subscription: %d %s", r.Status, r.Body)
			}
		}
		male := c.Create(map[string]any{"resourceType": "Patient", "gender": "male"})["id"].(string)
		female := c.Create(map[string]any{"resourceType": "Patient", "gender": "female"})["id"].(string)
		// A transaction that fails at its second entry keeps nothing and
		// delivers nothing.
		r := c.Do("POST", "fhir/R4", map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"request": map[string]any{"method": "POST", "url": "Patient"}, "resource": map[string]any{"resourceType": "Patient", "gender": "female"}},
			map[string]any{"request": map[string]any{"method": "PUT", "url": "Patient/no-such"}, "resource": map[string]any{"resourceType": "Observation"}},
		}}, "application/fhir+json")
		if r.Status < 400 {
			t.Fatalf("the failing transaction: %d %s", r.Status, r.Body)
		}
		if r := c.Do("PATCH", "fhir/R4/Patient/"+male, []any{map[string]any{"op": "replace", "path": "/gender", "value": "female"}}, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("patch: %d %s", r.Status, r.Body)
		}
		if r := c.Do("DELETE", "fhir/R4/Patient/"+female, nil, ""); r.Status != 200 {
			t.Fatalf("delete: %d %s", r.Status, r.Body)
		}
		got := recorded(t, c, 3)
		time.Sleep(300 * time.Millisecond) // nothing more may come
		got = recorded(t, c, 3)
		want := map[string]bool{
			"create Patient/" + female + " female": true,
			"update Patient/" + male + " female":   true,
			"delete Patient/" + female + " female": true,
		}
		if len(got) != len(want) {
			t.Fatalf("deliveries %q, want %v", got, want)
		}
		for _, g := range got {
			if !want[g] {
				t.Errorf("unexpected delivery %q (all: %q)", g, got)
			}
		}
		// The executions' AuditEvents name the Subscription.
		events := c.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+bot+"&_count=10", nil, "").JSON()
		entries, _ := events["entry"].([]any)
		subs := 0
		for _, e := range entries {
			for _, en := range servertest.Field(e, "resource", "entity").([]any) {
				if ref, _ := servertest.Field(en, "what", "reference").(string); strings.HasPrefix(ref, "Subscription/") {
					subs++
				}
			}
		}
		if subs != 3 {
			t.Errorf("%d AuditEvents name a Subscription: %s", subs, mustJSON(events))
		}
	})
}

// TestSubscriptionWrites: what a Subscription may ask is checked when it is
// written (400 naming the element), and only a Bot its writer can run may
// be wired.
func TestSubscriptionWrites(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "subscription writes")
		bot := createMemberBot(t, c, map[string]any{"name": "b"})
		other := s.NewProject(t, "another")
		foreign := createMemberBot(t, other, map[string]any{"name": "theirs"})
		for name, c2 := range map[string]struct {
			sub  map[string]any
			want string
		}{
			"unknown type":          {subscription(bot, "Nothing?x=1"), "Subscription.criteria"},
			"unknown parameter":     {subscription(bot, "Patient?nothing=1"), "Subscription.criteria"},
			"chained":               {subscription(bot, "Observation?subject:Patient.name=x"), "Subscription.criteria"},
			"bad interaction":       {subscription(bot, "Patient", "read"), "Subscription.extension"},
			"another project's bot": {subscription(foreign, "Patient"), "Subscription.channel.endpoint"},
		} {
			r := c.Do("POST", "fhir/R4/Subscription", c2.sub, "application/fhir+json")
			if r.Status != 400 || !strings.Contains(string(r.Body), c2.want) {
				t.Errorf("%s: %d %s", name, r.Status, r.Body)
			}
		}
		ok := c.Do("POST", "fhir/R4/Subscription", subscription(bot, "Patient?gender=male"), "application/fhir+json")
		if ok.Status != 201 {
			t.Fatalf("a valid Subscription: %d %s", ok.Status, ok.Body)
		}
		id := ok.JSON()["id"].(string)
		bad := subscription(foreign, "Patient")
		bad["id"] = id
		if r := c.Do("PUT", "fhir/R4/Subscription/"+id, bad, "application/fhir+json"); r.Status != 400 {
			t.Errorf("rewired to another project's bot: %d %s", r.Status, r.Body)
		}
	})
}

// TestSubscriptionLoopStops: a bot that updates the resource it watches
// runs a bounded number of times, and an AuditEvent says the chain stopped.
func TestSubscriptionLoopStops(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "loop")
		bot := deployJS(t, c, "looper", `exports.handler = async (medplum, event) => {
  const p = event.input;
  p.name = [{ family: 'x' + ((p.name && p.name[0].family) || '') }];
  await medplum.updateResource(p);
  return { ok: true };
};`, nil)
		if r := c.Do("POST", "fhir/R4/Subscription", subscription(bot, "Patient"), "application/fhir+json"); r.Status != 201 {
			t.Fatalf("subscription: %d %s", r.Status, r.Body)
		}
		id := c.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
		deadline := time.Now().Add(30 * time.Second)
		var stopped bool
		for !stopped && time.Now().Before(deadline) {
			events := c.Do("GET", "fhir/R4/AuditEvent?entity=Patient/"+id+"&outcome=4&_count=10", nil, "").JSON()
			entries, _ := events["entry"].([]any)
			for _, e := range entries {
				if d, _ := servertest.Field(e, "resource", "outcomeDesc").(string); strings.Contains(d, "chain of") {
					stopped = true
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !stopped {
			t.Fatal("no AuditEvent says the chain stopped")
		}
		p := c.Do("GET", "fhir/R4/Patient/"+id, nil, "").JSON()
		family, _ := servertest.Field(p, "name").([]any)[0].(map[string]any)["family"].(string)
		if family != "xxxxx" {
			t.Errorf("the bot ran %d times (family %q), want 5", len(family), family)
		}
	})
}

// TestSubscriptionRetries: a bot that fails is tried again, up to the
// Subscription's max attempts, with an AuditEvent per attempt; one that
// answers an error of its own is not tried again.
func TestSubscriptionRetries(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "retries")
		thrower := deployJS(t, c, "thrower", `exports.handler = async () => { throw new Error('no'); };`, nil)
		refuser := deployJS(t, c, "refuser", `exports.handler = async () => new Response('not for me', { status: 422 });`, nil)
		sub := subscription(thrower, "Patient")
		sub["extension"] = []any{map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/subscription-max-attempts", "valueInteger": 3}}
		for _, s := range []map[string]any{sub, subscription(refuser, "Patient")} {
			if r := c.Do("POST", "fhir/R4/Subscription", s, "application/fhir+json"); r.Status != 201 {
				t.Fatalf("subscription: %d %s", r.Status, r.Body)
			}
		}
		c.Create(map[string]any{"resourceType": "Patient"})
		count := func(bot string) int {
			events := c.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+bot+"&_total=accurate&_count=0", nil, "").JSON()
			n, _ := events["total"].(float64)
			return int(n)
		}
		deadline := time.Now().Add(40 * time.Second)
		for count(thrower) < 3 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(5 * time.Second) // a fourth attempt would come after 4 s
		if n := count(thrower); n != 3 {
			t.Errorf("the failing bot ran %d times, want 3", n)
		}
		if n := count(refuser); n != 1 {
			t.Errorf("the bot that answered 422 ran %d times, want 1", n)
		}
		// Each attempt's AuditEvent says which attempt it was.
		events := c.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+thrower+"&_count=10&_sort=_lastUpdated", nil, "").JSON()
		var attempts []string
		for _, e := range events["entry"].([]any) {
			for _, en := range servertest.Field(e, "resource", "entity").([]any) {
				if d, ok := servertest.Field(en, "detail").([]any); ok {
					attempts = append(attempts, servertest.Field(d[0], "valueString").(string))
				}
			}
		}
		if strings.Join(attempts, ",") != "1,2,3" {
			t.Errorf("attempts recorded %q, want 1,2,3", attempts)
		}
	})
}

// TestSubscriptionDeliversWhatItsAuthorMayRead: a member whose access
// policy allows Patients (and the Bot) but not Observations wires the bot to
// both: a Patient is delivered, an Observation is not.
func TestSubscriptionDeliversWhatItsAuthorMayRead(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "narrow")
		bot := deployJS(t, c, "recorder", recorderBot, nil)
		pol := c.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "patients",
			"resource": []any{map[string]any{"resourceType": "Patient"}, map[string]any{"resourceType": "Bot"},
				map[string]any{"resourceType": "Subscription"}}}, "application/fhir+json")
		if pol.Status != 201 {
			t.Fatalf("policy: %d %s", pol.Status, pol.Body)
		}
		m := s.NewMember(t, c.ProjectID, "narrow member", false)
		found, err := store.SearchResources(context.Background(), s.Store, store.AllProjects, "ProjectMembership", "profile="+m.Profile)
		if err != nil || len(found) != 1 {
			t.Fatalf("membership: %v %v", found, err)
		}
		if _, err := s.Store.Update(context.Background(), store.AllProjects, "ProjectMembership", found[0].ID(), store.Write{},
			func(r fhir.Resource) (fhir.Resource, error) {
				r["accessPolicy"] = map[string]any{"reference": "AccessPolicy/" + pol.JSON()["id"].(string)}
				return r, nil
			}); err != nil {
			t.Fatal(err)
		}
		for _, criteria := range []string{"Observation", "Patient"} {
			if r := m.Do("POST", "fhir/R4/Subscription", subscription(bot, criteria), "application/fhir+json"); r.Status != 201 {
				t.Fatalf("subscription to %s: %d %s", criteria, r.Status, r.Body)
			}
		}
		c.Create(map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "x"}})
		patient := c.Create(map[string]any{"resourceType": "Patient", "gender": "other"})["id"].(string)
		got := recorded(t, c, 1)
		time.Sleep(500 * time.Millisecond)
		got = recorded(t, c, 1)
		if len(got) != 1 || got[0] != "create Patient/"+patient+" other" {
			t.Errorf("deliveries %q, want only the Patient's", got)
		}
	})
}
