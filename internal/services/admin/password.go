package admin

import (
	"context"
	"strings"
	"time"

	"github.com/sandbot/sandbot/fhir"
	smtpmail "github.com/sandbot/sandbot/internal/mail"
	"github.com/sandbot/sandbot/internal/password"
	"github.com/sandbot/sandbot/internal/principal"
)

// setPasswordLink is the web app's set-password page for a
// UserSecurityRequest, as the reference builds it:
// <app base URL>setpassword/<id>/<secret>.
func (s *Service) setPasswordLink(requestID, secret string) string {
	return s.BaseURL + "setpassword/" + requestID + "/" + secret
}

// deliver sends a mail after the work it reports on is done: a caller
// hanging up does not cancel it, and a failure is logged (never the body)
// and counted, not returned.
func (s *Service) deliver(ctx context.Context, msg smtpmail.Message, failure string) {
	sender := s.Mail
	if sender == nil {
		sender = &smtpmail.LogSender{Log: s.log()}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := sender.Send(ctx, msg); err != nil {
		s.log().WarnContext(ctx, failure, "err", err)
		if s.MailFailed != nil {
			s.MailFailed()
		}
	}
}

// RequestPasswordReset is POST /auth/resetpassword, the web app's "Reset
// Password" form: it mails a one-time set-password link to the User with
// this e-mail (the whole address, case aside: fhirservice UsersByEmail), the
// server-scoped User, or with projectID the User scoped to that project. An
// unknown e-mail is not an error, so that the answer never tells whether an
// account exists. The link works once, for as long as an invitation's.
// Without send (the form's sendEmail false) it only checks the request.
func (s *Service) RequestPasswordReset(ctx context.Context, email, projectID string, send bool) error {
	email = strings.ToLower(strings.TrimSpace(email))
	if len(email) < 3 || len(email) > 72 || !smtpmail.ValidAddress(email) {
		return fhir.Invalid("Valid email address between 3 and 72 characters is required", "email")
	}
	if projectID != "" && !fhir.ValidID(projectID) {
		return fhir.Invalid("Invalid projectId", "projectId")
	}
	if !send {
		return nil
	}
	users, err := s.FHIR.UsersByEmail(ctx, principal.System("", system), email)
	if err != nil {
		return err
	}
	want := ""
	if projectID != "" {
		want = "Project/" + projectID
	}
	var user fhir.Resource
	for _, u := range users {
		if u.Ref("project") == want {
			user = u
			break
		}
	}
	if user == nil {
		return nil
	}
	// The request lives with the User, in its home project.
	secret := password.NewSecret()
	req, err := s.FHIR.Create(ctx, principal.System(user.MetaProject(), system), fhir.Resource{"resourceType": "UserSecurityRequest", "type": "reset",
		"user": ref("User/" + user.ID()), "secret": password.HashSecret(secret), "used": false})
	if err != nil {
		return err
	}
	msg := smtpmail.Message{To: user.String("email"), Subject: "sandbot: reset your password",
		Link: s.setPasswordLink(req.ID, secret)}
	msg.Body = "Someone asked to reset the password of your account.\n\nSet a new password here:\n\n" + msg.Link +
		"\n\nThe link can be used once. If you did not ask for this, ignore this e-mail.\n"
	s.deliver(ctx, msg, "password reset e-mail could not be sent")
	return nil
}
