package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

const appOrigin = "http://app.example.test:3000"

func corsServer(t *testing.T) *servertest.Server {
	return servertest.Start(t, storetest.Backends(t)[0], func(c *server.Config) {
		c.CORSOrigins = []string{appOrigin, "https://other.example.test"}
		c.AppBaseURL = "https://medplum-app.example.test/"
	})
}

func send(t *testing.T, method, url string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestCORSPreflight: a browser's preflight on every API route is answered
// before authentication and the rate limit, for the configured origins and
// the app's own, with the headers @medplum/core sends and nothing else.
func TestCORSPreflight(t *testing.T) {
	s := corsServer(t)
	paths := []string{"fhir/R4/Patient", "fhir/R4/Patient/123", "fhir/R4", "fhir/R4/$graphql", "fhir/R4/Bot/1/$deploy",
		"auth/method", "auth/login", "auth/me", "auth/changepassword", "oauth2/token", "oauth2/logout",
		"admin/projects/1/invite", ".well-known/jwks.json"}
	for _, origin := range []string{appOrigin, "https://medplum-app.example.test"} {
		for _, p := range paths {
			resp := send(t, http.MethodOptions, s.URL+p, map[string]string{
				"Origin":                         origin,
				"Access-Control-Request-Method":  "POST",
				"Access-Control-Request-Headers": "authorization,content-type,x-medplum,if-match,if-none-exist,prefer,cache-control",
			})
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("preflight %s from %s: %d", p, origin, resp.StatusCode)
			}
			h := resp.Header
			if h.Get("Access-Control-Allow-Origin") != origin || h.Get("Access-Control-Allow-Credentials") != "true" {
				t.Errorf("%s: allow-origin %q credentials %q", p, h.Get("Access-Control-Allow-Origin"), h.Get("Access-Control-Allow-Credentials"))
			}
			allowed := strings.ToLower(h.Get("Access-Control-Allow-Headers"))
			for _, want := range []string{"authorization", "content-type", "x-medplum", "if-match", "if-none-exist", "prefer", "cache-control"} {
				if !strings.Contains(allowed, want) {
					t.Errorf("%s: allow-headers %q lacks %s", p, allowed, want)
				}
			}
			for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
				if !strings.Contains(h.Get("Access-Control-Allow-Methods"), m) {
					t.Errorf("%s: allow-methods %q lacks %s", p, h.Get("Access-Control-Allow-Methods"), m)
				}
			}
			if !strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
				t.Errorf("%s: Vary %q", p, h.Values("Vary"))
			}
		}
	}

	// Another origin: refused with an OperationOutcome, no allow headers.
	resp := send(t, http.MethodOptions, s.URL+"fhir/R4/Patient", map[string]string{
		"Origin": "https://evil.example.test", "Access-Control-Request-Method": "GET"})
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/fhir+json") {
		t.Errorf("unknown origin: %d %q %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"), resp.Header.Get("Content-Type"))
	}
	// An origin that only starts like an allowed one.
	resp = send(t, http.MethodOptions, s.URL+"fhir/R4/Patient", map[string]string{
		"Origin": appOrigin + ".evil.test", "Access-Control-Request-Method": "GET"})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("prefix origin: %d", resp.StatusCode)
	}
	// "null" (sandboxed frames, file: pages) is no configured origin.
	resp = send(t, http.MethodOptions, s.URL+"fhir/R4/Patient", map[string]string{
		"Origin": "null", "Access-Control-Request-Method": "GET"})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("null origin: %d", resp.StatusCode)
	}
	// OPTIONS that is no preflight is not answered by CORS (authentication applies).
	resp = send(t, http.MethodOptions, s.URL+"fhir/R4/Patient", map[string]string{"Origin": appOrigin})
	if resp.StatusCode == http.StatusNoContent {
		t.Errorf("plain OPTIONS answered as a preflight")
	}
	// Outside the API prefixes there is no CORS.
	resp = send(t, http.MethodOptions, s.URL+"healthcheck", map[string]string{
		"Origin": appOrigin, "Access-Control-Request-Method": "GET"})
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("healthcheck answered a preflight")
	}
}

// TestCORSActualRequests: answers to an allowed origin reflect it and expose
// the headers the client reads, errors included (a 401 must be readable by
// the app to trigger its refresh); other origins get no CORS headers.
func TestCORSActualRequests(t *testing.T) {
	s := corsServer(t)
	c := s.SuperAdmin(t)
	r := c.DoWith("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient"}, "", map[string]string{"Origin": appOrigin})
	if r.Status != 201 || r.Header.Get("Access-Control-Allow-Origin") != appOrigin || r.Header.Get("Access-Control-Allow-Credentials") != "true" {
		t.Fatalf("create: %d %q", r.Status, r.Header.Get("Access-Control-Allow-Origin"))
	}
	exposed := strings.ToLower(r.Header.Get("Access-Control-Expose-Headers"))
	for _, want := range []string{"location", "content-location", "etag", "last-modified", "retry-after", "x-request-id"} {
		if !strings.Contains(exposed, want) {
			t.Errorf("expose-headers %q lacks %s", exposed, want)
		}
	}
	resp := send(t, http.MethodGet, s.URL+"auth/me", map[string]string{"Origin": appOrigin})
	if resp.StatusCode != 401 || resp.Header.Get("Access-Control-Allow-Origin") != appOrigin {
		t.Errorf("401: %d %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	resp = send(t, http.MethodGet, s.URL+"auth/me", map[string]string{"Origin": "https://evil.example.test"})
	if resp.StatusCode != 401 || resp.Header.Get("Access-Control-Allow-Origin") != "" || resp.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("other origin: %d %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	if !strings.Contains(strings.Join(resp.Header.Values("Vary"), ","), "Origin") {
		t.Errorf("no Vary: Origin on a CORS path")
	}
}

// TestCORSOffByDefault: with no origins configured and the app on the
// server's own origin, no other origin is allowed.
func TestCORSOffByDefault(t *testing.T) {
	s := servertest.Start(t, storetest.Backends(t)[0])
	resp := send(t, http.MethodOptions, s.URL+"auth/login", map[string]string{
		"Origin": appOrigin, "Access-Control-Request-Method": "POST"})
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("default: %d %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
}
