package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestResponseHygiene: every answer, API and ops, says nosniff; every
// authenticated answer and every answer that may carry a token or a login
// code says no-store.
func TestResponseHygiene(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "hygiene")
		pid := c.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
		anon := s.Anonymous(t)
		form := "application/x-www-form-urlencoded"
		for _, tc := range []struct {
			what    string
			resp    *servertest.Response
			noStore bool
		}{
			{"patient read", c.Do("GET", "fhir/R4/Patient/"+pid, nil, ""), true},
			{"patient search", c.Do("GET", "fhir/R4/Patient", nil, ""), true},
			{"patient create", c.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient"}, ""), true},
			{"FHIR 404", c.Do("GET", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000", nil, ""), true},
			{"FHIR 401", anon.Do("GET", "fhir/R4/Patient", nil, ""), true},
			{"admin", c.Do("GET", "admin/projects/"+c.ProjectID, nil, ""), true},
			{"auth/me", c.Do("GET", "auth/me", nil, ""), true},
			{"token", anon.Do("POST", "oauth2/token", "grant_type=client_credentials&client_id="+c.ClientID+"&client_secret="+c.Secret, form), true},
			{"token refused", anon.Do("POST", "oauth2/token", "grant_type=client_credentials&client_id="+c.ClientID+"&client_secret=wrong", form), true},
			{"auth/login", anon.Do("POST", "auth/login", map[string]any{"email": "nobody@example.com", "password": "wrong password"}, "application/json"), true},
			{"auth/method", anon.Do("POST", "auth/method", map[string]any{"email": "nobody@example.com"}, "application/json"), true},
			{"auth/scope", anon.Do("POST", "auth/scope", map[string]any{"login": "x", "scope": "openid"}, "application/json"), true},
			{"oauth2/logout", c.Do("POST", "oauth2/logout", nil, ""), true},
			{"metadata", anon.Do("GET", "fhir/R4/metadata", nil, ""), false},
			{"jwks", anon.Do("GET", ".well-known/jwks.json", nil, ""), false},
			{"unknown path", anon.Do("GET", "no/such/thing", nil, ""), false},
		} {
			if got := tc.resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("%s (%d): X-Content-Type-Options %q", tc.what, tc.resp.Status, got)
			}
			if got := tc.resp.Header.Get("Cache-Control"); tc.noStore && got != "no-store" {
				t.Errorf("%s (%d): Cache-Control %q, want no-store", tc.what, tc.resp.Status, got)
			}
		}
		for _, path := range []string{"/metrics", "/livez", "/readyz", "/healthz"} {
			_, _, hdr := get(t, s.Ops.URL+path)
			if hdr.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("ops %s: no nosniff", path)
			}
		}
	})
}

// rawRequest sends request bytes as they are (no client cleans the path)
// to the server's listener and reads the answer.
func rawRequest(t *testing.T, addr, request string) *http.Response {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestTraversalPathsAreNotRedirected: a path with dot segments, encoded or
// not, is a 4xx where it lands, never a redirect to its cleaned form
// ("Location: /etc/passwd"), with or without credentials.
func TestTraversalPathsAreNotRedirected(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "paths")
		addr := s.HTTP.Listener.Addr().String()
		for _, path := range []string{
			"/fhir/R4/Patient/..%2F..%2F..%2Fetc%2Fpasswd",
			"/fhir/R4/Patient/..%2f..%2fmetadata",
			"/fhir/R4/Patient/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
			"/fhir/R4/Patient/../../../etc/passwd",
			"/fhir/R4/../admin/Project",
			"/fhir/R4/Patient/x/../../../../etc/passwd",
			"//fhir/R4/Patient",
			"/fhir/R4/Patient/a%00b",
			"/fhir/R4/Patient/" + strings.Repeat("a", 65),
			"/admin/projects/..%2F..%2Fetc%2Fpasswd",
			"/auth/../etc/passwd",
		} {
			for _, auth := range []string{"", "Authorization: Bearer " + c.Token + "\r\n"} {
				resp := rawRequest(t, addr, "GET "+path+" HTTP/1.1\r\nHost: "+addr+"\r\n"+auth+"Connection: close\r\n\r\n")
				if resp.StatusCode < 400 || resp.StatusCode >= 500 || resp.Header.Get("Location") != "" {
					t.Errorf("GET %s (credentials: %v): %d Location %q, want a 4xx and no redirect", path, auth != "", resp.StatusCode, resp.Header.Get("Location"))
				}
			}
		}
	})
}
