// Package password keeps credentials at rest. Passwords are bcrypt hashes,
// under one rule for every place that sets one (an invitation, a
// set-password link, a change of password): 8 to 72 bytes, 72 being what
// bcrypt reads. Secrets that are presented once (set-password links, login
// codes, refresh tokens) are random and kept as SHA-256 digests: they carry
// their own entropy, so a fast digest is enough, and a stolen table gives
// nothing that can be presented.
package password

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"sync"

	"golang.org/x/crypto/bcrypt"

	"github.com/sandbot/sandbot/fhir"
)

// Length bounds of a new password.
const (
	MinLength = 8
	// MaxBytes is bcrypt's input limit: it reads no more (and x/crypto
	// refuses a longer password).
	MaxBytes = 72
)

// Check validates a new password: a 400 naming field when it is shorter
// than MinLength or longer than MaxBytes.
func Check(pw, field string) error {
	if len(pw) < MinLength {
		return fhir.Invalid("Password must be at least 8 characters", field)
	}
	if len(pw) > MaxBytes {
		return fhir.Invalid("Password must be no more than 72 characters", field)
	}
	return nil
}

// Hash hashes a password (checked with Check) with bcrypt.
func Hash(pw string) (string, error) {
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.DefaultCost)
	return string(h), err
}

var (
	dummyOnce sync.Once
	dummyHash []byte
)

// Verify reports whether pw is the password of hash. An empty hash (no
// such user, or a user without a password) is false after the same bcrypt
// work as a real comparison, so that timing does not reveal whether an
// account exists.
func Verify(hash, pw string) bool {
	if hash == "" {
		dummyOnce.Do(func() {
			dummyHash, _ = bcrypt.GenerateFromPassword([]byte("sandbot-dummy-password"), bcrypt.DefaultCost)
		})
		bcrypt.CompareHashAndPassword(dummyHash, []byte(pw))
		return false
	}
	return bcrypt.CompareHashAndPassword([]byte(hash), []byte(pw)) == nil
}

// NewSecret is a random one-time secret (256 bits, URL-safe): a login code,
// a refresh token, a set-password link's secret.
func NewSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// HashSecret is how a one-time secret is stored.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// SecretMatches reports, in constant time, whether presented is the secret
// whose HashSecret is stored (never for an empty stored digest).
func SecretMatches(stored, presented string) bool {
	h := HashSecret(presented)
	return stored != "" && subtle.ConstantTimeCompare([]byte(stored), []byte(h)) == 1
}
