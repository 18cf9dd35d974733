// Package auth authenticates API callers and runs their logins, with no
// HTTP (that is internal/handlers/authapi): it issues and verifies the JWT
// access tokens (ES256, signed with a key kept in the store so that restarts
// and replicas agree), resolves Bearer and Basic credentials to a
// principal.Principal (login, membership, project; cached, and dropped as
// the store's change feed tells of changes), runs the token endpoint's
// grants (client credentials, authorization code with PKCE, refresh token),
// the password login (Login, ChooseProfile, SetScope), SetPassword, Me, the
// web app's account operations (Method, ChangePassword, Revoke, Logout) and
// counts the auth rate limit in the store. Logins, password hashes and
// set-password requests are written through the FHIR service
// (internal/services/fhirservice) by the server (principal.System), so that its Rules
// decide their fields; accounts are found by e-mail with its UsersByEmail.
package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// signingKeyName is where the store keeps the PKCS#8 PEM of the signing key.
const signingKeyName = "oauth.signing-key.es256"

// Claims are the access token claims the reference client reads: client_id
// must equal the client's id, and login_id makes it call /auth/me.
type Claims struct {
	ClientID string `json:"client_id,omitempty"`
	LoginID  string `json:"login_id"`
	Username string `json:"username,omitempty"`
	Profile  string `json:"profile,omitempty"`
	Scope    string `json:"scope,omitempty"`
	jwt.RegisteredClaims
}

// Tokens signs and verifies tokens.
type Tokens struct {
	key    *ecdsa.PrivateKey
	kid    string
	issuer string
	ttl    time.Duration
	parser *jwt.Parser
}

// NewTokens loads the signing key from the store, creating it on first use.
func NewTokens(ctx context.Context, s store.Store, issuer string, ttl time.Duration) (*Tokens, error) {
	pemText, err := s.KeyValue(ctx, signingKeyName, func() (string, error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", err
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return "", err
		}
		return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), nil
	})
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	block, _ := pem.Decode([]byte(pemText))
	if block == nil {
		return nil, errors.New("signing key: stored key is not PEM")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("signing key: stored key is not ECDSA")
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	sum := sha256.Sum256(pub)
	return &Tokens{
		key:    key,
		kid:    base64.RawURLEncoding.EncodeToString(sum[:12]),
		issuer: issuer,
		ttl:    ttl,
		// Only ES256 is accepted: this is what rejects "alg: none" and
		// HMAC-with-the-public-key forgeries.
		parser: jwt.NewParser(jwt.WithValidMethods([]string{"ES256"}), jwt.WithIssuer(issuer), jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(30*time.Second)),
	}, nil
}

// TTL is the lifetime of access tokens.
func (t *Tokens) TTL() time.Duration { return t.ttl }

// Sign issues a token for the claims, filling iss, iat and exp.
func (t *Tokens) Sign(c Claims) (string, error) {
	now := time.Now()
	c.Issuer = t.issuer
	c.IssuedAt = jwt.NewNumericDate(now)
	if c.ExpiresAt == nil {
		c.ExpiresAt = jwt.NewNumericDate(now.Add(t.ttl))
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, c)
	tok.Header["kid"] = t.kid
	return tok.SignedString(t.key)
}

// Issuer is the issuer of the tokens: the server's public base URL without
// its trailing slash.
func (t *Tokens) Issuer() string { return t.issuer }

// Verify checks signature, algorithm, issuer and expiry.
func (t *Tokens) Verify(token string) (*Claims, error) {
	var c Claims
	_, err := t.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return &t.key.PublicKey, nil })
	if err != nil || c.LoginID == "" {
		return nil, fhir.ErrUnauthorized
	}
	return &c, nil
}

// JWKS is the public key set, for clients that verify tokens themselves.
func (t *Tokens) JWKS() map[string]any {
	pad := func(b []byte) string {
		out := make([]byte, 32)
		copy(out[32-len(b):], b)
		return base64.RawURLEncoding.EncodeToString(out)
	}
	return map[string]any{"keys": []map[string]any{{
		"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": t.kid,
		"x": pad(t.key.PublicKey.X.Bytes()), "y": pad(t.key.PublicKey.Y.Bytes()),
	}}}
}
