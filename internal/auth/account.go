package auth

import (
	"context"
	"net/http"
	"net/mail"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/internal/password"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// The sign-in and account endpoints that the reference's web app and the
// @medplum/react forms call beyond login itself: the sign-in method of an
// e-mail, changing one's password, revoking a session, signing out and
// choosing a login's scope. Features sandbot does not have (multi-factor
// authentication, Google and external identity providers, self-registration,
// e-mail verification) answer 400 with an OperationOutcome that says so,
// never a 404 or a 5xx that the client would retry.

// RegisterAccount mounts the account endpoints on r.
func (a *Authenticator) RegisterAccount(r *mux.Router) {
	r.HandleFunc("/auth/method", a.handleMethod).Methods(http.MethodPost)
	r.Handle("/auth/changepassword", a.Require(http.HandlerFunc(a.handleChangePassword))).Methods(http.MethodPost)
	r.Handle("/auth/revoke", a.Require(http.HandlerFunc(a.handleRevoke))).Methods(http.MethodPost)
	r.Handle("/oauth2/logout", a.Require(http.HandlerFunc(a.handleLogout))).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/auth/scope", a.handleScope).Methods(http.MethodPost)
	for _, u := range unsupported {
		msg := u.message
		r.Handle(u.path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			httpx.WriteError(w, r, a.log, fhir.Invalid(msg))
		}))
	}
}

// unsupported lists the reference's sign-in paths for features sandbot does
// not offer, with what to tell the caller.
var unsupported = []struct{ path, message string }{
	{"/auth/mfa/{rest:.*}", "Multi-factor authentication is not supported by this server"},
	{"/auth/google", "Google sign-in is not supported by this server: sign in with an e-mail and password"},
	{"/auth/exchange", "External identity providers are not supported by this server"},
	{"/auth/external", "External identity providers are not supported by this server"},
	{"/auth/login/{login}", "External identity providers are not supported by this server"},
	{"/auth/newuser", "Registration is not open on this server: ask a project administrator for an invitation"},
	{"/auth/newproject", "Registration is not open on this server: ask a project administrator for an invitation"},
	{"/auth/newpatient", "Registration is not open on this server: ask a project administrator for an invitation"},
	{"/auth/verifyemail", "E-mail verification is not supported by this server"},
	{"/oauth2/authorize", "The OAuth authorization endpoint is not supported by this server: use /auth/login or client credentials"},
	{"/oauth2/userinfo", "The OAuth userinfo endpoint is not supported by this server: use /auth/me"},
}

// ValidEmail reports whether s is a bare e-mail address.
func ValidEmail(s string) bool {
	a, err := mail.ParseAddress(s)
	return err == nil && a.Address == s && len(s) <= 320
}

// handleMethod answers which sign-in method applies to an e-mail: always
// the password form ({}), since sandbot has no domains with external
// identity providers. It never tells whether the e-mail has an account.
func (a *Authenticator) handleMethod(w http.ResponseWriter, r *http.Request) {
	body, err := httpx.ReadJSONObject(r, a.maxBody)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	if !ValidEmail(str(body, "email")) {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Valid email address is required", "email"))
		return
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", map[string]any{})
}

// handleChangePassword sets a signed-in user's password:
// {oldPassword, newPassword, confirmPassword?}.
func (a *Authenticator) handleChangePassword(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := principal.FromContext(ctx)
	body, err := httpx.ReadJSONObject(r, a.maxBody)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	typ, uid, _ := fhir.SplitReference(p.User)
	if typ != "User" || p.LoginID == "" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Only a user signed in with a password can change it"))
		return
	}
	oldPassword, _ := body["oldPassword"].(string)
	newPassword, _ := body["newPassword"].(string)
	if oldPassword == "" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Missing oldPassword", "oldPassword"))
		return
	}
	if err := password.Check(newPassword, "newPassword"); err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	// The reference does not compare the confirmation; the app's form sends
	// it, and a typo would otherwise set a password nobody knows.
	if confirm, ok := body["confirmPassword"].(string); ok && confirm != newPassword {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Passwords do not match", "confirmPassword"))
		return
	}
	hash, err := password.Hash(newPassword)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	_, err = a.store.Update(ctx, store.AllProjects, "User", uid, store.Write{Author: p.Author()}, func(u fhir.Resource) (fhir.Resource, error) {
		if !password.Verify(u.String("passwordHash"), oldPassword) {
			return nil, fhir.Invalid("Incorrect password", "oldPassword")
		}
		u["passwordHash"] = hash
		return u, nil
	})
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

// handleRevoke ends one of the caller's own sessions: {loginId}. Another
// user's login is answered as not found.
func (a *Authenticator) handleRevoke(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := principal.FromContext(ctx)
	body, err := httpx.ReadJSONObject(r, a.maxBody)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	id := str(body, "loginId")
	if !fhir.ValidID(id) {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Login ID is required.", "loginId"))
		return
	}
	if err := a.revokeLogin(ctx, id, p.User); err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

// handleLogout revokes the login of the caller's token (GET or POST, as
// MedplumClient.signOut and signOutWithRedirect use it). A caller
// authenticated with client credentials on each request has no login to
// end.
func (a *Authenticator) handleLogout(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	if p.LoginID != "" {
		if err := a.revokeLogin(r.Context(), p.LoginID, p.User); err != nil {
			httpx.WriteError(w, r, a.log, err)
			return
		}
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

// revokeLogin marks a login of userRef revoked: its tokens stop working and
// its refresh token is refused, at once on every replica (the store
// announces the change to every principal cache).
func (a *Authenticator) revokeLogin(ctx context.Context, loginID, userRef string) error {
	_, err := a.store.Update(ctx, store.AllProjects, "Login", loginID, store.Write{Author: fhir.Reference{Reference: "system"}}, func(l fhir.Resource) (fhir.Resource, error) {
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

// handleScope sets the scope of a password login that has chosen its
// membership and not yet exchanged its code: {login, scope}. The answer is a
// new code (the earlier one stops working), as the reference's
// ChooseScopeForm expects.
func (a *Authenticator) handleScope(w http.ResponseWriter, r *http.Request) {
	body, err := httpx.ReadJSONObject(r, a.maxBody)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	loginID, scope := str(body, "login"), str(body, "scope")
	if !fhir.ValidID(loginID) {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Missing login", "login"))
		return
	}
	if scope == "" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Missing scope", "scope"))
		return
	}
	a.reissueCode(w, r, loginID, func(l fhir.Resource) error {
		if l.String("authMethod") != "password" || l.Bool("granted") || l.Bool("revoked") || l.Ref("membership") == "" {
			return fhir.Invalid("Login not ready for a scope", "login")
		}
		if olderThan(l.String("authTime"), codeLifetime) {
			return fhir.Invalid("Login expired", "login")
		}
		l["scope"] = scope
		return nil
	})
}
