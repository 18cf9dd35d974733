package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"strings"
	"sync"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// cacheTTL bounds how long a resolved login is reused. It is a safety net:
// a change to what a principal is made of (its login, membership, access
// policies, project or client) drops the cached principals on every replica
// as soon as the store announces it (Changed), within milliseconds.
const cacheTTL = 10 * time.Second

type cached struct {
	p       *principal.Principal
	expires time.Time
}

// Authenticator resolves credentials to principals, and runs the logins,
// grants and account operations.
type Authenticator struct {
	// store is read for what principals are made of (logins, memberships,
	// clients, projects).
	store store.Store
	// fhir writes what auth keeps (Logins, Users' passwords, set-password
	// requests) and finds accounts by e-mail, as the server under the FHIR
	// service's rules.
	fhir   *fhirservice.Service
	tokens *Tokens

	mu    sync.Mutex
	cache map[string]cached
	// gen counts invalidations: a principal resolved from reads made
	// before one is not cached after it (it may be what was invalidated).
	gen uint64
}

// NewAuthenticator builds an authenticator over the store and the FHIR
// service on it.
func NewAuthenticator(s store.Store, svc *fhirservice.Service, t *Tokens) *Authenticator {
	return &Authenticator{store: s, fhir: svc, tokens: t, cache: map[string]cached{}}
}

// system is the meta.author of what the server writes by itself.
var system = fhir.Reference{Reference: "system"}

// Tokens is the token signer.
func (a *Authenticator) Tokens() *Tokens { return a.tokens }

func (a *Authenticator) cacheGet(key string) *principal.Principal {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.cache[key]
	if !ok || time.Now().After(c.expires) {
		return nil
	}
	return c.p
}

// generation is taken before the reads a principal is resolved from.
func (a *Authenticator) generation() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gen
}

// cachePut caches p for cacheTTL, but never past limit (a token's expiry)
// when limit is set, and not at all when something was invalidated since
// gen was taken.
func (a *Authenticator) cachePut(key string, p *principal.Principal, gen uint64, limit time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gen != gen {
		return
	}
	now := time.Now()
	if len(a.cache) > 10000 {
		for k, c := range a.cache {
			if now.After(c.expires) {
				delete(a.cache, k)
			}
		}
	}
	expires := now.Add(cacheTTL)
	if !limit.IsZero() && limit.Before(expires) {
		expires = limit
	}
	a.cache[key] = cached{p: p, expires: expires}
}

// forget drops every cached principal.
func (a *Authenticator) forget() {
	a.mu.Lock()
	a.cache = map[string]cached{}
	a.gen++
	a.mu.Unlock()
}

// Changed drops what the changes make stale (store.Store.Subscribe): the
// principals of a changed Login; every principal when a membership, access
// policy, project or client changed (or when changes may have been missed),
// since any principal may be made of it.
func (a *Authenticator) Changed(changes []store.Change) {
	logins := map[string]bool{}
	for _, c := range changes {
		switch c.ResourceType {
		case "Login":
			logins[c.ID] = true
		case "Bot":
		default:
			a.forget()
			return
		}
	}
	if len(logins) == 0 {
		return
	}
	a.mu.Lock()
	for k, c := range a.cache {
		if logins[c.p.LoginID] {
			delete(a.cache, k)
		}
	}
	a.gen++
	a.mu.Unlock()
}

// Authenticate resolves the value of an Authorization header (Bearer or
// Basic); fhir.ErrUnauthorized when it is missing or wrong, or the store's
// error when it could not be checked.
func (a *Authenticator) Authenticate(ctx context.Context, authorization string) (*principal.Principal, error) {
	scheme, cred, _ := strings.Cut(authorization, " ")
	cred = strings.TrimSpace(cred)
	var p *principal.Principal
	var err error
	switch strings.ToLower(scheme) {
	case "bearer":
		p, err = a.fromToken(ctx, cred)
	case "basic":
		id, secret, ok := DecodeBasic(cred)
		if !ok {
			return nil, fhir.ErrUnauthorized
		}
		p, err = a.ClientPrincipal(ctx, id, secret)
	default:
		return nil, fhir.ErrUnauthorized
	}
	if isClientError(err) {
		// A client without a membership is no caller either.
		return nil, fhir.ErrUnauthorized
	}
	return p, err
}

// DecodeBasic decodes the credentials of a Basic header.
func DecodeBasic(cred string) (id, secret string, ok bool) {
	raw, err := base64.StdEncoding.DecodeString(cred)
	if err != nil {
		return "", "", false
	}
	id, secret, ok = strings.Cut(string(raw), ":")
	return id, secret, ok && id != ""
}

func (a *Authenticator) fromToken(ctx context.Context, token string) (*principal.Principal, error) {
	// A token seen and verified within cacheTTL is not verified again: an
	// ECDSA verification costs more than the rest of a small request.
	sum := sha256.Sum256([]byte(token))
	tokenKey := "token:" + base64.RawStdEncoding.EncodeToString(sum[:])
	if p := a.cacheGet(tokenKey); p != nil {
		return p, nil
	}
	gen := a.generation()
	claims, err := a.tokens.Verify(token)
	if err != nil {
		return nil, err
	}
	if p := a.cacheGet("login:" + claims.LoginID); p != nil {
		a.cachePut(tokenKey, p, gen, claims.ExpiresAt.Time)
		return p, nil
	}
	p, err := a.loginPrincipal(ctx, claims.LoginID, claims.ClientID)
	if err != nil {
		return nil, err
	}
	a.cachePut("login:"+claims.LoginID, p, gen, time.Time{})
	a.cachePut(tokenKey, p, gen, claims.ExpiresAt.Time)
	return p, nil
}

// loginPrincipal resolves a login (and the client that logged in, if any)
// into its principal: fhir.ErrUnauthorized when the login is gone or
// revoked, or the client gone or inactive.
func (a *Authenticator) loginPrincipal(ctx context.Context, loginID, clientID string) (*principal.Principal, error) {
	login, err := a.store.Read(ctx, store.AllProjects, "Login", loginID)
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return nil, fhir.ErrUnauthorized
		}
		return nil, err
	}
	lr, err := login.Resource()
	if err != nil {
		return nil, err
	}
	if lr.Bool("revoked") {
		return nil, fhir.ErrUnauthorized
	}
	if clientID != "" {
		// A client's tokens die with the client, whatever became of its
		// membership.
		if err := a.clientAlive(ctx, clientID); err != nil {
			return nil, err
		}
	}
	_, membershipID, _ := fhir.SplitReference(lr.Ref("membership"))
	p, err := a.principalFor(ctx, membershipID)
	if err != nil {
		return nil, err
	}
	p.LoginID = loginID
	p.ClientID = clientID
	return p, nil
}

// Resume resolves again, from the store and nothing cached, the principal
// that c was taken from (principal.CredentialsOf): for work done later on a
// caller's behalf, such as an asynchronous job. It is refused
// (fhir.ErrUnauthorized) whenever the caller's credentials would be refused
// now: its login revoked, its client deleted or deactivated, its membership
// removed or deactivated. What the principal may do (admin, access policy)
// is what it is now.
func (a *Authenticator) Resume(ctx context.Context, c principal.Credentials) (*principal.Principal, error) {
	if c.LoginID != "" {
		p, err := a.loginPrincipal(ctx, c.LoginID, c.ClientID)
		if err != nil {
			return nil, err
		}
		if p.MembershipID() != c.MembershipID {
			return nil, fhir.ErrUnauthorized
		}
		return p, nil
	}
	if c.ClientID != "" {
		// Basic authentication: no login, the client's membership.
		if err := a.clientAlive(ctx, c.ClientID); err != nil {
			return nil, err
		}
	}
	if c.MembershipID == "" {
		return nil, fhir.ErrUnauthorized
	}
	p, err := a.principalFor(ctx, c.MembershipID)
	if err != nil {
		return nil, err
	}
	p.ClientID = c.ClientID
	return p, nil
}

// ClientPrincipal checks a client's credentials (constant-time secret
// comparison) and resolves its membership.
func (a *Authenticator) ClientPrincipal(ctx context.Context, clientID, secret string) (*principal.Principal, error) {
	sum := sha256.Sum256([]byte(clientID + "\x00" + secret))
	key := "basic:" + base64.RawStdEncoding.EncodeToString(sum[:])
	if p := a.cacheGet(key); p != nil {
		return p, nil
	}
	gen := a.generation()
	client, err := a.CheckClient(ctx, clientID, secret)
	if err != nil {
		return nil, fhir.ErrUnauthorized
	}
	p, err := a.clientMembership(ctx, client)
	if err != nil {
		return nil, err
	}
	a.cachePut(key, p, gen, time.Time{})
	return p, nil
}

// clientAlive is fhir.ErrUnauthorized unless the ClientApplication exists
// and is active.
func (a *Authenticator) clientAlive(ctx context.Context, clientID string) error {
	rec, err := a.store.Read(ctx, store.AllProjects, "ClientApplication", clientID)
	if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
		return fhir.ErrUnauthorized
	}
	if err != nil {
		return err
	}
	client, err := rec.Resource()
	if err != nil {
		return err
	}
	if st := client.String("status"); st != "" && st != "active" {
		return fhir.ErrUnauthorized
	}
	return nil
}

// ClientError says why client credentials were refused, in the words of the
// reference's token endpoint.
type ClientError struct{ Description string }

func (e *ClientError) Error() string { return e.Description }

// CheckClient verifies a ClientApplication's id and secret.
func (a *Authenticator) CheckClient(ctx context.Context, clientID, secret string) (fhir.Resource, error) {
	if !fhir.ValidID(clientID) {
		return nil, &ClientError{"Invalid client"}
	}
	rec, err := a.store.Read(ctx, store.AllProjects, "ClientApplication", clientID)
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return nil, &ClientError{"Invalid client"}
		}
		return nil, err
	}
	client, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	if st := client.String("status"); st != "" && st != "active" {
		return nil, &ClientError{"Invalid client"}
	}
	want := client.String("secret")
	if want == "" || subtle.ConstantTimeCompare([]byte(want), []byte(secret)) != 1 {
		return nil, &ClientError{"Invalid secret"}
	}
	return client, nil
}

func (a *Authenticator) clientMembership(ctx context.Context, client fhir.Resource) (*principal.Principal, error) {
	m, err := principal.FindMembership(ctx, a.store, "ClientApplication/"+client.ID())
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, &ClientError{"Invalid client"}
	}
	p, err := a.principalFor(ctx, m.ID())
	if err != nil {
		return nil, err
	}
	p.ClientID = client.ID()
	return p, nil
}

// PrincipalForUser is principal.ForUser, cached like a login (and dropped
// with it when what it is made of changes): the principal a trigger acts
// as for a Bot (an HL7 message's run resolves its Bot's membership for
// every message). Nil, not cached, when userRef has no membership. The
// caller gets a copy of its own.
func (a *Authenticator) PrincipalForUser(ctx context.Context, userRef string) (*principal.Principal, error) {
	key := "user " + userRef
	if p := a.cacheGet(key); p != nil {
		cp := *p
		return &cp, nil
	}
	gen := a.generation()
	p, err := principal.ForUser(ctx, a.store, userRef)
	if err != nil || p == nil {
		return p, err
	}
	a.cachePut(key, p, gen, time.Time{})
	cp := *p
	return &cp, nil
}

// principalFor loads a membership and its project.
func (a *Authenticator) principalFor(ctx context.Context, membershipID string) (*principal.Principal, error) {
	return principal.ForMembership(ctx, a.store, membershipID)
}

func isClientError(err error) bool { _, ok := err.(*ClientError); return ok }
