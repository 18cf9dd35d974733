package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/internal/password"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// Password logins: POST /auth/login (e-mail and password) answers a Login
// id and either a code (one membership applies) or the memberships to choose
// from with POST /auth/profile; the code is exchanged at /oauth2/token
// (authorization_code, with PKCE S256 or plain), which also answers a
// refresh token (refresh_token grant, rotated on every use).
// POST /auth/setpassword consumes an invitation link.

const (
	codeLifetime    = 10 * time.Minute
	refreshLifetime = 14 * 24 * time.Hour
	setPasswordTTL  = 7 * 24 * time.Hour
	// errBadLogin is the one answer to a wrong e-mail or password: it never
	// tells whether the e-mail exists.
	errBadLogin = "Email or password is invalid"
)

// RegisterLogins mounts /auth/login, /auth/profile and /auth/setpassword.
func (a *Authenticator) RegisterLogins(r *mux.Router) {
	r.HandleFunc("/auth/login", a.handleLogin).Methods(http.MethodPost)
	r.HandleFunc("/auth/profile", a.handleProfile).Methods(http.MethodPost)
	r.HandleFunc("/auth/setpassword", a.handleSetPassword).Methods(http.MethodPost)
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return strings.TrimSpace(s) }

func (a *Authenticator) handleLogin(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := httpx.ReadJSONObject(r, a.maxBody)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	email := strings.ToLower(str(body, "email"))
	pw, _ := body["password"].(string)
	if email == "" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Valid email address is required", "email"))
		return
	}
	if pw == "" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Password is required", "password"))
		return
	}
	projectID := str(body, "projectId")
	clientID := str(body, "clientId")
	if clientID != "" {
		// A login through a client application lands in the client's project.
		rec, err := a.store.Read(ctx, store.AllProjects, "ClientApplication", clientID)
		if err != nil || !fhir.ValidID(clientID) {
			httpx.WriteError(w, r, a.log, fhir.Invalid("Invalid client", "clientId"))
			return
		}
		if projectID == "" && rec.Project != "" {
			cm, err := principal.FindMembership(ctx, a.store, "ClientApplication/"+clientID)
			if err == nil && cm != nil {
				_, projectID, _ = fhir.SplitReference(cm.Ref("project"))
			}
		}
	}
	method := str(body, "codeChallengeMethod")
	challenge := str(body, "codeChallenge")
	if challenge != "" && method != "" && method != "S256" && method != "plain" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Invalid code challenge method", "codeChallengeMethod"))
		return
	}

	users, err := a.fhir.UsersByEmail(ctx, principal.System("", system), email)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	// Server-scoped users first; project-scoped ones only into their project.
	var candidates []fhir.Resource
	for _, u := range users {
		if u.Ref("project") == "" {
			candidates = append([]fhir.Resource{u}, candidates...)
		} else if projectID == "" || u.Ref("project") == "Project/"+projectID {
			candidates = append(candidates, u)
		}
	}
	var user fhir.Resource
	for _, u := range candidates {
		if password.Verify(u.String("passwordHash"), pw) {
			user = u
			break
		}
	}
	if len(candidates) == 0 {
		// The same bcrypt work as for a user: timing does not tell.
		password.Verify("", pw)
	}
	if user == nil {
		httpx.WriteError(w, r, a.log, fhir.Invalid(errBadLogin))
		return
	}
	userRef := "User/" + user.ID()
	all, err := store.SearchResources(ctx, a.store, store.AllProjects, "ProjectMembership", "user="+userRef+"&_count=100")
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	var memberships []fhir.Resource
	for _, m := range all {
		if active, ok := m["active"].(bool); ok && !active {
			continue
		}
		if up := user.Ref("project"); up != "" && m.Ref("project") != up {
			continue
		}
		if projectID != "" && m.Ref("project") != "Project/"+projectID {
			continue
		}
		memberships = append(memberships, m)
	}
	if len(memberships) == 0 {
		httpx.WriteError(w, r, a.log, fhir.Invalid("User not found in any project"))
		return
	}
	// The partial login lives in the user's home project.
	urec, err := a.store.Read(ctx, store.AllProjects, "User", user.ID())
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	scope := str(body, "scope")
	if scope == "" {
		scope = "openid"
	}
	login := fhir.Resource{
		"resourceType":  "Login",
		"authMethod":    "password",
		"user":          map[string]any{"reference": userRef},
		"scope":         scope,
		"granted":       false,
		"authTime":      time.Now().UTC().Format(fhir.TimeFormat),
		"remoteAddress": httpx.ClientIP(r),
	}
	if challenge != "" {
		if method == "" {
			method = "plain"
		}
		login["codeChallenge"] = challenge
		login["codeChallengeMethod"] = method
	}
	if clientID != "" {
		login["client"] = map[string]any{"reference": "ClientApplication/" + clientID}
	}
	var code string
	if len(memberships) == 1 {
		code = password.NewSecret()
		login["membership"] = map[string]any{"reference": "ProjectMembership/" + memberships[0].ID()}
		login["code"] = password.HashSecret(code)
		login["codeIssued"] = time.Now().UTC().Format(fhir.TimeFormat)
	}
	rec, err := a.store.Create(ctx, login, store.Write{Project: urec.Project, Author: fhir.Reference{Reference: "system"}})
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	if code != "" {
		httpx.WriteJSON(w, http.StatusOK, "application/json", map[string]any{"login": rec.ID, "code": rec.ID + "." + code})
		return
	}
	list := make([]any, len(memberships))
	for i, m := range memberships {
		list[i] = map[string]any{"resourceType": "ProjectMembership", "id": m.ID(), "project": m["project"], "profile": m["profile"], "user": m["user"]}
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", map[string]any{"login": rec.ID, "memberships": list})
}

// handleProfile chooses the membership of a partial login: {login, profile}
// where profile is the membership id.
func (a *Authenticator) handleProfile(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := httpx.ReadJSONObject(r, a.maxBody)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	loginID, mid := str(body, "login"), str(body, "profile")
	if loginID == "" || mid == "" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("login and profile are required"))
		return
	}
	mrec, err := a.store.Read(ctx, store.AllProjects, "ProjectMembership", mid)
	if err != nil {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Profile not found", "profile"))
		return
	}
	m, err := mrec.Resource()
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	a.reissueCode(w, r, loginID, func(l fhir.Resource) error {
		if l.String("authMethod") != "password" || l.Bool("granted") || l.Bool("revoked") || l.Ref("membership") != "" {
			return fhir.Invalid("Login already completed", "login")
		}
		if olderThan(l.String("authTime"), codeLifetime) {
			return fhir.Invalid("Login expired", "login")
		}
		if m.Ref("user") != l.Ref("user") {
			return fhir.Invalid("Profile not found", "profile")
		}
		if active, ok := m["active"].(bool); ok && !active {
			return fhir.Invalid("Profile not found", "profile")
		}
		l["membership"] = map[string]any{"reference": "ProjectMembership/" + mid}
		return nil
	})
}

// reissueCode gives the password login loginID a new authorization code (the
// earlier one stops working) once step accepts the Login and makes its change
// to it, and answers {login, code} as a first login step does. A login that
// does not exist (or no longer does) is a 400 naming it.
func (a *Authenticator) reissueCode(w http.ResponseWriter, r *http.Request, loginID string, step func(l fhir.Resource) error) {
	code := password.NewSecret()
	_, err := a.store.Update(r.Context(), store.AllProjects, "Login", loginID, store.Write{Author: fhir.Reference{Reference: "system"}}, func(l fhir.Resource) (fhir.Resource, error) {
		if err := step(l); err != nil {
			return nil, err
		}
		l["code"] = password.HashSecret(code)
		l["codeIssued"] = time.Now().UTC().Format(fhir.TimeFormat)
		return l, nil
	})
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			err = fhir.Invalid("Login not found", "login")
		}
		httpx.WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", map[string]any{"login": loginID, "code": loginID + "." + code})
}

// checkPKCE verifies a code verifier against the stored challenge.
func checkPKCE(method, challenge, verifier string) bool {
	if challenge == "" {
		return true
	}
	if verifier == "" {
		return false
	}
	want := verifier
	if method == "S256" {
		sum := sha256.Sum256([]byte(verifier))
		want = base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return subtle.ConstantTimeCompare([]byte(want), []byte(challenge)) == 1
}

func (a *Authenticator) authorizationCode(w http.ResponseWriter, r *http.Request, form url.Values) {
	ctx := r.Context()
	loginID, secret, ok := strings.Cut(form.Get("code"), ".")
	if form.Get("code") == "" {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Missing code")
		return
	}
	if !ok || !fhir.ValidID(loginID) {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid code")
		return
	}
	refresh := password.NewSecret()
	var grantErr string
	rec, err := a.store.Update(ctx, store.AllProjects, "Login", loginID, store.Write{Author: fhir.Reference{Reference: "system"}}, func(l fhir.Resource) (fhir.Resource, error) {
		switch {
		case l.Bool("granted") || l.Bool("revoked") || !password.SecretMatches(l.String("code"), secret):
			grantErr = "Invalid code"
		case olderThan(l.String("codeIssued"), codeLifetime):
			grantErr = "Expired code"
		case !checkPKCE(l.String("codeChallengeMethod"), l.String("codeChallenge"), form.Get("code_verifier")):
			grantErr = "Invalid code verifier"
		case form.Get("client_id") != "" && l.Ref("client") != "" && l.Ref("client") != "ClientApplication/"+form.Get("client_id"):
			grantErr = "Invalid client"
		}
		if grantErr != "" {
			return nil, fhir.Invalid(grantErr)
		}
		l["granted"] = true
		delete(l, "code")
		l["refreshSecret"] = password.HashSecret(refresh)
		return l, nil
	})
	a.finishGrant(w, r, rec, refresh, err, grantErr, "Invalid code")
}

func (a *Authenticator) refreshToken(w http.ResponseWriter, r *http.Request, form url.Values) {
	ctx := r.Context()
	loginID, secret, ok := strings.Cut(form.Get("refresh_token"), ".")
	if form.Get("refresh_token") == "" {
		oauthError(w, http.StatusBadRequest, "invalid_request", "Missing refresh_token")
		return
	}
	if !ok || !fhir.ValidID(loginID) {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid token")
		return
	}
	refresh := password.NewSecret()
	var grantErr string
	rec, err := a.store.Update(ctx, store.AllProjects, "Login", loginID, store.Write{Author: fhir.Reference{Reference: "system"}}, func(l fhir.Resource) (fhir.Resource, error) {
		t, terr := time.Parse(fhir.TimeFormat, l.String("authTime"))
		switch {
		case !l.Bool("granted") || l.Bool("revoked") || !password.SecretMatches(l.String("refreshSecret"), secret):
			grantErr = "Invalid token"
		case terr != nil || time.Since(t) > refreshLifetime:
			grantErr = "Token expired"
		}
		if grantErr != "" {
			return nil, fhir.Invalid(grantErr)
		}
		l["refreshSecret"] = password.HashSecret(refresh)
		return l, nil
	})
	a.finishGrant(w, r, rec, refresh, err, grantErr, "Invalid token")
}

// finishGrant answers a code or refresh grant: its tokens, or invalid_grant
// with the reason found (unknown for a Login that is not there), or the
// store's failure.
func (a *Authenticator) finishGrant(w http.ResponseWriter, r *http.Request, rec *store.Record, refresh string, err error, grantErr, unknown string) {
	if err == nil {
		a.loginTokens(w, r, rec, refresh)
		return
	}
	if grantErr == "" && !fhir.IsCode(err, fhir.ENotFound) && !fhir.IsCode(err, fhir.EGone) {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	if grantErr == "" {
		grantErr = unknown
	}
	oauthError(w, http.StatusBadRequest, "invalid_grant", grantErr)
}

// loginTokens answers the token response of a granted password Login.
func (a *Authenticator) loginTokens(w http.ResponseWriter, r *http.Request, rec *store.Record, refresh string) {
	l, err := rec.Resource()
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	_, mid, _ := fhir.SplitReference(l.Ref("membership"))
	p, err := a.principalFor(r.Context(), mid)
	if err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid login")
		return
	}
	if _, cid, ok := fhir.SplitReference(l.Ref("client")); ok {
		p.ClientID = cid
	}
	display, _ := p.Membership["profile"].(map[string]any)["display"].(string)
	resp, err := a.tokenResponse(p, rec.ID, l.String("scope"), display)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	resp["refresh_token"] = rec.ID + "." + refresh
	if strings.HasPrefix(p.Profile, "Patient/") {
		_, pid, _ := fhir.SplitReference(p.Profile)
		resp["patient"] = pid
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", resp)
}

// handleSetPassword consumes an invitation (or reset) link: {id, secret, password}.
func (a *Authenticator) handleSetPassword(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := httpx.ReadJSONObject(r, a.maxBody)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	id, secret := str(body, "id"), str(body, "secret")
	pw, _ := body["password"].(string)
	if err := password.Check(pw, "password"); err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	if !fhir.ValidID(id) || secret == "" {
		httpx.WriteError(w, r, a.log, fhir.Invalid("Invalid request", "id"))
		return
	}
	hash, err := password.Hash(pw)
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	err = a.store.InTx(ctx, func(tx store.Store) error {
		var userRef string
		_, err := tx.Update(ctx, store.AllProjects, "UserSecurityRequest", id, store.Write{Author: fhir.Reference{Reference: "system"}}, func(q fhir.Resource) (fhir.Resource, error) {
			if q.Bool("used") || !password.SecretMatches(q.String("secret"), secret) {
				return nil, fhir.Invalid("Invalid request", "secret")
			}
			if t, err := time.Parse(fhir.TimeFormat, lastUpdated(q)); err == nil && time.Since(t) > setPasswordTTL {
				return nil, fhir.Invalid("Request expired", "secret")
			}
			userRef = q.Ref("user")
			q["used"] = true
			return q, nil
		})
		if err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return fhir.Invalid("Invalid request", "id")
			}
			return err
		}
		_, uid, _ := fhir.SplitReference(userRef)
		_, err = tx.Update(ctx, store.AllProjects, "User", uid, store.Write{Author: fhir.Reference{Reference: "system"}}, func(u fhir.Resource) (fhir.Resource, error) {
			u["passwordHash"] = hash
			return u, nil
		})
		return err
	})
	if err != nil {
		httpx.WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

// olderThan reports whether an instant is unparsable or older than d.
func olderThan(instant string, d time.Duration) bool {
	t, err := time.Parse(fhir.TimeFormat, instant)
	return err != nil || time.Since(t) > d
}

func lastUpdated(r fhir.Resource) string {
	meta, _ := r["meta"].(map[string]any)
	s, _ := meta["lastUpdated"].(string)
	return s
}
