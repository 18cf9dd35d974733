package adminapi_test

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
)

const appBase = "http://app.example.test:3000/"

// loginID is the login_id claim of an access token.
func loginID(t *testing.T, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", token)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		LoginID string `json:"login_id"`
	}
	json.Unmarshal(b, &claims)
	return claims.LoginID
}

func menuTitles(me map[string]any) []string {
	cfg, _ := me["config"].(map[string]any)
	menu, _ := cfg["menu"].([]any)
	var out []string
	for _, m := range menu {
		mm, _ := m.(map[string]any)
		title, _ := mm["title"].(string)
		links, _ := mm["link"].([]any)
		if len(links) == 0 {
			title += "(empty)"
		}
		out = append(out, title)
	}
	return out
}

func sessionIDs(me map[string]any) []string {
	sec, _ := me["security"].(map[string]any)
	list, _ := sec["sessions"].([]any)
	var out []string
	for _, s := range list {
		out = append(out, s.(map[string]any)["id"].(string))
	}
	return out
}

func expression(r *servertest.Response) string {
	var o struct {
		Issue []struct {
			Expression []string `json:"expression"`
		} `json:"issue"`
	}
	json.Unmarshal(r.Body, &o)
	if len(o.Issue) == 0 || len(o.Issue[0].Expression) == 0 {
		return ""
	}
	return o.Issue[0].Expression[0]
}

// TestWebAppAccountEndpoints drives the /auth endpoints the web app's
// sign-in, security, change-password and reset-password pages call, through
// the real server: /auth/method, /auth/me's config and security,
// /auth/changepassword, /auth/revoke, /oauth2/logout, /auth/resetpassword
// (a link to the app's set-password page), /auth/scope, and the clear 400s
// of features sandbot does not have.
func TestWebAppAccountEndpoints(t *testing.T) {
	smtp := startSMTP(t)
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		anon := as(t, s, "")
		a := s.NewProject(t, "Web")
		ca := as(t, s, a.Token)
		body := inviteBody("Practitioner", "Ada", "Web", "ada@example.com")
		body["password"] = "first-password"
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", body, ""), 200, "invite")
		adminBody := inviteBody("Practitioner", "Bo", "Admin", "bo@example.com")
		adminBody["password"] = "bo-password"
		adminBody["admin"] = true
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", adminBody, ""), 200, "invite admin")

		// /auth/method: {} for any valid e-mail, known or not.
		for _, e := range []string{"ada@example.com", "nobody@example.com"} {
			r := anon.Do("POST", "auth/method", map[string]any{"email": e}, "application/json")
			if r.Status != 200 || strings.TrimSpace(string(r.Body)) != "{}" {
				t.Fatalf("method %s: %d %s", e, r.Status, r.Body)
			}
		}
		for _, bad := range []any{"", "not-an-email", "Ada <ada@example.com>", 42} {
			r := anon.Do("POST", "auth/method", map[string]any{"email": bad}, "application/json")
			if r.Status != 400 || expression(r) != "email" {
				t.Fatalf("method %v: %d %s", bad, r.Status, r.Body)
			}
		}
		expect(t, anon.Do("POST", "auth/method", "[1]", "application/json"), 400, "method array")
		expect(t, anon.Do("POST", "auth/method", "email=x", "text/plain"), 415, "method text")

		// /auth/me: the menu by role, and the user's sessions.
		tok1 := userToken(t, s, "ada@example.com", "first-password", "")
		tok2 := userToken(t, s, "ada@example.com", "first-password", "")
		me := expect(t, as(t, s, tok1).Do("GET", "auth/me", nil, ""), 200, "me")
		if got := strings.Join(menuTitles(me), ","); got != "Favorites" {
			t.Errorf("member menu: %s", got)
		}
		sec, _ := me["security"].(map[string]any)
		if sec == nil || sec["mfaEnrolled"] != false {
			t.Fatalf("security: %v", me["security"])
		}
		ids := strings.Join(sessionIDs(me), ",")
		if !strings.Contains(ids, loginID(t, tok1)) || !strings.Contains(ids, loginID(t, tok2)) {
			t.Fatalf("sessions %s lack %s and %s", ids, loginID(t, tok1), loginID(t, tok2))
		}
		adminMe := expect(t, as(t, s, userToken(t, s, "bo@example.com", "bo-password", "")).Do("GET", "auth/me", nil, ""), 200, "admin me")
		if got := strings.Join(menuTitles(adminMe), ","); got != "Favorites,Admin" {
			t.Errorf("admin menu: %s", got)
		}
		// Bo's sessions are Bo's only.
		if strings.Contains(strings.Join(sessionIDs(adminMe), ","), loginID(t, tok1)) {
			t.Errorf("admin sees another user's session")
		}
		superMe := expect(t, s.SuperAdmin(t).Do("GET", "auth/me", nil, ""), 200, "super me")
		if got := strings.Join(menuTitles(superMe), ","); got != "Favorites,Admin,Super Admin" {
			t.Errorf("super admin menu: %s", got)
		}
		if _, ok := superMe["security"]; ok {
			t.Errorf("a client has a security section: %v", superMe["security"])
		}

		// /auth/revoke: one's own other session; another user's is not found.
		c1 := as(t, s, tok1)
		expect(t, c1.Do("POST", "auth/revoke", map[string]any{"loginId": "../x"}, "application/json"), 400, "revoke bad id")
		expect(t, as(t, s, userToken(t, s, "bo@example.com", "bo-password", "")).Do("POST", "auth/revoke",
			map[string]any{"loginId": loginID(t, tok2)}, "application/json"), 404, "revoke another user's login")
		expect(t, as(t, s, tok2).Do("GET", "auth/me", nil, ""), 200, "other user's revoke had no effect")
		expect(t, c1.Do("POST", "auth/revoke", map[string]any{"loginId": loginID(t, tok2)}, "application/json"), 200, "revoke")
		expect(t, as(t, s, tok2).Do("GET", "auth/me", nil, ""), 401, "revoked token")
		me = expect(t, c1.Do("GET", "auth/me", nil, ""), 200, "me after revoke")
		if strings.Contains(strings.Join(sessionIDs(me), ","), loginID(t, tok2)) {
			t.Errorf("revoked login still listed")
		}
		expect(t, as(t, s, "").Do("POST", "auth/revoke", map[string]any{"loginId": loginID(t, tok1)}, "application/json"), 401, "revoke anonymous")

		// /auth/changepassword.
		for _, tc := range []struct {
			body map[string]any
			expr string
		}{
			{map[string]any{"oldPassword": "wrong-password", "newPassword": "second-password"}, "oldPassword"},
			{map[string]any{"newPassword": "second-password"}, "oldPassword"},
			{map[string]any{"oldPassword": "first-password", "newPassword": "short"}, "newPassword"},
			{map[string]any{"oldPassword": "first-password", "newPassword": strings.Repeat("x", 73)}, "newPassword"},
			{map[string]any{"oldPassword": "first-password", "newPassword": "second-password", "confirmPassword": "second-passw0rd"}, "confirmPassword"},
		} {
			r := c1.Do("POST", "auth/changepassword", tc.body, "application/json")
			if r.Status != 400 || expression(r) != tc.expr {
				t.Fatalf("changepassword %v: %d %s", tc.body, r.Status, r.Body)
			}
		}
		expect(t, ca.Do("POST", "auth/changepassword", map[string]any{"oldPassword": "x", "newPassword": "second-password"}, "application/json"), 400, "client changes password")
		expect(t, anon.Do("POST", "auth/changepassword", map[string]any{"oldPassword": "x", "newPassword": "second-password"}, "application/json"), 401, "anonymous changes password")
		expect(t, c1.Do("POST", "auth/changepassword", map[string]any{"oldPassword": "first-password", "newPassword": "second-password", "confirmPassword": "second-password"}, "application/json"), 200, "changepassword")
		expect(t, anon.Do("POST", "auth/login", map[string]any{"email": "ada@example.com", "password": "first-password"}, "application/json"), 400, "old password")
		tok3 := userToken(t, s, "ada@example.com", "second-password", "")

		// /oauth2/logout ends the session of the token (and its refresh token).
		full := login(t, s, "ada@example.com", "second-password", "")
		c4 := as(t, s, full["access_token"].(string))
		expect(t, c4.Do("POST", "oauth2/logout", map[string]any{}, ""), 200, "logout")
		expect(t, c4.Do("GET", "auth/me", nil, ""), 401, "after logout")
		if st, _ := tokenRequest(t, s, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {full["refresh_token"].(string)}}); st != 400 {
			t.Errorf("refresh after logout: %d", st)
		}
		expect(t, as(t, s, tok3).Do("GET", "auth/me", nil, ""), 200, "other session survives logout")
		expect(t, as(t, s, tok3).Do("GET", "oauth2/logout", nil, ""), 200, "logout by GET")
		expect(t, as(t, s, tok3).Do("GET", "auth/me", nil, ""), 401, "after GET logout")
		expect(t, anon.Do("POST", "oauth2/logout", map[string]any{}, ""), 401, "anonymous logout")

		// /auth/scope: a new code for the chosen scope; the old code is void.
		verifier := "verifier-" + strings.Repeat("y", 40)
		lr := expect(t, anon.Do("POST", "auth/login", map[string]any{"email": "ada@example.com", "password": "second-password",
			"codeChallenge": s256(verifier), "codeChallengeMethod": "S256"}, "application/json"), 200, "login for scope")
		expect(t, anon.Do("POST", "auth/scope", map[string]any{"login": lr["login"]}, "application/json"), 400, "scope missing")
		expect(t, anon.Do("POST", "auth/scope", map[string]any{"login": "00000000-0000-0000-0000-000000000000", "scope": "openid"}, "application/json"), 400, "scope unknown login")
		sr := expect(t, anon.Do("POST", "auth/scope", map[string]any{"login": lr["login"], "scope": "openid offline"}, "application/json"), 200, "scope")
		if sr["login"] != lr["login"] || sr["code"] == lr["code"] || sr["code"] == "" {
			t.Fatalf("scope answer %v (login answer %v)", sr, lr)
		}
		if st, _ := tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {lr["code"].(string)}, "code_verifier": {verifier}}); st != 400 {
			t.Errorf("old code after scope: %d", st)
		}
		st, tok := tokenRequest(t, s, url.Values{"grant_type": {"authorization_code"}, "code": {sr["code"].(string)}, "code_verifier": {verifier}})
		if st != 200 || tok["scope"] != "openid offline" {
			t.Fatalf("token after scope: %d %v", st, tok)
		}
		expect(t, anon.Do("POST", "auth/scope", map[string]any{"login": lr["login"], "scope": "openid"}, "application/json"), 400, "scope after grant")

		// /auth/resetpassword mails a link to the app's set-password page;
		// an unknown e-mail gets the same answer and no mail.
		expect(t, anon.Do("POST", "auth/resetpassword", map[string]any{"email": "nobody@example.com", "recaptchaToken": "x"}, "application/json"), 200, "reset unknown")
		select {
		case m := <-smtp.mail:
			t.Fatalf("mail for an unknown e-mail: %s", m.To)
		case <-time.After(300 * time.Millisecond):
		}
		expect(t, anon.Do("POST", "auth/resetpassword", map[string]any{"email": "x"}, "application/json"), 400, "reset bad e-mail")
		expect(t, anon.Do("POST", "auth/resetpassword", map[string]any{"email": "ADA@example.com"}, "application/json"), 200, "reset")
		var msg smtpMessage
		select {
		case msg = <-smtp.mail:
		case <-time.After(10 * time.Second):
			t.Fatal("no reset mail")
		}
		link := linkPattern.FindStringSubmatch(msg.Data)
		if msg.To != "ada@example.com" || link == nil || link[1] != appBase {
			t.Fatalf("reset mail to %s without a link to %s: %s", msg.To, appBase, msg.Data)
		}
		expect(t, anon.Do("POST", "auth/setpassword", map[string]any{"id": link[2], "secret": link[3], "password": "third-password"}, "application/json"), 200, "set password from reset")
		userToken(t, s, "ada@example.com", "third-password", "")

		// Invitations link to the app too.
		nb := inviteBody("Practitioner", "Cy", "New", "cy@example.com")
		nb["sendEmail"] = true
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", nb, ""), 200, "invite with mail")
		select {
		case msg = <-smtp.mail:
		case <-time.After(10 * time.Second):
			t.Fatal("no invitation mail")
		}
		if link := linkPattern.FindStringSubmatch(msg.Data); link == nil || link[1] != appBase {
			t.Fatalf("invitation without a link to %s: %s", appBase, msg.Data)
		}

		// Features sandbot does not have: a 400 OperationOutcome saying so.
		for _, rq := range []struct{ method, path string }{
			{"GET", "auth/mfa/status"}, {"POST", "auth/mfa/enroll"}, {"POST", "auth/mfa/verify"}, {"POST", "auth/mfa/login-enroll"},
			{"POST", "auth/google"}, {"POST", "auth/newuser"}, {"POST", "auth/newproject"}, {"POST", "auth/newpatient"},
			{"POST", "auth/exchange"}, {"GET", "auth/external"}, {"GET", "auth/login/00000000-0000-0000-0000-000000000000"},
			{"POST", "auth/verifyemail"}, {"GET", "oauth2/authorize"}, {"GET", "oauth2/userinfo"},
		} {
			var b any
			if rq.method == "POST" {
				b = map[string]any{}
			}
			r := c1.Do(rq.method, rq.path, b, "application/json")
			if r.Status != 400 || !strings.Contains(r.Issue(), "not") || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/fhir+json") {
				t.Errorf("%s %s: %d %s %s", rq.method, rq.path, r.Status, r.Header.Get("Content-Type"), r.Body)
			}
		}
	}, func(c *server.Config) {
		c.SMTPURL = "smtp://" + smtp.ln.Addr().String() + "?from=admin@sandbot.test&tls=none"
		c.AppBaseURL = appBase
	})
}
