// Package authapi is the HTTP layer of internal/services/auth: /oauth2/token,
// /oauth2/logout, /auth/me, /.well-known/jwks.json, the password login
// (/auth/login, /auth/profile, /auth/scope), /auth/setpassword and the web
// app's account endpoints (/auth/method, /auth/changepassword, /auth/revoke),
// the middleware that authenticates a route (Require) and the one that
// applies the auth rate limit (RateLimit). Handlers decode a request (bodies
// within limits.Limits.AuthBodyBytes), call internal/services/auth and encode its
// answer: /oauth2/token's errors in the OAuth shape, every other error as an
// OperationOutcome. Features sandbot does not have (multi-factor
// authentication, Google and external identity providers,
// self-registration, e-mail verification) answer 400 with an
// OperationOutcome that says so, never a 404 or a 5xx that the client would
// retry.
package authapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/auth"
	"github.com/sandbot/sandbot/limits"
)

// Handler serves the auth endpoints.
type Handler struct {
	auth    *auth.Authenticator
	log     *slog.Logger
	maxBody int64
}

// New builds the handler; bodies are bounded by lim.AuthBodyBytes (zero:
// the default).
func New(a *auth.Authenticator, lim limits.Limits, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{auth: a, log: log, maxBody: lim.WithDefaults().AuthBodyBytes}
}

// Register mounts the auth endpoints on r.
func (h *Handler) Register(r *mux.Router) {
	r.HandleFunc("/oauth2/token", h.token).Methods(http.MethodPost)
	r.Handle("/auth/me", h.Require(http.HandlerFunc(h.me))).Methods(http.MethodGet)
	r.HandleFunc("/.well-known/jwks.json", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, "application/json", h.auth.Tokens().JWKS())
	}).Methods(http.MethodGet)
	// SMART discovery, at the root and at the FHIR base (clients look for
	// it beside the FHIR endpoint they were given).
	smart := func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, "application/json", auth.SMARTConfiguration(h.auth.Tokens().Issuer()+"/"))
	}
	r.HandleFunc("/.well-known/smart-configuration", smart).Methods(http.MethodGet)
	r.HandleFunc("/fhir/R4/.well-known/smart-configuration", smart).Methods(http.MethodGet)
	r.HandleFunc("/auth/login", h.login).Methods(http.MethodPost)
	r.HandleFunc("/auth/profile", h.loginStep("profile", h.auth.ChooseProfile)).Methods(http.MethodPost)
	r.HandleFunc("/auth/setpassword", h.setPassword).Methods(http.MethodPost)
	r.HandleFunc("/auth/method", h.method).Methods(http.MethodPost)
	r.Handle("/auth/changepassword", h.Require(http.HandlerFunc(h.changePassword))).Methods(http.MethodPost)
	r.Handle("/auth/revoke", h.Require(http.HandlerFunc(h.revoke))).Methods(http.MethodPost)
	r.Handle("/oauth2/logout", h.Require(http.HandlerFunc(h.logout))).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/auth/scope", h.loginStep("scope", h.auth.SetScope)).Methods(http.MethodPost)
	for _, u := range unsupported {
		msg := u.message
		r.Handle(u.path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.fail(w, r, fhir.Invalid(msg))
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

// Require is middleware that answers 401 unless the request authenticates,
// and puts the principal in the request context (principal.FromContext).
// (The server marks every authenticated route's answers no-store.)
func (h *Handler) Require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := h.auth.Authenticate(r.Context(), r.Header.Get("Authorization"))
		if err != nil {
			h.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(principal.NewContext(r.Context(), p)))
	})
}

// RateLimit is middleware that applies l to the auth paths (/auth/* but
// /auth/me, and /oauth2/*), per client address (httpx.ClientIP: the
// connection's peer, or what a trusted proxy forwarded); other paths pass.
func RateLimit(l *auth.RateLimiter, log *slog.Logger) func(http.Handler) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if l.Unlimited() || !limited(r.URL.Path) {
				next.ServeHTTP(w, r)
				return
			}
			c, err := l.Hit(r.Context(), httpx.ClientIP(r))
			if err != nil {
				httpx.WriteError(w, r, log, err)
				return
			}
			reset := max(1, int(time.Until(c.Reset).Seconds()+0.999))
			w.Header().Set("RateLimit-Limit", strconv.FormatInt(c.Limit, 10))
			w.Header().Set("RateLimit-Remaining", strconv.FormatInt(c.Remaining, 10))
			w.Header().Set("RateLimit-Reset", strconv.Itoa(reset))
			if !c.Allowed {
				w.Header().Set("Retry-After", strconv.Itoa(reset))
				httpx.WriteError(w, r, log, &fhir.Error{Code: fhir.EThrottled, Message: "Too Many Requests"})
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func limited(path string) bool {
	if path == "/auth/me" {
		return false
	}
	return strings.HasPrefix(path, "/auth/") || strings.HasPrefix(path, "/oauth2/")
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpx.WriteError(w, r, h.log, err)
}

// object decodes a JSON object body; it answers the error itself.
func (h *Handler) object(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	body, err := httpx.ReadJSONObject(r, h.maxBody)
	if err != nil {
		h.fail(w, r, err)
		return nil, false
	}
	return body, true
}

// answer writes what the service answered: v as JSON, or its error.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, v map[string]any, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", v)
}

// ok writes an "ok" OperationOutcome, or the service's error.
func (h *Handler) ok(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }

// oauthError answers in the OAuth shape the reference's token endpoint uses.
func oauthError(w http.ResponseWriter, status int, code, description string) {
	httpx.WriteJSON(w, status, "application/json", map[string]string{"error": code, "error_description": description})
}

// token is POST /oauth2/token (a form body).
func (h *Handler) token(w http.ResponseWriter, r *http.Request) {
	if httpx.MediaType(r) != "application/x-www-form-urlencoded" {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Unsupported content type")
		return
	}
	body, err := httpx.ReadBody(r, h.maxBody)
	if err != nil {
		oauthError(w, fhir.ErrorCodeOf(err).Status(), "invalid_request", "Request body too large")
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Invalid form body")
		return
	}
	resp, err := h.auth.Token(r.Context(), auth.TokenRequest{
		GrantType:     form.Get("grant_type"),
		Authorization: r.Header.Get("Authorization"),
		ClientID:      form.Get("client_id"),
		ClientSecret:  form.Get("client_secret"),
		Code:          form.Get("code"),
		CodeVerifier:  form.Get("code_verifier"),
		RefreshToken:  form.Get("refresh_token"),
		Scope:         form.Get("scope"),
		RemoteAddress: httpx.ClientIP(r),
	})
	if oe, ok := err.(*auth.OAuthError); ok {
		oauthError(w, http.StatusBadRequest, oe.Code, oe.Description)
		return
	}
	h.answer(w, r, resp, err)
}

func (h *Handler) me(w http.ResponseWriter, r *http.Request) {
	me, err := h.auth.Me(r.Context(), principal.FromContext(r.Context()))
	h.answer(w, r, me, err)
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	body, ok := h.object(w, r)
	if !ok {
		return
	}
	resp, err := h.auth.Login(r.Context(), auth.LoginRequest{
		Email: str(body, "email"), Password: str(body, "password"),
		ProjectID: str(body, "projectId"), ClientID: str(body, "clientId"),
		CodeChallenge: str(body, "codeChallenge"), CodeChallengeMethod: str(body, "codeChallengeMethod"),
		Scope: str(body, "scope"), RemoteAddress: httpx.ClientIP(r),
	})
	h.answer(w, r, resp, err)
}

// loginStep serves a step of a password login that takes {login, <field>}
// and answers {login, code}: POST /auth/profile (field "profile", the
// membership id) and POST /auth/scope (field "scope").
func (h *Handler) loginStep(field string, step func(ctx context.Context, loginID, value string) (map[string]any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, ok := h.object(w, r)
		if !ok {
			return
		}
		resp, err := step(r.Context(), str(body, "login"), str(body, field))
		h.answer(w, r, resp, err)
	}
}

// setPassword is POST /auth/setpassword: {id, secret, password}.
func (h *Handler) setPassword(w http.ResponseWriter, r *http.Request) {
	body, ok := h.object(w, r)
	if !ok {
		return
	}
	h.ok(w, r, h.auth.SetPassword(r.Context(), str(body, "id"), str(body, "secret"), str(body, "password")))
}

// method is POST /auth/method: {email} → {} (the password form).
func (h *Handler) method(w http.ResponseWriter, r *http.Request) {
	body, ok := h.object(w, r)
	if !ok {
		return
	}
	h.answer(w, r, map[string]any{}, h.auth.Method(str(body, "email")))
}

// changePassword is POST /auth/changepassword: {oldPassword, newPassword,
// confirmPassword?}, signed in.
func (h *Handler) changePassword(w http.ResponseWriter, r *http.Request) {
	body, ok := h.object(w, r)
	if !ok {
		return
	}
	var confirm *string
	if c, ok := body["confirmPassword"].(string); ok {
		confirm = &c
	}
	h.ok(w, r, h.auth.ChangePassword(r.Context(), principal.FromContext(r.Context()), str(body, "oldPassword"), str(body, "newPassword"), confirm))
}

// revoke is POST /auth/revoke: {loginId}, one of the caller's sessions.
func (h *Handler) revoke(w http.ResponseWriter, r *http.Request) {
	body, ok := h.object(w, r)
	if !ok {
		return
	}
	h.ok(w, r, h.auth.Revoke(r.Context(), principal.FromContext(r.Context()), str(body, "loginId")))
}

// logout is GET or POST /oauth2/logout, as MedplumClient.signOut and
// signOutWithRedirect use it: the token's login ends.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	h.ok(w, r, h.auth.Logout(r.Context(), principal.FromContext(r.Context())))
}
