package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/store/storetest"
)

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestOpsEndpoints(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "ops")
		id := c.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
		for range 3 {
			if r := c.Do("GET", "fhir/R4/Patient/"+id, nil, ""); r.Status != 200 {
				t.Fatalf("read: %d", r.Status)
			}
		}
		c.Do("GET", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000", nil, "")
		c.Do("GET", "no/such/path", nil, "")

		status, body, hdr := get(t, s.Ops.URL+"/metrics")
		if status != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
			t.Fatalf("/metrics: %d %s", status, hdr.Get("Content-Type"))
		}
		for _, re := range []string{
			`(?m)^sandbot_http_request_duration_seconds_count\{code="200",method="GET",route="/fhir/R4/\{type\}/\{id\}"\} 3$`,
			`(?m)^sandbot_http_request_duration_seconds_count\{code="404",method="GET",route="/fhir/R4/\{type\}/\{id\}"\} 1$`,
			`(?m)^sandbot_http_request_duration_seconds_count\{code="201",method="POST",route="/fhir/R4/\{type\}"\} 1$`,
			`(?m)^sandbot_http_request_duration_seconds_bucket\{code="200",method="GET",route="/fhir/R4/\{type\}/\{id\}",le="\+Inf"\} 3$`,
			`(?m)^sandbot_http_request_duration_seconds_count\{code="200",method="POST",route="/oauth2/token"\} \d+$`,
			`(?m)^sandbot_http_requests_in_flight 0$`,
			`(?m)^sandbot_build_info\{store="` + s.Backend + `",version="test"\} 1$`,
		} {
			if !regexp.MustCompile(re).MatchString(body) {
				t.Errorf("/metrics lacks %s", re)
			}
		}
		// Route labels are templates: no id, no unmatched raw path.
		if strings.Contains(body, id) || strings.Contains(body, "no/such/path") {
			t.Errorf("/metrics carries raw paths")
		}

		for _, p := range []string{"/livez", "/readyz", "/healthz"} {
			if status, body, _ := get(t, s.Ops.URL+p); status != 200 || body != "ok\n" {
				t.Errorf("%s: %d %q", p, status, body)
			}
		}
		s.SetReady(false)
		for _, p := range []string{"/readyz", "/healthz"} {
			if status, _, _ := get(t, s.Ops.URL+p); status != 503 {
				t.Errorf("%s when not ready: %d, want 503", p, status)
			}
		}
		if status, _, _ := get(t, s.Ops.URL+"/livez"); status != 200 {
			t.Errorf("/livez when not ready: %d, want 200", status)
		}
		s.SetReady(true)
		if status, _, _ := get(t, s.Ops.URL+"/readyz"); status != 200 {
			t.Errorf("/readyz ready again: %d", status)
		}
		// The ops listener serves nothing of the API, and the API no metrics.
		if status, _, _ := get(t, s.Ops.URL+"/fhir/R4/metadata"); status != 404 {
			t.Errorf("ops serves the API: %d", status)
		}
		if status, _, _ := get(t, s.URL+"metrics"); status != 404 {
			t.Errorf("API serves /metrics: %d", status)
		}
	})
}

func TestHealthcheck(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		status, body, hdr := get(t, s.URL+"healthcheck")
		var got map[string]any
		if err := json.Unmarshal([]byte(body), &got); err != nil || status != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
			t.Fatalf("/healthcheck: %d %q %s", status, hdr.Get("Content-Type"), body)
		}
		if got["ok"] != true || got["version"] != "test" || got[s.Backend] != true {
			t.Errorf("/healthcheck body %v", got)
		}
		if status, body, _ := get(t, s.URL); status != 200 || !strings.Contains(body, `"ok":true`) {
			t.Errorf("GET /: %d %s", status, body)
		}
		// Unknown paths outside /fhir are OperationOutcomes too.
		status, body, hdr = get(t, s.URL+"does/not/exist")
		if status != 404 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/fhir+json") || !strings.Contains(body, `"code":"not-found"`) || hdr.Get("X-Request-Id") == "" {
			t.Errorf("unknown path: %d %q %s", status, hdr.Get("Content-Type"), body)
		}
		// After the store goes away, health says so (503), never 200.
		s.Store.Close()
		if status, body, _ := get(t, s.URL+"healthcheck"); status != 503 || !strings.Contains(body, `"ok":false`) {
			t.Errorf("/healthcheck with a closed store: %d %s", status, body)
		}
		if status, _, _ := get(t, s.Ops.URL+"/readyz"); status != 503 {
			t.Errorf("/readyz with a closed store: %d", status)
		}
	})
}

// TestLimitsReachEveryHandler: the one Limits given to the server bounds the
// FHIR, admin and auth bodies (each over its own limit is 413, just under
// it is not).
func TestLimitsReachEveryHandler(t *testing.T) {
	lim := limits.Limits{JSONBodyBytes: 4 << 10, AuthBodyBytes: 2 << 10}
	s := servertest.Start(t, storetest.Backends(t)[0], func(c *server.Config) { c.Limits = lim })
	c := s.NewProject(t, "limits")
	pad := func(n int) string { return strings.Repeat("x", n) }
	if r := c.Do("POST", "fhir/R4/Patient", `{"resourceType":"Patient","gender":"`+pad(5<<10)+`"}`, "application/fhir+json"); r.Status != 413 {
		t.Errorf("FHIR body over JSONBodyBytes: %d %s", r.Status, r.Body)
	}
	if r := c.Do("POST", "fhir/R4/Patient", `{"resourceType":"Patient"}`, "application/fhir+json"); r.Status != 201 {
		t.Errorf("small FHIR body: %d %s", r.Status, r.Body)
	}
	if r := c.Do("POST", "admin/projects/"+c.ProjectID+"/secrets", `[{"name":"a","valueString":"`+pad(5<<10)+`"}]`, "application/json"); r.Status != 413 {
		t.Errorf("admin body over JSONBodyBytes: %d %s", r.Status, r.Body)
	}
	form := url.Values{"grant_type": {"client_credentials"}, "client_id": {c.ClientID}, "client_secret": {c.Secret}, "scope": {pad(3 << 10)}}
	if status, _ := servertest.PostToken(t, s.URL, form); status != 413 {
		t.Errorf("token form over AuthBodyBytes: %d", status)
	}
	form.Set("scope", "openid")
	if status, _ := servertest.PostToken(t, s.URL, form); status != 200 {
		t.Errorf("small token form: %d", status)
	}
}

// TestDrainClosesConnections: once the server is no longer ready (SIGTERM),
// /readyz answers 503 and every API answer asks the client to close its
// connection, so that no idle keep-alive connection is reused by a balancer
// at the moment the listener closes.
func TestDrainClosesConnections(t *testing.T) {
	b := storetest.Backends(t)[0]
	s := servertest.Start(t, b)
	if st, _, h := get(t, s.URL+"healthcheck"); st != 200 || h.Get("Connection") == "close" {
		t.Fatalf("ready: %d, Connection %q", st, h.Get("Connection"))
	}
	s.SetReady(false)
	if st, _, _ := get(t, s.Ops.URL+"/readyz"); st != 503 {
		t.Errorf("/readyz while draining: %d", st)
	}
	resp, err := http.Get(s.URL + "healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("while draining: %d, close %v (the API still serves, and closes the connection)", resp.StatusCode, resp.Close)
	}
}
