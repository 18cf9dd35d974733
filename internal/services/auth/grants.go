package auth

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/password"
	"github.com/sandbot/sandbot/internal/principal"
)

// The token endpoint's grants: client credentials, the authorization code
// of a password login (with PKCE S256 or plain), and the refresh token
// (rotated on every use). Each issues a Login (or advances one) and signs
// its tokens.

const (
	codeLifetime    = 10 * time.Minute
	refreshLifetime = 14 * 24 * time.Hour
)

// OAuthError is a refusal of the token endpoint, in the OAuth shape the
// reference's token endpoint answers ({"error", "error_description"}, 400).
type OAuthError struct{ Code, Description string }

func (e *OAuthError) Error() string { return e.Code + ": " + e.Description }

// TokenRequest is what /oauth2/token was asked.
type TokenRequest struct {
	GrantType string
	// Authorization is the request's Authorization header, if any: a Basic
	// header wins over the form's client_id and client_secret for the
	// client credentials grant, as in the reference.
	Authorization string
	ClientID      string
	ClientSecret  string
	Code          string
	CodeVerifier  string
	RefreshToken  string
	Scope         string
	// RemoteAddress is the client's address, recorded on a new Login.
	RemoteAddress string
}

// Token runs a grant and answers the token response: access and id tokens,
// and for a password login's grants a refresh token. A refusal is an
// *OAuthError; other errors are the store's.
func (a *Authenticator) Token(ctx context.Context, req TokenRequest) (map[string]any, error) {
	switch req.GrantType {
	case "":
		return nil, &OAuthError{"invalid_request", "Missing grant_type"}
	case "client_credentials":
		return a.clientCredentials(ctx, req)
	case "authorization_code":
		return a.authorizationCode(ctx, req)
	case "refresh_token":
		return a.refreshToken(ctx, req)
	}
	return nil, &OAuthError{"invalid_request", "Unsupported grant_type"}
}

func (a *Authenticator) clientCredentials(ctx context.Context, req TokenRequest) (map[string]any, error) {
	clientID, secret := req.ClientID, req.ClientSecret
	if req.Authorization != "" {
		scheme, cred, _ := strings.Cut(req.Authorization, " ")
		id, sec, ok := DecodeBasic(strings.TrimSpace(cred))
		if !strings.EqualFold(scheme, "basic") || !ok {
			return nil, &OAuthError{"invalid_request", "Invalid authorization header"}
		}
		clientID, secret = id, sec
	}
	if clientID == "" {
		return nil, &OAuthError{"invalid_request", "Missing client_id"}
	}
	if secret == "" {
		return nil, &OAuthError{"invalid_request", "Missing client_secret"}
	}
	client, err := a.CheckClient(ctx, clientID, secret)
	if err != nil {
		return nil, clientRefusal(err)
	}
	p, err := a.clientMembership(ctx, client)
	if err != nil {
		return nil, clientRefusal(err)
	}
	scope := req.Scope
	if scope == "" {
		scope = "openid"
	}
	return a.issue(ctx, p, "client", scope, client.String("name"), req.RemoteAddress)
}

// clientRefusal is a ClientError as the token endpoint answers it.
func clientRefusal(err error) error {
	var ce *ClientError
	if errors.As(err, &ce) {
		return &OAuthError{"invalid_request", ce.Description}
	}
	return err
}

// issue records a Login for the principal and answers with its tokens.
func (a *Authenticator) issue(ctx context.Context, p *principal.Principal, method, scope, display, remoteAddress string) (map[string]any, error) {
	login := fhir.Resource{
		"resourceType":  "Login",
		"authMethod":    method,
		"user":          map[string]any{"reference": p.User},
		"membership":    map[string]any{"reference": "ProjectMembership/" + p.MembershipID()},
		"scope":         scope,
		"granted":       true,
		"authTime":      time.Now().UTC().Format(fhir.TimeFormat),
		"remoteAddress": remoteAddress,
	}
	if p.ClientID != "" {
		login["client"] = map[string]any{"reference": "ClientApplication/" + p.ClientID}
	}
	rec, err := a.fhir.Create(ctx, principal.System(p.ProjectID, system), login)
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

func (a *Authenticator) authorizationCode(ctx context.Context, req TokenRequest) (map[string]any, error) {
	if req.Code == "" {
		return nil, &OAuthError{"invalid_request", "Missing code"}
	}
	loginID, secret, ok := strings.Cut(req.Code, ".")
	if !ok || !fhir.ValidID(loginID) {
		return nil, &OAuthError{"invalid_grant", "Invalid code"}
	}
	refresh := password.NewSecret()
	var grantErr string
	rec, err := a.fhir.Modify(ctx, principal.System("", system), "Login", loginID, func(l fhir.Resource) (fhir.Resource, error) {
		normalizeLogin(l)
		switch {
		case l.Bool("granted") || l.Bool("revoked") || !password.SecretMatches(l.String("code"), secret):
			grantErr = "Invalid code"
		case olderThan(codeIssued(l), codeLifetime):
			grantErr = "Expired code"
		case !checkPKCE(l.String("codeChallengeMethod"), l.String("codeChallenge"), req.CodeVerifier):
			grantErr = "Invalid code verifier"
		case req.ClientID != "" && l.Ref("client") != "" && l.Ref("client") != "ClientApplication/"+req.ClientID:
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
	return a.finishGrant(ctx, rec, refresh, err, grantErr, "Invalid code")
}

func (a *Authenticator) refreshToken(ctx context.Context, req TokenRequest) (map[string]any, error) {
	if req.RefreshToken == "" {
		return nil, &OAuthError{"invalid_request", "Missing refresh_token"}
	}
	loginID, secret, ok := strings.Cut(req.RefreshToken, ".")
	if !ok || !fhir.ValidID(loginID) {
		return nil, &OAuthError{"invalid_grant", "Invalid token"}
	}
	refresh := password.NewSecret()
	var grantErr string
	rec, err := a.fhir.Modify(ctx, principal.System("", system), "Login", loginID, func(l fhir.Resource) (fhir.Resource, error) {
		normalizeLogin(l)
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
	return a.finishGrant(ctx, rec, refresh, err, grantErr, "Invalid token")
}

// finishGrant ends a code or refresh grant: its tokens, or invalid_grant
// with the reason found (unknown for a Login that is not there), or the
// store's failure.
func (a *Authenticator) finishGrant(ctx context.Context, rec *fhir.Record, refresh string, err error, grantErr, unknown string) (map[string]any, error) {
	if err == nil {
		return a.loginTokens(ctx, rec, refresh)
	}
	if grantErr == "" && !fhir.IsCode(err, fhir.ENotFound) && !fhir.IsCode(err, fhir.EGone) {
		return nil, err
	}
	if grantErr == "" {
		grantErr = unknown
	}
	return nil, &OAuthError{"invalid_grant", grantErr}
}

// loginTokens is the token response of a granted password Login.
func (a *Authenticator) loginTokens(ctx context.Context, rec *fhir.Record, refresh string) (map[string]any, error) {
	l, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	_, mid, _ := fhir.SplitReference(l.Ref("membership"))
	p, err := a.principalFor(ctx, mid)
	if err != nil {
		return nil, &OAuthError{"invalid_grant", "Invalid login"}
	}
	if _, cid, ok := fhir.SplitReference(l.Ref("client")); ok {
		p.ClientID = cid
	}
	display, _ := p.Membership["profile"].(map[string]any)["display"].(string)
	resp, err := a.tokenResponse(p, rec.ID, l.String("scope"), display)
	if err != nil {
		return nil, err
	}
	resp["refresh_token"] = rec.ID + "." + refresh
	if strings.HasPrefix(p.Profile, "Patient/") {
		_, pid, _ := fhir.SplitReference(p.Profile)
		resp["patient"] = pid
	}
	return resp, nil
}
