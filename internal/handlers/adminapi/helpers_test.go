package adminapi_test

import (
	"crypto/sha256"
	"encoding/base64"
	"net/url"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

func as(t testing.TB, s *servertest.Server, token string) *servertest.Client { return s.As(t, token) }

func expect(t testing.TB, r *servertest.Response, status int, what string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: got %d, want %d: %s", what, r.Status, status, r.Body)
	}
	return r.JSON()
}

// tokenRequest posts a form to /oauth2/token.
func tokenRequest(t testing.TB, s *servertest.Server, form url.Values) (int, map[string]any) {
	t.Helper()
	return servertest.PostToken(t, s.URL, form)
}

func s256(verifier string) string {
	sum := sha256.Sum256([]byte(verifier))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// login runs the password login with PKCE and returns the token response.
func login(t testing.TB, s *servertest.Server, email, password, projectID string) map[string]any {
	t.Helper()
	verifier := "verifier-" + strings.Repeat("x", 40)
	body := map[string]any{"email": email, "password": password, "codeChallenge": s256(verifier), "codeChallengeMethod": "S256"}
	if projectID != "" {
		body["projectId"] = projectID
	}
	r := as(t, s, "").Do("POST", "auth/login", body, "application/json")
	out := expect(t, r, 200, "login "+email)
	code, _ := out["code"].(string)
	if code == "" {
		t.Fatalf("login %s: no code: %s", email, r.Body)
	}
	st, tok := tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier}})
	if st != 200 {
		t.Fatalf("token for %s: %d %v", email, st, tok)
	}
	return tok
}

func userToken(t testing.TB, s *servertest.Server, email, password, projectID string) string {
	return login(t, s, email, password, projectID)["access_token"].(string)
}

func ref(m map[string]any, field string) string {
	r, _ := m[field].(map[string]any)
	s, _ := r["reference"].(string)
	return s
}

func id(m map[string]any) string { s, _ := m["id"].(string); return s }

func entries(t testing.TB, r *servertest.Response) []map[string]any {
	t.Helper()
	b := expect(t, r, 200, "search")
	var out []map[string]any
	es, _ := b["entry"].([]any)
	for _, e := range es {
		em, _ := e.(map[string]any)
		res, _ := em["resource"].(map[string]any)
		out = append(out, res)
	}
	return out
}

func inviteBody(rt, first, last, email string) map[string]any {
	return map[string]any{"resourceType": rt, "firstName": first, "lastName": last, "email": email, "sendEmail": false}
}
