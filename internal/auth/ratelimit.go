package auth

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/store"
)

// RateLimiter limits the auth endpoints (/auth/* except /auth/me, and
// /oauth2/*) per client address with fixed one-minute windows (each begins
// at the first request after the address's previous window ended). The count lives in the store (store.CountHit), so the limit
// holds across every replica on the database: N replicas do not give N
// budgets. The client address is httpx.ClientIP: the connection's peer, or
// what a trusted proxy forwarded.
type RateLimiter struct {
	store  store.Store
	limit  int64
	window time.Duration
	log    *slog.Logger
}

// NewRateLimiter allows lim.AuthRequestsPerMinute requests per address
// (zero: the default; negative: no limit), counted in s.
func NewRateLimiter(s store.Store, lim limits.Limits, log *slog.Logger) *RateLimiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RateLimiter{store: s, limit: lim.WithDefaults().AuthRequestsPerMinute, window: time.Minute, log: log}
}

func limited(path string) bool {
	if path == "/auth/me" {
		return false
	}
	return strings.HasPrefix(path, "/auth/") || strings.HasPrefix(path, "/oauth2/")
}

// Middleware applies the limit to the auth paths; other paths pass.
func (l *RateLimiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.limit < 0 || !limited(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		n, ends, err := l.store.CountHit(r.Context(), "auth "+httpx.ClientIP(r), l.window)
		if err != nil {
			httpx.WriteError(w, r, l.log, err)
			return
		}
		reset := max(1, int(time.Until(ends).Seconds()+0.999))
		w.Header().Set("RateLimit-Limit", strconv.FormatInt(l.limit, 10))
		w.Header().Set("RateLimit-Remaining", strconv.FormatInt(max(0, l.limit-n), 10))
		w.Header().Set("RateLimit-Reset", strconv.Itoa(reset))
		if n > l.limit {
			w.Header().Set("Retry-After", strconv.Itoa(reset))
			httpx.WriteError(w, r, l.log, &fhir.Error{Code: fhir.EThrottled, Message: "Too Many Requests"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
