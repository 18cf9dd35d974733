package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"strings"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/password"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// Password logins: Login (e-mail and password) answers a Login id and
// either a code (one membership applies) or the memberships to choose from
// with ChooseProfile; SetScope may change the scope before the code is
// exchanged by the token endpoint (authorization_code). SetPassword
// consumes an invitation's or a reset's link. Logins are written through
// the FHIR service by the server.

const (
	setPasswordTTL = 7 * 24 * time.Hour
	// errBadLogin is the one answer to a wrong e-mail or password: it never
	// tells whether the e-mail exists.
	errBadLogin = "Email or password is invalid"
)

// LoginRequest is a password login: POST /auth/login's body, and the
// client's address.
type LoginRequest struct {
	Email    string
	Password string
	// ProjectID and ClientID, when given, choose the project to log into
	// (a client's project, unless ProjectID names one).
	ProjectID           string
	ClientID            string
	CodeChallenge       string
	CodeChallengeMethod string
	Scope               string
	RemoteAddress       string
}

// Login checks an e-mail and password and starts a Login: {login, code}
// when one membership applies, else {login, memberships} to choose from. A
// wrong e-mail and a wrong password are the same 400 after the same bcrypt
// work.
func (a *Authenticator) Login(ctx context.Context, req LoginRequest) (map[string]any, error) {
	email := strings.ToLower(strings.TrimSpace(req.Email))
	if email == "" {
		return nil, fhir.Invalid("Valid email address is required", "email")
	}
	if req.Password == "" {
		return nil, fhir.Invalid("Password is required", "password")
	}
	projectID := strings.TrimSpace(req.ProjectID)
	clientID := strings.TrimSpace(req.ClientID)
	if clientID != "" {
		// A login through a client application lands in the client's project.
		rec, err := a.store.Read(ctx, store.AllProjects, "ClientApplication", clientID)
		if err != nil || !fhir.ValidID(clientID) {
			return nil, fhir.Invalid("Invalid client", "clientId")
		}
		if projectID == "" && rec.Project != "" {
			cm, err := principal.FindMembership(ctx, a.store, "ClientApplication/"+clientID)
			if err == nil && cm != nil {
				_, projectID, _ = fhir.SplitReference(cm.Ref("project"))
			}
		}
	}
	method := strings.TrimSpace(req.CodeChallengeMethod)
	challenge := strings.TrimSpace(req.CodeChallenge)
	if challenge != "" && method != "" && method != "S256" && method != "plain" {
		return nil, fhir.Invalid("Invalid code challenge method", "codeChallengeMethod")
	}

	users, err := a.fhir.UsersByEmail(ctx, principal.System("", system), email)
	if err != nil {
		return nil, err
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
		if password.Verify(u.String("passwordHash"), req.Password) {
			user = u
			break
		}
	}
	if len(candidates) == 0 {
		// The same bcrypt work as for a user: timing does not tell.
		password.Verify("", req.Password)
	}
	if user == nil {
		return nil, fhir.Invalid(errBadLogin)
	}
	userRef := "User/" + user.ID()
	all, err := store.SearchResources(ctx, a.store, store.AllProjects, "ProjectMembership", "user="+userRef+"&_count=100")
	if err != nil {
		return nil, err
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
		return nil, fhir.Invalid("User not found in any project")
	}
	scope := strings.TrimSpace(req.Scope)
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
		"remoteAddress": req.RemoteAddress,
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
		setCodeIssued(login, time.Now())
	}
	// The partial login lives in the user's home project.
	rec, err := a.fhir.Create(ctx, principal.System(user.MetaProject(), system), login)
	if err != nil {
		return nil, err
	}
	if code != "" {
		return map[string]any{"login": rec.ID, "code": rec.ID + "." + code}, nil
	}
	list := make([]any, len(memberships))
	for i, m := range memberships {
		list[i] = map[string]any{"resourceType": "ProjectMembership", "id": m.ID(), "project": m["project"], "profile": m["profile"], "user": m["user"]}
	}
	return map[string]any{"login": rec.ID, "memberships": list}, nil
}

// ChooseProfile chooses the membership (by id) of a partial login and
// answers {login, code}.
func (a *Authenticator) ChooseProfile(ctx context.Context, loginID, membershipID string) (map[string]any, error) {
	loginID, mid := strings.TrimSpace(loginID), strings.TrimSpace(membershipID)
	if loginID == "" || mid == "" {
		return nil, fhir.Invalid("login and profile are required")
	}
	mrec, err := a.store.Read(ctx, store.AllProjects, "ProjectMembership", mid)
	if err != nil {
		return nil, fhir.Invalid("Profile not found", "profile")
	}
	m, err := mrec.Resource()
	if err != nil {
		return nil, err
	}
	return a.reissueCode(ctx, loginID, func(l fhir.Resource) error {
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

// SetScope sets the scope of a password login that has chosen its
// membership and not yet exchanged its code, and answers {login, code}: a
// new code (the earlier one stops working), as the reference's
// ChooseScopeForm expects.
func (a *Authenticator) SetScope(ctx context.Context, loginID, scope string) (map[string]any, error) {
	loginID, scope = strings.TrimSpace(loginID), strings.TrimSpace(scope)
	if !fhir.ValidID(loginID) {
		return nil, fhir.Invalid("Missing login", "login")
	}
	if scope == "" {
		return nil, fhir.Invalid("Missing scope", "scope")
	}
	return a.reissueCode(ctx, loginID, func(l fhir.Resource) error {
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

// reissueCode gives the password login loginID a new authorization code (the
// earlier one stops working) once step accepts the Login and makes its change
// to it, and answers {login, code} as a first login step does. A login that
// does not exist (or no longer does) is a 400 naming it.
func (a *Authenticator) reissueCode(ctx context.Context, loginID string, step func(l fhir.Resource) error) (map[string]any, error) {
	code := password.NewSecret()
	_, err := a.fhir.Modify(ctx, principal.System("", system), "Login", loginID, func(l fhir.Resource) (fhir.Resource, error) {
		normalizeLogin(l)
		if err := step(l); err != nil {
			return nil, err
		}
		l["code"] = password.HashSecret(code)
		setCodeIssued(l, time.Now())
		return l, nil
	})
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			err = fhir.Invalid("Login not found", "login")
		}
		return nil, err
	}
	return map[string]any{"login": loginID, "code": loginID + "." + code}, nil
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

// SetPassword consumes an invitation's (or reset's) link, {id, secret},
// and sets the User's password: the request is marked used and the hash
// written in one transaction.
func (a *Authenticator) SetPassword(ctx context.Context, id, secret, pw string) error {
	id, secret = strings.TrimSpace(id), strings.TrimSpace(secret)
	if err := password.Check(pw, "password"); err != nil {
		return err
	}
	if !fhir.ValidID(id) || secret == "" {
		return fhir.Invalid("Invalid request", "id")
	}
	hash, err := password.Hash(pw)
	if err != nil {
		return err
	}
	server := principal.System("", system)
	return a.fhir.InTx(ctx, func(tx *fhirservice.Service) error {
		var userRef string
		_, err := tx.Modify(ctx, server, "UserSecurityRequest", id, func(q fhir.Resource) (fhir.Resource, error) {
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
		_, err = tx.Modify(ctx, server, "User", uid, func(u fhir.Resource) (fhir.Resource, error) {
			u["passwordHash"] = hash
			return u, nil
		})
		return err
	})
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
