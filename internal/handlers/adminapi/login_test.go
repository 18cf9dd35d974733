package adminapi_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
)

func TestPasswordLogin(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "L")
		b := s.NewProject(t, "K")
		ca := as(t, s, a.Token)
		inv := inviteBody("Practitioner", "Lou", "Gin", "Lou@Example.com")
		inv["password"] = "correct horse"
		m := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inv, ""), 200, "invite")
		anon := as(t, s, "")

		// One membership: {login, code}; code + S256 verifier → tokens.
		tok := login(t, s, "lou@example.com", "correct horse", "")
		if tok["refresh_token"] == nil || tok["token_type"] != "Bearer" || ref(tok, "profile") != ref(m, "profile") || ref(tok, "project") != "Project/"+a.ProjectID {
			t.Fatalf("token response: %v", tok)
		}
		me := expect(t, as(t, s, tok["access_token"].(string)).Do("GET", "auth/me", nil, ""), 200, "me")
		if "Practitioner/"+id(me["profile"].(map[string]any)) != ref(m, "profile") {
			t.Fatalf("me: %v", me)
		}

		// Wrong password and unknown e-mail: the same answer.
		r1 := expect2(t, anon.Do("POST", "auth/login", map[string]any{"email": "lou@example.com", "password": "wrong password"}, "application/json"), 400)
		r2 := expect2(t, anon.Do("POST", "auth/login", map[string]any{"email": "nobody@example.com", "password": "wrong password"}, "application/json"), 400)
		if r1.Issue() != r2.Issue() || r1.Issue() == "" {
			t.Fatalf("failed logins must not differ: %q vs %q", r1.Issue(), r2.Issue())
		}
		// Timing: the unknown e-mail also pays for a bcrypt comparison.
		start := time.Now()
		anon.Do("POST", "auth/login", map[string]any{"email": "nobody2@example.com", "password": "x"}, "application/json")
		if d := time.Since(start); d < 10*time.Millisecond {
			t.Errorf("unknown e-mail answered in %v: no dummy bcrypt comparison?", d)
		}
		expect(t, anon.Do("POST", "auth/login", map[string]any{"email": "lou@example.com"}, "application/json"), 400, "no password")

		// PKCE: plain works; a wrong verifier fails; a code is used once.
		lr := expect(t, anon.Do("POST", "auth/login", map[string]any{"email": "lou@example.com", "password": "correct horse", "codeChallenge": "plain-verifier-123", "codeChallengeMethod": "plain"}, "application/json"), 200, "plain login")
		code := lr["code"].(string)
		st, out := tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {"wrong"}})
		if st != 400 || out["error"] != "invalid_grant" {
			t.Fatalf("wrong verifier: %d %v", st, out)
		}
		st, out = tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {"plain-verifier-123"}})
		if st != 200 {
			t.Fatalf("plain verifier: %d %v", st, out)
		}
		st, _ = tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {"plain-verifier-123"}})
		if st != 400 {
			t.Fatalf("a code is used once: %d", st)
		}
		lr = expect(t, anon.Do("POST", "auth/login", map[string]any{"email": "lou@example.com", "password": "correct horse", "codeChallenge": s256("v"), "codeChallengeMethod": "S256"}, "application/json"), 200, "s256 login")
		if st, _ := tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {lr["code"].(string)}}); st != 400 {
			t.Fatalf("missing verifier: %d", st)
		}

		// Refresh rotates: the new token works, the old one does not.
		rt := tok["refresh_token"].(string)
		st, ref1 := tokenRequest(t, s, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}})
		if st != 200 || ref1["access_token"] == nil || ref1["refresh_token"] == rt {
			t.Fatalf("refresh: %d %v", st, ref1)
		}
		if st, _ := tokenRequest(t, s, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}}); st != 400 {
			t.Fatalf("old refresh token reused: %d", st)
		}
		expect(t, as(t, s, ref1["access_token"].(string)).Do("GET", "auth/me", nil, ""), 200, "refreshed token")
		// Client credentials still get no refresh token.
		_, cc := tokenRequest(t, s, url.Values{"grant_type": {"client_credentials"}, "client_id": {servertest.AdminClientID}, "client_secret": {servertest.AdminClientSecret}})
		if _, ok := cc["refresh_token"]; ok {
			t.Fatal("client_credentials must not answer a refresh token")
		}

		// Two memberships: choose with /auth/profile.
		inv2 := inviteBody("Practitioner", "Lou", "Gin", "lou@example.com")
		mb := expect(t, as(t, s, b.Token).Do("POST", "admin/projects/"+b.ProjectID+"/invite", inv2, ""), 200, "invite in B")
		lr = expect(t, anon.Do("POST", "auth/login", map[string]any{"email": "lou@example.com", "password": "correct horse"}, "application/json"), 200, "two memberships")
		if lr["code"] != nil || len(lr["memberships"].([]any)) != 2 {
			t.Fatalf("choice: %v", lr)
		}
		pr := expect(t, anon.Do("POST", "auth/profile", map[string]any{"login": lr["login"], "profile": id(mb)}, "application/json"), 200, "profile")
		st, out = tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {pr["code"].(string)}})
		if st != 200 || ref(out, "project") != "Project/"+b.ProjectID {
			t.Fatalf("chosen membership: %d %v", st, out)
		}
		expect(t, anon.Do("POST", "auth/profile", map[string]any{"login": lr["login"], "profile": id(m)}, "application/json"), 400, "profile chosen twice")
		// projectId selects directly.
		if tb := login(t, s, "lou@example.com", "correct horse", b.ProjectID); ref(tb, "project") != "Project/"+b.ProjectID {
			t.Fatalf("projectId: %v", tb)
		}

		// A project-scoped user logs in only to its project.
		pinv := inviteBody("Patient", "Pat", "Scoped", "scoped@example.com")
		pinv["password"] = "patient password"
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", pinv, ""), 200, "invite patient")
		if tp := login(t, s, "scoped@example.com", "patient password", a.ProjectID); tp["patient"] == nil {
			t.Fatalf("patient login: %v", tp)
		}
		login(t, s, "scoped@example.com", "patient password", "")
		expect(t, anon.Do("POST", "auth/login", map[string]any{"email": "scoped@example.com", "password": "patient password", "projectId": b.ProjectID}, "application/json"), 400, "other project")

		// passwordHash is never returned.
		for _, path := range []string{"fhir/R4/User?email=lou@example.com", "fhir/R4/" + ref(m, "user")} {
			r := as(t, s, s.SuperAdmin(t).Token).Do("GET", path, nil, "")
			if r.Status != 200 || strings.Contains(string(r.Body), "passwordHash") || strings.Contains(string(r.Body), "$2a$") {
				t.Fatalf("%s leaks the password hash: %d %s", path, r.Status, r.Body)
			}
		}
	})
}

func TestAuthRateLimit(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		anon := as(t, s, "")
		var last int
		for i := 0; i < 6; i++ {
			last = anon.Do("POST", "auth/login", map[string]any{"email": "x@example.com", "password": "y"}, "application/json").Status
		}
		if last != 429 {
			t.Fatalf("6th login with a limit of 5: %d", last)
		}
		r := anon.Do("POST", "auth/login", map[string]any{"email": "x@example.com", "password": "y"}, "application/json")
		if r.Status != 429 || r.JSON()["resourceType"] != "OperationOutcome" || r.Header.Get("Retry-After") == "" {
			t.Fatalf("429 outcome: %d %s", r.Status, r.Body)
		}
		if st, _ := tokenRequest(t, s, url.Values{"grant_type": {"client_credentials"}}); st != 429 {
			t.Fatalf("token endpoint limited too: %d", st)
		}
		// /auth/me is exempt (401 here: no token, but not 429).
		if st := anon.Do("GET", "auth/me", nil, "").Status; st != 401 {
			t.Fatalf("/auth/me must be exempt: %d", st)
		}
		// Other API routes are not limited.
		if st := anon.Do("GET", "fhir/R4/Patient", nil, "").Status; st != 401 {
			t.Fatalf("FHIR API must not be limited: %d", st)
		}
	}, func(c *server.Config) { c.Limits.AuthRequestsPerMinute = 5 })
}
