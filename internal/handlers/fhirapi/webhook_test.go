package fhirapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store"
)

// hookBot answers what a public webhook gave it.
const hookBot = `exports.handler = async (medplum, event) => {
  const me = await medplum.searchResources('Patient', '_count=1');
  return { header: event.headers['x-hook'], auth: event.headers['authorization'] || null, input: event.input,
    requester: event.requester && event.requester.reference };
};`

// botMembership answers the id of a Bot's own membership, given an access
// policy when policy is set (written directly: project admins change
// memberships through the admin API).
func botMembership(t *testing.T, s *servertest.Server, bot, policy string) string {
	t.Helper()
	ctx := context.Background()
	found, err := store.SearchResources(ctx, s.Store, store.AllProjects, "ProjectMembership", "profile=Bot/"+bot)
	if err != nil || len(found) != 1 {
		t.Fatalf("bot membership: %v %v", found, err)
	}
	id := found[0].ID()
	if policy != "" {
		if _, err := s.Store.Update(ctx, store.AllProjects, "ProjectMembership", id, store.Write{}, func(r fhir.Resource) (fhir.Resource, error) {
			r["accessPolicy"] = map[string]any{"reference": "AccessPolicy/" + policy}
			return r, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// TestPublicWebhook: POST /webhook/{membership} without a token runs the
// membership's Bot when the Bot has publicWebhook and the membership an
// access policy, with the request's headers in the event; every other case
// is the same 404.
func TestPublicWebhook(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "webhooks")
		pol := c.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "patients",
			"resource": []any{map[string]any{"resourceType": "Patient"}}}, "application/fhir+json")
		if pol.Status != 201 {
			t.Fatalf("policy: %d %s", pol.Status, pol.Body)
		}
		policy := pol.JSON()["id"].(string)
		bot := memberJSBot(t, c, "hook", hookBot)
		if r := c.Do("PATCH", "fhir/R4/Bot/"+bot, []any{map[string]any{"op": "add", "path": "/publicWebhook", "value": true}}, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("publicWebhook: %d %s", r.Status, r.Body)
		}
		hook := botMembership(t, s, bot, policy)

		anon := s.Anonymous(t)
		r := anon.DoWith("POST", "webhook/"+hook, map[string]any{"event": "paid"}, "application/json", map[string]string{"X-Hook": "hello"})
		if r.Status != 200 {
			t.Fatalf("webhook: %d %s", r.Status, r.Body)
		}
		got := r.JSON()
		if got["header"] != "hello" || servertest.Field(got, "input", "event") != "paid" || got["requester"] != "Bot/"+bot || got["auth"] != nil {
			t.Errorf("the bot got %s", r.Body)
		}
		// The AuditEvent is written in the background.
		var events map[string]any
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if events = c.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+bot+"&_count=5", nil, "").JSON(); events["entry"] != nil {
				break
			}
		}
		if entries, _ := events["entry"].([]any); len(entries) != 1 {
			t.Errorf("AuditEvents of the webhook: %s", mustJSON(events))
		}

		// The deny cases, each the same 404.
		noPolicy := memberJSBot(t, c, "no policy", hookBot)
		c.Do("PATCH", "fhir/R4/Bot/"+noPolicy, []any{map[string]any{"op": "add", "path": "/publicWebhook", "value": true}}, "application/json-patch+json")
		notPublic := memberJSBot(t, c, "not public", hookBot)
		found, _ := store.SearchResources(context.Background(), s.Store, store.AllProjects, "ProjectMembership", "profile="+c.Profile)
		for name, id := range map[string]string{
			"unknown id":             "00000000-0000-4000-8000-000000000000",
			"not an id":              "x'y",
			"not a bot's membership": found[0].ID(),
			"no access policy":       botMembership(t, s, noPolicy, ""),
			"publicWebhook not set":  botMembership(t, s, notPublic, policy),
		} {
			r := anon.DoWith("POST", "webhook/"+id, map[string]any{"event": "paid"}, "application/json", map[string]string{"X-Hook": "hello"})
			if r.Status != 404 || !strings.Contains(r.Issue(), "Not found") {
				t.Errorf("%s: %d %s", name, r.Status, r.Body)
			}
		}
		if r := anon.Do("GET", "webhook/"+hook, nil, ""); r.Status == 200 {
			t.Errorf("GET on a webhook: %d", r.Status)
		}
	})
}

// TestPublicWebhookRateLimit: a client address past its budget is refused
// with 429 and Retry-After, before anything runs.
func TestPublicWebhookRateLimit(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		anon := s.Anonymous(t)
		for i := 1; i <= 3; i++ {
			r := anon.Do("POST", "webhook/00000000-0000-4000-8000-000000000000", map[string]any{}, "application/json")
			want := 404
			if i == 3 {
				want = 429
			}
			if r.Status != want {
				t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
			}
			if i == 3 && r.Header.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
		}
	}, func(c *server.Config) { c.Limits.WebhookRequestsPerMinute = 2 })
}
