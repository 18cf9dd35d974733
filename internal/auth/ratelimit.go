package auth

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
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
//
// An address over its limit is remembered here until its window ends, and
// refused without asking the store again: a flood of auth requests from one
// address costs the database one write per allowed request, not one per
// request.
type RateLimiter struct {
	store  store.Store
	limit  int64
	window time.Duration
	log    *slog.Logger

	mu sync.Mutex
	// refused holds addresses over their limit, until their window ends.
	refused map[string]time.Time
}

// maxRefused bounds the addresses remembered as over their limit; beyond it
// the ended windows are dropped, and if none has ended, all of them (those
// addresses then cost a store write each again, nothing worse).
const maxRefused = 100000

// NewRateLimiter allows lim.AuthRequestsPerMinute requests per address
// (zero: the default; negative: no limit), counted in s.
func NewRateLimiter(s store.Store, lim limits.Limits, log *slog.Logger) *RateLimiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RateLimiter{store: s, limit: lim.WithDefaults().AuthRequestsPerMinute, window: time.Minute, log: log, refused: map[string]time.Time{}}
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
		addr := httpx.ClientIP(r)
		n, ends := l.limit+1, l.refusedUntil(addr)
		if ends.IsZero() {
			var err error
			if n, ends, err = l.store.CountHit(r.Context(), "auth "+addr, l.window); err != nil {
				httpx.WriteError(w, r, l.log, err)
				return
			}
		}
		reset := max(1, int(time.Until(ends).Seconds()+0.999))
		w.Header().Set("RateLimit-Limit", strconv.FormatInt(l.limit, 10))
		w.Header().Set("RateLimit-Remaining", strconv.FormatInt(max(0, l.limit-n), 10))
		w.Header().Set("RateLimit-Reset", strconv.Itoa(reset))
		if n > l.limit {
			l.refuse(addr, ends)
			w.Header().Set("Retry-After", strconv.Itoa(reset))
			httpx.WriteError(w, r, l.log, &fhir.Error{Code: fhir.EThrottled, Message: "Too Many Requests"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refusedUntil is the end of addr's window if addr is known to be over its
// limit, else the zero time.
func (l *RateLimiter) refusedUntil(addr string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	ends, ok := l.refused[addr]
	if !ok || !time.Now().Before(ends) {
		return time.Time{}
	}
	return ends
}

func (l *RateLimiter) refuse(addr string, ends time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.refused) >= maxRefused {
		now := time.Now()
		for a, e := range l.refused {
			if !now.Before(e) {
				delete(l.refused, a)
			}
		}
		if len(l.refused) >= maxRefused {
			clear(l.refused)
		}
	}
	l.refused[addr] = ends
}
