package mail

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// TestLogSenderLogsLinkNeverBody: without SMTP the set-password link is
// logged so that an operator can hand it over; the body never is.
func TestLogSenderLogsLinkNeverBody(t *testing.T) {
	var buf bytes.Buffer
	s, err := New("", slog.New(slog.NewJSONHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	link := "https://app.example.test/setpassword/id-1/secret-1"
	err = s.Send(context.Background(), Message{To: "ada@example.com", Subject: "Welcome",
		Body: "private body text " + link, Link: link})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, `"set_password_link":"`+link+`"`) || !strings.Contains(out, `"to_domain":"example.com"`) {
		t.Errorf("log lacks the link or the domain: %s", out)
	}
	if strings.Contains(out, "private body text") || strings.Contains(out, "ada@") {
		t.Errorf("log carries the body or the address: %s", out)
	}
	buf.Reset()
	s.Send(context.Background(), Message{To: "bo@example.com", Subject: "Added", Body: "no link here"})
	if strings.Contains(buf.String(), "set_password_link") || strings.Contains(buf.String(), "no link here") {
		t.Errorf("a mail without a link: %s", buf.String())
	}
}
