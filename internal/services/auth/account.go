package auth

import (
	"context"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/mail"
	"github.com/sandbot/sandbot/internal/password"
	"github.com/sandbot/sandbot/internal/principal"
)

// The account operations that the reference's web app and the
// @medplum/react forms call beyond login itself: the sign-in method of an
// e-mail, changing one's password, revoking a session and signing out.

// Method checks the e-mail of a sign-in method question. The answer is
// always the password form, since sandbot has no domains with external
// identity providers, and never tells whether the e-mail has an account.
func (a *Authenticator) Method(email string) error {
	if !mail.ValidAddress(strings.TrimSpace(email)) {
		return fhir.Invalid("Valid email address is required", "email")
	}
	return nil
}

// ChangePassword sets a signed-in user's password. confirm, when the form
// sent it, must be newPassword: the reference does not compare it, but a
// typo would otherwise set a password nobody knows.
func (a *Authenticator) ChangePassword(ctx context.Context, p *principal.Principal, oldPassword, newPassword string, confirm *string) error {
	typ, uid, _ := fhir.SplitReference(p.User)
	if typ != "User" || p.LoginID == "" {
		return fhir.Invalid("Only a user signed in with a password can change it")
	}
	if oldPassword == "" {
		return fhir.Invalid("Missing oldPassword", "oldPassword")
	}
	if err := password.Check(newPassword, "newPassword"); err != nil {
		return err
	}
	if confirm != nil && *confirm != newPassword {
		return fhir.Invalid("Passwords do not match", "confirmPassword")
	}
	hash, err := password.Hash(newPassword)
	if err != nil {
		return err
	}
	// A user may not write its User through the FHIR API (its role): the
	// server does, for the user.
	_, err = a.fhir.Modify(ctx, principal.System("", p.Author()), "User", uid, func(u fhir.Resource) (fhir.Resource, error) {
		if !password.Verify(u.String("passwordHash"), oldPassword) {
			return nil, fhir.Invalid("Incorrect password", "oldPassword")
		}
		u["passwordHash"] = hash
		return u, nil
	})
	return err
}

// Revoke ends one of the caller's own sessions. Another user's login is
// answered as not found.
func (a *Authenticator) Revoke(ctx context.Context, p *principal.Principal, loginID string) error {
	loginID = strings.TrimSpace(loginID)
	if !fhir.ValidID(loginID) {
		return fhir.Invalid("Login ID is required.", "loginId")
	}
	return a.revokeLogin(ctx, loginID, p.User)
}

// Logout revokes the login of the caller's token. A caller authenticated
// with client credentials on each request has no login to end.
func (a *Authenticator) Logout(ctx context.Context, p *principal.Principal) error {
	if p.LoginID == "" {
		return nil
	}
	return a.revokeLogin(ctx, p.LoginID, p.User)
}

// revokeLogin marks a login of userRef revoked: its tokens stop working and
// its refresh token is refused, at once on every replica (the store
// announces the change to every principal cache).
func (a *Authenticator) revokeLogin(ctx context.Context, loginID, userRef string) error {
	_, err := a.fhir.Modify(ctx, principal.System("", system), "Login", loginID, func(l fhir.Resource) (fhir.Resource, error) {
		normalizeLogin(l)
		if l.Ref("user") != userRef {
			return nil, fhir.ErrNotFound
		}
		l["revoked"] = true
		return l, nil
	})
	if fhir.IsCode(err, fhir.EGone) {
		err = fhir.ErrNotFound
	}
	return err
}
