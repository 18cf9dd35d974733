package auth

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// Register mounts /oauth2/token, /auth/me and /.well-known/jwks.json.
func (a *Authenticator) Register(r *mux.Router) {
	r.HandleFunc("/oauth2/token", a.handleToken).Methods(http.MethodPost)
	r.Handle("/auth/me", a.Require(http.HandlerFunc(a.handleMe))).Methods(http.MethodGet)
	r.HandleFunc("/.well-known/jwks.json", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, "application/json", a.tokens.JWKS())
	}).Methods(http.MethodGet)
}

// oauthError answers in the OAuth shape the reference's token endpoint uses.
func oauthError(w http.ResponseWriter, status int, code, description string) {
	httpx.WriteJSON(w, status, "application/json", map[string]string{"error": code, "error_description": description})
}

func (a *Authenticator) handleToken(w http.ResponseWriter, r *http.Request) {
	if httpx.MediaType(r) != "application/x-www-form-urlencoded" {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Unsupported content type")
		return
	}
	body, err := httpx.ReadBody(r, a.maxBody)
	if err != nil {
		oauthError(w, fhir.ErrorCodeOf(err).Status(), "invalid_request", "Request body too large")
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Invalid form body")
		return
	}
	switch form.Get("grant_type") {
	case "":
		oauthError(w, http.StatusBadRequest, "invalid_request", "Missing grant_type")
	case "client_credentials":
		a.clientCredentials(w, r, form)
	case "authorization_code":
		a.authorizationCode(w, r, form)
	case "refresh_token":
		a.refreshToken(w, r, form)
	default:
		oauthError(w, http.StatusBadRequest, "invalid_request", "Unsupported grant_type")
	}
}

func (a *Authenticator) clientCredentials(w http.ResponseWriter, r *http.Request, form url.Values) {
	ctx := r.Context()
	var clientID, secret string
	if h := r.Header.Get("Authorization"); h != "" {
		// A Basic header wins over the form fields, as in the reference.
		scheme, cred, _ := strings.Cut(h, " ")
		id, sec, ok := DecodeBasic(strings.TrimSpace(cred))
		if !strings.EqualFold(scheme, "basic") || !ok {
			oauthError(w, http.StatusBadRequest, "invalid_request", "Invalid authorization header")
			return
		}
		clientID, secret = id, sec
	} else {
		clientID, secret = form.Get("client_id"), form.Get("client_secret")
	}
	if clientID == "" {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Missing client_id")
		return
	}
	if secret == "" {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Missing client_secret")
		return
	}
	client, err := a.CheckClient(ctx, clientID, secret)
	if err != nil {
		a.clientFailure(w, r, err)
		return
	}
	p, err := a.clientMembership(ctx, client)
	if err != nil {
		a.clientFailure(w, r, err)
		return
	}
	scope := form.Get("scope")
	if scope == "" {
		scope = "openid"
	}
	resp, err := a.issue(r, p, "client", scope, client.String("name"))
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", resp)
}

func (a *Authenticator) clientFailure(w http.ResponseWriter, r *http.Request, err error) {
	var ce *ClientError
	if errors.As(err, &ce) {
		oauthError(w, http.StatusBadRequest, "invalid_request", ce.Description)
		return
	}
	httpx.WriteError(w, r, a.log, err)
}

// issue records a Login for the principal and answers with its tokens.
func (a *Authenticator) issue(r *http.Request, p *principal.Principal, method, scope, display string) (map[string]any, error) {
	ctx := r.Context()
	login := fhir.Resource{
		"resourceType":  "Login",
		"authMethod":    method,
		"user":          map[string]any{"reference": p.User},
		"membership":    map[string]any{"reference": "ProjectMembership/" + p.MembershipID()},
		"scope":         scope,
		"granted":       true,
		"authTime":      time.Now().UTC().Format(fhir.TimeFormat),
		"remoteAddress": httpx.ClientIP(r),
	}
	if p.ClientID != "" {
		login["client"] = map[string]any{"reference": "ClientApplication/" + p.ClientID}
	}
	rec, err := a.store.Create(ctx, login, store.Write{Project: p.ProjectID, Author: fhir.Reference{Reference: "system"}})
	if err != nil {
		return nil, err
	}
	return a.tokenResponse(p, rec.ID, scope, display)
}

// tokenResponse signs the access and id tokens of an existing Login.
func (a *Authenticator) tokenResponse(p *principal.Principal, loginID, scope, display string) (map[string]any, error) {
	_, userID, _ := fhir.SplitReference(p.User)
	claims := Claims{ClientID: p.ClientID, LoginID: loginID, Username: userID, Profile: p.Profile, Scope: scope}
	claims.Subject = userID
	claims.ID = uuid.NewString()
	access, err := a.tokens.Sign(claims)
	if err != nil {
		return nil, err
	}
	idClaims := Claims{LoginID: loginID, Profile: p.Profile}
	idClaims.Subject = userID
	if p.ClientID != "" {
		idClaims.Audience = []string{p.ClientID}
	}
	idToken, err := a.tokens.Sign(idClaims)
	if err != nil {
		return nil, err
	}
	return map[string]any{
		"token_type":   "Bearer",
		"expires_in":   int(a.tokens.TTL().Seconds()),
		"scope":        scope,
		"id_token":     idToken,
		"access_token": access,
		"project":      map[string]any{"reference": "Project/" + p.ProjectID, "display": p.Project.String("name")},
		"profile":      map[string]any{"reference": p.Profile, "display": display},
	}, nil
}

func (a *Authenticator) handleMe(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	typ, id, _ := fhir.SplitReference(p.Profile)
	profile, err := a.store.Read(r.Context(), store.AllProjects, typ, id)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	prof, err := profile.Resource()
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	delete(prof, "secret")
	project := map[string]any{"resourceType": "Project", "id": p.ProjectID, "name": p.Project["name"],
		"strictMode": p.Project["strictMode"], "superAdmin": p.SuperAdmin}
	if d, ok := p.Project["description"]; ok {
		project["description"] = d
	}
	membership := map[string]any{"resourceType": "ProjectMembership", "id": p.MembershipID(),
		"user": p.Membership["user"], "profile": p.Membership["profile"], "admin": p.Admin}
	config, err := a.userConfiguration(r.Context(), p)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	me := map[string]any{
		"project":    project,
		"membership": membership,
		"profile":    prof,
		"config":     config,
	}
	if sec, err := a.security(r.Context(), p); err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	} else if sec != nil {
		me["security"] = sec
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", me)
}
