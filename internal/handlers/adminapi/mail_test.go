package adminapi_test

import (
	"bufio"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
)

// smtpServer is a minimal SMTP server (no TLS, no AUTH) that delivers every
// message it receives to a channel.
type smtpServer struct {
	ln   net.Listener
	mail chan smtpMessage
}

type smtpMessage struct {
	From, To string
	Data     string
}

func startSMTP(t *testing.T) *smtpServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &smtpServer{ln: ln, mail: make(chan smtpMessage, 10)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *smtpServer) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	reply := func(line string) { c.Write([]byte(line + "\r\n")) }
	reply("220 test ESMTP")
	var msg smtpMessage
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		cmd := strings.ToUpper(strings.TrimSpace(line))
		switch {
		case strings.HasPrefix(cmd, "EHLO"), strings.HasPrefix(cmd, "HELO"):
			reply("250-test")
			reply("250 8BITMIME")
		case strings.HasPrefix(cmd, "MAIL FROM:"):
			msg.From = strings.TrimSpace(line[len("MAIL FROM:"):])
			reply("250 OK")
		case strings.HasPrefix(cmd, "RCPT TO:"):
			msg.To = strings.Trim(strings.TrimSpace(line[len("RCPT TO:"):]), "<>")
			reply("250 OK")
		case cmd == "DATA":
			reply("354 go ahead")
			var b strings.Builder
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
				b.WriteString(strings.TrimPrefix(l, "."))
			}
			msg.Data = b.String()
			s.mail <- msg
			reply("250 queued")
		case cmd == "QUIT":
			reply("221 bye")
			return
		default:
			reply("250 OK")
		}
	}
}

var linkPattern = regexp.MustCompile(`(http://\S+/)setpassword/([^/\s]+)/([^/\s]+)`)

func TestInviteMailSetPasswordLogin(t *testing.T) {
	smtp := startSMTP(t)
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		{
			a := s.NewProject(t, "Mailed")
			ca := as(t, s, a.Token)
			body := inviteBody("Practitioner", "Mae", "Ling", "mae@example.com")
			body["sendEmail"] = true
			m := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", body, ""), 200, "invite")
			var msg smtpMessage
			select {
			case msg = <-smtp.mail:
			case <-time.After(10 * time.Second):
				t.Fatal("no mail arrived")
			}
			if msg.To != "mae@example.com" || !strings.Contains(msg.Data, "Subject: Welcome to sandbot") {
				t.Fatalf("mail: %+v", msg)
			}
			link := linkPattern.FindStringSubmatch(msg.Data)
			if link == nil || link[1] != s.URL {
				t.Fatalf("no set-password link for %s in: %s", s.URL, msg.Data)
			}
			anon := as(t, s, "")
			expect(t, anon.Do("POST", "auth/setpassword", map[string]any{"id": link[2], "secret": "wrong", "password": "brand-new-pw"}, "application/json"), 400, "wrong secret")
			expect(t, anon.Do("POST", "auth/setpassword", map[string]any{"id": link[2], "secret": link[3], "password": "short"}, "application/json"), 400, "short password")
			expect(t, anon.Do("POST", "auth/setpassword", map[string]any{"id": link[2], "secret": link[3], "password": "brand-new-pw"}, "application/json"), 200, "set password")
			expect(t, anon.Do("POST", "auth/setpassword", map[string]any{"id": link[2], "secret": link[3], "password": "another-pw-1"}, "application/json"), 400, "link used twice")

			tok := login(t, s, "mae@example.com", "brand-new-pw", "")
			me := expect(t, as(t, s, tok["access_token"].(string)).Do("GET", "auth/me", nil, ""), 200, "me")
			prof := me["profile"].(map[string]any)
			if "Practitioner/"+id(prof) != ref(m, "profile") || me["project"].(map[string]any)["id"] != a.ProjectID {
				t.Fatalf("me: %v", me)
			}
			// An existing user gets the "welcome to project" mail without a link.
			b2 := s.NewProject(t, "Second")
			body["sendEmail"] = "true"
			expect(t, as(t, s, b2.Token).Do("POST", "admin/projects/"+b2.ProjectID+"/invite", body, ""), 200, "existing user")
			select {
			case msg = <-smtp.mail:
				if !strings.Contains(msg.Data, "Welcome to Second") || strings.Contains(msg.Data, "setpassword") {
					t.Fatalf("existing-user mail: %s", msg.Data)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no mail for the existing user")
			}
			// sendEmail "false" (a string) sends nothing.
			b3 := inviteBody("Patient", "No", "Mail", "nomail@example.com")
			b3["sendEmail"] = "false"
			expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", b3, ""), 200, "no mail")
			select {
			case msg = <-smtp.mail:
				t.Fatalf("sendEmail \"false\" sent a mail to %s", msg.To)
			case <-time.After(300 * time.Millisecond):
			}
		}
	}, func(c *server.Config) {
		c.SMTPURL = "smtp://" + smtp.ln.Addr().String() + "?from=admin@sandbot.test&tls=none"
	})
}

func TestInviteMailFailureKeepsMembership(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close() // nothing listens there
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		{
			a := s.NewProject(t, "Fail")
			ca := as(t, s, a.Token)
			body := inviteBody("Practitioner", "Fay", "Lure", "fay@example.com")
			delete(body, "sendEmail")
			m := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", body, ""), 200, "invite")
			if m["resourceType"] != "ProjectMembership" {
				t.Fatalf("answer: %v", m)
			}
			expect(t, ca.Do("GET", "admin/projects/"+a.ProjectID+"/members/"+id(m), nil, ""), 200, "membership kept")
			if n := servertest.MetricValue(t, s.Registry, "sandbot_invite_email_failures_total"); n != 1 {
				t.Fatalf("sandbot_invite_email_failures_total is %v, want 1", n)
			}
		}
	}, func(c *server.Config) { c.SMTPURL = "smtp://" + addr + "?tls=none" })
}
