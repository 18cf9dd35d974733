package adminapi_test

import (
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
)

// TestResetPasswordFindsTheExactEmail: POST /auth/resetpassword mails the
// account whose e-mail is the one given, compared whole and without regard
// to case. An e-mail that only begins another account's (bob@example.co for
// bob@example.com) has no account: nothing is sent, to anyone.
func TestResetPasswordFindsTheExactEmail(t *testing.T) {
	smtp := startSMTP(t)
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "Reset")
		expect(t, as(t, s, a.Token).Do("POST", "admin/projects/"+a.ProjectID+"/invite", inviteBody("Practitioner", "Bob", "Exact", "bob@example.com"), ""), 200, "invite")
		anon := s.Anonymous(t)
		noMail := func(what string) {
			t.Helper()
			select {
			case m := <-smtp.mail:
				t.Fatalf("%s: a mail went to %s", what, m.To)
			case <-time.After(300 * time.Millisecond):
			}
		}
		for _, email := range []string{"bob@example.co", "bob@example.c", "ob@example.com", "bob@example.com.au"} {
			expect(t, anon.Do("POST", "auth/resetpassword", map[string]any{"email": email}, "application/json"), 200, "reset "+email)
			noMail("reset for " + email)
		}
		expect(t, anon.Do("POST", "auth/resetpassword", map[string]any{"email": "BOB@Example.com"}, "application/json"), 200, "reset in capitals")
		select {
		case m := <-smtp.mail:
			if m.To != "bob@example.com" || linkPattern.FindStringSubmatch(m.Data) == nil {
				t.Fatalf("reset mail to %s: %s", m.To, m.Data)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no reset mail for BOB@Example.com")
		}
	}, func(c *server.Config) {
		c.SMTPURL = "smtp://" + smtp.ln.Addr().String() + "?from=admin@sandbot.test&tls=none"
	})
}
