// Package mail sends the server's e-mails (invitations, password resets)
// through SMTP, or logs that a mail would have been sent when no SMTP server
// is configured. Neither path ever logs a mail body. Without SMTP the
// set-password link a mail carries is logged, so that the operator can hand
// it to the user: otherwise nobody invited could ever set a password.
package mail

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"net/smtp"
	"net/url"
	"strings"
	"time"
)

// ValidAddress reports whether s is a bare e-mail address ("a@b.c", not
// "A <a@b.c>"), at most 320 bytes: what the sign-in and reset forms accept.
func ValidAddress(s string) bool {
	a, err := mail.ParseAddress(s)
	return err == nil && a.Address == s && len(s) <= 320
}

// Message is one plain-text e-mail.
type Message struct {
	To      string
	Subject string
	Body    string
	// Link is the set-password link the body carries, if any: the log
	// sender writes it (and only it) to the log.
	Link string
}

// Sender sends messages.
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// New returns the sender for an SMTP URL: "" logs instead of sending;
// smtp://[user:pass@]host[:port][?from=addr&tls=starttls|none] sends through
// the server (port 25 by default); smtps:// uses implicit TLS (port 465).
func New(smtpURL string, log *slog.Logger) (Sender, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if smtpURL == "" {
		return &LogSender{Log: log}, nil
	}
	u, err := url.Parse(smtpURL)
	if err != nil {
		return nil, errors.New("mail: invalid SMTP URL")
	}
	s := &SMTPSender{From: "sandbot@localhost", Timeout: 10 * time.Second}
	switch u.Scheme {
	case "smtp":
		s.Addr = hostPort(u.Host, "25")
		s.StartTLS = u.Query().Get("tls") != "none"
	case "smtps":
		s.Addr = hostPort(u.Host, "465")
		s.ImplicitTLS = true
	default:
		return nil, fmt.Errorf("mail: unsupported SMTP URL scheme %q", u.Scheme)
	}
	if f := u.Query().Get("from"); f != "" {
		s.From = f
	}
	if u.User != nil {
		s.Username = u.User.Username()
		s.Password, _ = u.User.Password()
	}
	return s, nil
}

func hostPort(h, port string) string {
	if _, _, err := net.SplitHostPort(h); err == nil {
		return h
	}
	return net.JoinHostPort(h, port)
}

// LogSender logs that a mail would be sent: the recipient's domain, the
// subject and the set-password link when there is one, never the body.
type LogSender struct{ Log *slog.Logger }

// Send implements Sender.
func (l *LogSender) Send(ctx context.Context, m Message) error {
	_, domain, _ := strings.Cut(m.To, "@")
	attrs := []any{"to_domain", domain, "subject", m.Subject}
	if m.Link != "" {
		attrs = append(attrs, "set_password_link", m.Link)
	}
	l.Log.InfoContext(ctx, "e-mail not sent: no SMTP server configured (SANDBOT_SMTP_URL)", attrs...)
	return nil
}

// SMTPSender sends through an SMTP server.
type SMTPSender struct {
	Addr               string
	From               string
	Username, Password string
	// StartTLS upgrades the connection when the server offers it.
	StartTLS bool
	// ImplicitTLS connects with TLS from the start (smtps).
	ImplicitTLS bool
	Timeout     time.Duration
}

// Send implements Sender.
func (s *SMTPSender) Send(ctx context.Context, m Message) error {
	if strings.ContainsAny(m.To, "\r\n") || strings.ContainsAny(m.Subject, "\r\n") {
		return errors.New("mail: header injection attempt")
	}
	deadline := time.Now().Add(s.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	dialer := &net.Dialer{Deadline: deadline}
	host, _, _ := net.SplitHostPort(s.Addr)
	var conn net.Conn
	var err error
	if s.ImplicitTLS {
		conn, err = tls.DialWithDialer(dialer, "tcp", s.Addr, &tls.Config{ServerName: host})
	} else {
		conn, err = dialer.DialContext(ctx, "tcp", s.Addr)
	}
	if err != nil {
		return fmt.Errorf("mail: connect: %w", err)
	}
	defer conn.Close()
	conn.SetDeadline(deadline)
	c, err := smtp.NewClient(conn, host)
	if err != nil {
		return fmt.Errorf("mail: greeting: %w", err)
	}
	defer c.Close()
	if err := c.Hello("localhost"); err != nil {
		return fmt.Errorf("mail: hello: %w", err)
	}
	if s.StartTLS && !s.ImplicitTLS {
		if ok, _ := c.Extension("STARTTLS"); ok {
			if err := c.StartTLS(&tls.Config{ServerName: host}); err != nil {
				return fmt.Errorf("mail: starttls: %w", err)
			}
		}
	}
	if s.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", s.Username, s.Password, host)); err != nil {
			return fmt.Errorf("mail: auth: %w", err)
		}
	}
	if err := c.Mail(s.From); err != nil {
		return fmt.Errorf("mail: MAIL FROM: %w", err)
	}
	if err := c.Rcpt(m.To); err != nil {
		return fmt.Errorf("mail: RCPT TO: %w", err)
	}
	wc, err := c.Data()
	if err != nil {
		return fmt.Errorf("mail: DATA: %w", err)
	}
	msg := "From: " + s.From + "\r\nTo: " + m.To + "\r\nSubject: " + m.Subject +
		"\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nDate: " + time.Now().UTC().Format(time.RFC1123Z) +
		"\r\n\r\n" + strings.ReplaceAll(strings.ReplaceAll(m.Body, "\r\n", "\n"), "\n", "\r\n") + "\r\n"
	if _, err := wc.Write([]byte(msg)); err != nil {
		return fmt.Errorf("mail: write: %w", err)
	}
	if err := wc.Close(); err != nil {
		return fmt.Errorf("mail: end of data: %w", err)
	}
	return c.Quit()
}
