package fhirapi_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store"
)

// hookCall is one request an HTTP hook received.
type hookCall struct {
	header http.Header
	body   string
}

// hookServer records what it is sent and answers status(body).
type hookServer struct {
	*httptest.Server
	mu    sync.Mutex
	calls []hookCall
}

func newHookServer(t *testing.T, status func(body string) int) *hookServer {
	h := &hookServer{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.calls = append(h.calls, hookCall{r.Header.Clone(), string(b)})
		h.mu.Unlock()
		w.WriteHeader(status(string(b)))
	}))
	t.Cleanup(h.Close)
	return h
}

// wait answers the calls once there are at least n (or after 20 s).
func (h *hookServer) wait(n int) []hookCall {
	deadline := time.Now().Add(20 * time.Second)
	for {
		h.mu.Lock()
		calls := append([]hookCall(nil), h.calls...)
		h.mu.Unlock()
		if len(calls) >= n || time.Now().After(deadline) {
			return calls
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// allowLoopback lets the hooks call 127.0.0.1 (only), as
// SANDBOT_WEBHOOK_ALLOW=127.0.0.1 does.
func allowLoopback(c *server.Config) {
	c.WebhookAllow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
}

func hookSubscription(url, criteria string, exts ...map[string]any) map[string]any {
	sub := map[string]any{"resourceType": "Subscription", "status": "active", "reason": "test", "criteria": criteria,
		"channel": map[string]any{"type": "rest-hook", "endpoint": url, "header": []any{"Authorization: Bearer hook-token"}}}
	var list []any
	for _, x := range exts {
		list = append(list, x)
	}
	if list != nil {
		sub["extension"] = list
	}
	return sub
}

// TestSubscriptionHTTPHooks: a Subscription whose endpoint is a URL posts
// each matching write there, with the reference's headers, the signature of
// the body and the channel's headers; a delete posts an empty object and
// names the resource; success codes decide what is delivered, and a failure
// is tried again up to max-attempts, each attempt an AuditEvent.
func TestSubscriptionHTTPHooks(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "hooks")
		hook := newHookServer(t, func(body string) int {
			switch {
			case strings.Contains(body, `"gone"`):
				return 404
			case strings.Contains(body, `"broken"`):
				return 500
			}
			return 200
		})
		const secret = "s3cret"
		for _, sub := range []map[string]any{
			hookSubscription(hook.URL+"/all", "Patient",
				map[string]any{"url": "https://www.medplum.com/fhir/StructureDefinition/subscription-secret", "valueString": secret},
				map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/subscription-supported-interaction", "valueCode": "create"},
				map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/subscription-supported-interaction", "valueCode": "delete"},
				map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/subscription-success-codes", "valueString": "200-399,404"},
				map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/subscription-max-attempts", "valueInteger": 2}),
		} {
			if r := c.Do("POST", "fhir/R4/Subscription", sub, "application/fhir+json"); r.Status != 201 {
				t.Fatalf("subscription: %d %s", r.Status, r.Body)
			}
		}
		ok := c.Create(map[string]any{"resourceType": "Patient", "gender": "female"})["id"].(string)
		c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "gone"}}})
		broken := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "broken"}}})["id"].(string)
		if r := c.Do("DELETE", "fhir/R4/Patient/"+ok, nil, ""); r.Status != 200 {
			t.Fatalf("delete: %d", r.Status)
		}
		// create ok, create gone (404 counts), broken twice (500, tried
		// again once: max-attempts 2), delete ok.
		calls := hook.wait(5)
		time.Sleep(3 * time.Second) // a third attempt for broken would come after 2 s
		calls = hook.wait(5)
		if len(calls) != 5 {
			t.Fatalf("%d calls, want 5: %v", len(calls), calls)
		}
		brokenCalls, deletes := 0, 0
		for _, call := range calls {
			h := call.header
			mac := hmac.New(sha256.New, []byte(secret))
			mac.Write([]byte(call.body))
			if got := h.Get("X-Signature"); got != hex.EncodeToString(mac.Sum(nil)) {
				t.Errorf("X-Signature %q does not sign %q", got, call.body)
			}
			if h.Get("Authorization") != "Bearer hook-token" || h.Get("X-Medplum-Subscription") == "" ||
				h.Get("Content-Type") != "application/fhir+json" {
				t.Errorf("headers %v", h)
			}
			switch h.Get("X-Medplum-Interaction") {
			case "create":
				if strings.Contains(call.body, broken) {
					brokenCalls++
				}
				if !strings.Contains(call.body, `"resourceType":"Patient"`) {
					t.Errorf("create body %s", call.body)
				}
			case "delete":
				deletes++
				if call.body != "{}" || h.Get("X-Medplum-Deleted-Resource") != "Patient/"+ok {
					t.Errorf("delete: body %q, X-Medplum-Deleted-Resource %q", call.body, h.Get("X-Medplum-Deleted-Resource"))
				}
			default:
				t.Errorf("interaction %q", h.Get("X-Medplum-Interaction"))
			}
		}
		if brokenCalls != 2 || deletes != 1 {
			t.Errorf("broken posted %d times (want 2), deletes %d (want 1)", brokenCalls, deletes)
		}
		// Each attempt is an AuditEvent; the broken one's say which attempt.
		events := c.Do("GET", "fhir/R4/AuditEvent?entity=Patient/"+broken+"&_count=10", nil, "").JSON()
		entries, _ := events["entry"].([]any)
		var descs []string
		for _, e := range entries {
			d, _ := servertest.Field(e, "resource", "outcomeDesc").(string)
			descs = append(descs, d)
		}
		if len(descs) != 2 || !strings.Contains(strings.Join(descs, "|"), "Attempt 1 of 2: POST answered 500") ||
			!strings.Contains(strings.Join(descs, "|"), "Attempt 2 of 2: POST answered 500") {
			t.Errorf("AuditEvents of the broken delivery: %q", descs)
		}
	}, allowLoopback)
}

// TestSubscriptionHTTPHookRefusesInsideAddresses: a hook is never sent to
// loopback, private, link-local or metadata addresses, by address, by a
// name or by a redirect, unless the operator allowed the range; a refused
// delivery is not tried again and its AuditEvent says why.
func TestSubscriptionHTTPHookRefusesInsideAddresses(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "ssrf")
		hook := newHookServer(t, func(string) int { return 200 })
		port := hook.URL[strings.LastIndexByte(hook.URL, ':'):]
		redirects := map[string]string{}
		for _, to := range []string{"http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://127.0.0.2" + port + "/"} {
			r := httptest.NewServer(http.RedirectHandler(to, http.StatusTemporaryRedirect))
			t.Cleanup(r.Close)
			redirects[r.URL] = to
		}
		// (localhost is 127.0.0.1 here, which this server allows: the
		// webhook package's tests refuse it by name.)
		endpoints := []string{"http://127.0.0.2" + port + "/", "http://169.254.169.254/latest/meta-data/",
			"http://[::1]" + port + "/", "http://192.168.1.1/"}
		for r := range redirects {
			endpoints = append(endpoints, r)
		}
		for _, u := range endpoints {
			if r := c.Do("POST", "fhir/R4/Subscription", hookSubscription(u, "Patient"), "application/fhir+json"); r.Status != 201 {
				t.Fatalf("subscription to %s: %d %s", u, r.Status, r.Body)
			}
		}
		id := c.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
		deadline := time.Now().Add(20 * time.Second)
		var descs []string
		for time.Now().Before(deadline) {
			events := c.Do("GET", "fhir/R4/AuditEvent?entity=Patient/"+id+"&_count=50", nil, "").JSON()
			entries, _ := events["entry"].([]any)
			descs = descs[:0]
			for _, e := range entries {
				d, _ := servertest.Field(e, "resource", "outcomeDesc").(string)
				descs = append(descs, d)
			}
			if len(descs) >= len(endpoints) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond) // a second attempt would come after 1 s
		if n := len(hook.wait(0)); n != 0 {
			t.Fatalf("the loopback hook was called %d times", n)
		}
		events := c.Do("GET", "fhir/R4/AuditEvent?entity=Patient/"+id+"&_count=50", nil, "").JSON()
		entries, _ := events["entry"].([]any)
		if len(entries) != len(endpoints) {
			t.Fatalf("%d AuditEvents for %d endpoints (each tried once): %q", len(entries), len(endpoints), descs)
		}
		for _, d := range descs {
			if !strings.Contains(d, "Attempt 1 of 4: not sent: the endpoint's address is not a public one") {
				t.Errorf("AuditEvent %q", d)
			}
		}
	}, allowLoopback)
}

// TestSubscriptionFHIRPathCriteria: a fhir-path-criteria-expression sees
// the version written as %current and the one it replaced as %previous
// (empty on create); one outside the subset is a 400 at write.
func TestSubscriptionFHIRPathCriteria(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "fhirpath")
		bot := deployJS(t, c, "recorder", recorderBot, nil)
		withPath := func(expr string) map[string]any {
			sub := subscription(bot, "Patient")
			sub["extension"] = []any{map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/fhir-path-criteria-expression", "valueString": expr}}
			return sub
		}
		for _, bad := range []string{"%previous.gender !=", "%nothing.gender = 'x'", "Patient.name.matches('x')", ""} {
			if r := c.Do("POST", "fhir/R4/Subscription", withPath(bad), "application/fhir+json"); r.Status != 400 ||
				!strings.Contains(string(r.Body), "Subscription.extension") {
				t.Errorf("criteria %q: %d %s", bad, r.Status, r.Body)
			}
		}
		if r := c.Do("POST", "fhir/R4/Subscription", withPath("%previous.gender != %current.gender"), "application/fhir+json"); r.Status != 201 {
			t.Fatalf("subscription: %d %s", r.Status, r.Body)
		}
		p := c.Create(map[string]any{"resourceType": "Patient", "gender": "male"})
		id := p["id"].(string)
		update := func(field string, value any) {
			p[field] = value
			r := c.Do("PUT", "fhir/R4/Patient/"+id, p, "application/fhir+json")
			if r.Status != 200 {
				t.Fatalf("update: %d %s", r.Status, r.Body)
			}
			p = r.JSON()
		}
		update("name", []any{map[string]any{"family": "Same gender"}})
		update("gender", "female")
		update("active", true)
		got := recorded(t, c, 1)
		time.Sleep(500 * time.Millisecond)
		got = recorded(t, c, 1)
		if len(got) != 1 || got[0] != "update Patient/"+id+" female" {
			t.Errorf("deliveries %q, want only the update that changed the gender", got)
		}
	})
}

// TestSubscriptionDeliversInVersionOrder: deliveries of one Subscription for
// one resource run in version order: when the first version's delivery
// fails and waits to be tried again, the next version waits for it.
func TestSubscriptionDeliversInVersionOrder(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "order")
		failedOnce := false
		var mu sync.Mutex
		hook := newHookServer(t, func(body string) int {
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(body, `"first"`) && !failedOnce {
				failedOnce = true
				return 503
			}
			return 200
		})
		if r := c.Do("POST", "fhir/R4/Subscription", hookSubscription(hook.URL, "Patient"), "application/fhir+json"); r.Status != 201 {
			t.Fatalf("subscription: %d %s", r.Status, r.Body)
		}
		p := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "first"}}})
		for _, family := range []string{"second", "third"} {
			p["name"] = []any{map[string]any{"family": family}}
			if r := c.Do("PUT", "fhir/R4/Patient/"+p["id"].(string), p, "application/fhir+json"); r.Status != 200 {
				t.Fatalf("update: %d %s", r.Status, r.Body)
			}
		}
		calls := hook.wait(4)
		var order []string
		for _, call := range calls {
			for _, f := range []string{"first", "second", "third"} {
				if strings.Contains(call.body, `"`+f+`"`) {
					order = append(order, f)
				}
			}
		}
		if strings.Join(order, " ") != "first first second third" {
			t.Errorf("deliveries in the order %q, want first (failed), first, second, third", order)
		}
	}, allowLoopback)
}

// TestSubscriptionBotRunsAsItself: a delivery runs the bot as its own
// membership even when Bot.runAsUser is true (docs/decisions.md 32, 33):
// what it writes is authored by the Bot, never by the Subscription's author
// or the resource's.
func TestSubscriptionBotRunsAsItself(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "run as")
		bot := deployJS(t, c, "recorder", recorderBot, map[string]any{"runAsUser": true})
		if r := c.Do("POST", "fhir/R4/Subscription", subscription(bot, "Patient"), "application/fhir+json"); r.Status != 201 {
			t.Fatalf("subscription: %d %s", r.Status, r.Body)
		}
		c.Create(map[string]any{"resourceType": "Patient"})
		recorded(t, c, 1)
		found := c.Do("GET", "fhir/R4/Basic?_count=1", nil, "").JSON()
		if author := servertest.Field(found["entry"].([]any)[0], "resource", "meta", "author", "reference"); author != "Bot/"+bot {
			t.Errorf("the bot's write is authored by %v, want Bot/%s", author, bot)
		}
	})
}

// TestSubscriptionNeedsTheRightToRunTheBot: a member whose access policy
// does not let them read (so run) the Bot cannot wire it: 403, as
// $execute would answer them.
func TestSubscriptionNeedsTheRightToRunTheBot(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "no bots")
		bot := deployJS(t, c, "recorder", recorderBot, nil)
		m := memberWithPolicy(t, s, c, "Patient", "Subscription")
		r := m.Do("POST", "fhir/R4/Subscription", subscription(bot, "Patient"), "application/fhir+json")
		if r.Status != 403 {
			t.Fatalf("a member who may not run the bot wired it: %d %s", r.Status, r.Body)
		}
		// The same member may subscribe an HTTP hook (no bot to run).
		if r := m.Do("POST", "fhir/R4/Subscription", hookSubscription("https://hooks.example.com/x", "Patient"), "application/fhir+json"); r.Status != 201 {
			t.Fatalf("an HTTP hook: %d %s", r.Status, r.Body)
		}
	})
}

// memberWithPolicy adds a member to c's project whose access policy allows
// only the types given.
func memberWithPolicy(t *testing.T, s *servertest.Server, c *servertest.Client, types ...string) *servertest.Client {
	t.Helper()
	var resources []any
	for _, typ := range types {
		resources = append(resources, map[string]any{"resourceType": typ})
	}
	pol := c.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "only", "resource": resources}, "application/fhir+json")
	if pol.Status != 201 {
		t.Fatalf("policy: %d %s", pol.Status, pol.Body)
	}
	m := s.NewMember(t, c.ProjectID, "limited member", false)
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
	return m
}

// TestSubscriptionSetToErrorAfterFailures: a Subscription whose deliveries
// failed ten times within an hour is set to error with the reason, and
// delivers nothing more until it is set active again.
func TestSubscriptionSetToErrorAfterFailures(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "auto-disable")
		hook := newHookServer(t, func(string) int { return 500 })
		sub := hookSubscription(hook.URL, "Patient",
			map[string]any{"url": "https://medplum.com/fhir/StructureDefinition/subscription-max-attempts", "valueInteger": 1})
		r := c.Do("POST", "fhir/R4/Subscription", sub, "application/fhir+json")
		if r.Status != 201 {
			t.Fatalf("subscription: %d %s", r.Status, r.Body)
		}
		id := r.JSON()["id"].(string)
		for range 10 {
			c.Create(map[string]any{"resourceType": "Patient"})
		}
		deadline := time.Now().Add(30 * time.Second)
		var got map[string]any
		for time.Now().Before(deadline) {
			got = c.Do("GET", "fhir/R4/Subscription/"+id, nil, "").JSON()
			if got["status"] == "error" {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got["status"] != "error" || !strings.Contains(fmt.Sprint(got["error"]), "10 deliveries failed") {
			t.Fatalf("after 10 failures: %s", mustJSON(got))
		}
		calls := len(hook.wait(10))
		c.Create(map[string]any{"resourceType": "Patient"})
		time.Sleep(time.Second)
		if n := len(hook.wait(0)); n != calls {
			t.Errorf("a Subscription in error delivered: %d calls, then %d", calls, n)
		}
		// Set active again, it delivers.
		got["status"] = "active"
		delete(got, "error")
		if r := c.Do("PUT", "fhir/R4/Subscription/"+id, got, "application/fhir+json"); r.Status != 200 {
			t.Fatalf("reactivate: %d %s", r.Status, r.Body)
		}
		c.Create(map[string]any{"resourceType": "Patient"})
		if n := len(hook.wait(calls + 1)); n != calls+1 {
			t.Errorf("reactivated: %d calls, want %d", n, calls+1)
		}
	}, allowLoopback)
}
