package auth

import (
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/limits"
)

// RateLimiter limits the auth endpoints (/auth/* except /auth/me, and
// /oauth2/*) per client IP with a fixed one-minute window. The client IP is
// the connection's address: forwarded headers are not trusted.
type RateLimiter struct {
	limit  int
	window time.Duration
	log    *slog.Logger

	mu      sync.Mutex
	start   time.Time
	counts  map[string]int
	nowFunc func() time.Time
}

// NewRateLimiter allows lim.AuthRequestsPerMinute requests per IP (zero:
// the default; negative: no limit).
func NewRateLimiter(lim limits.Limits, log *slog.Logger) *RateLimiter {
	perMinute := int(lim.WithDefaults().AuthRequestsPerMinute)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RateLimiter{limit: perMinute, window: time.Minute, log: log, counts: map[string]int{}, nowFunc: time.Now}
}

func limited(path string) bool {
	if path == "/auth/me" {
		return false
	}
	return strings.HasPrefix(path, "/auth/") || strings.HasPrefix(path, "/oauth2/")
}

// allow counts a request of ip and reports whether it is within the limit,
// with the seconds until the window resets.
func (l *RateLimiter) allow(ip string) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.nowFunc()
	if now.Sub(l.start) >= l.window {
		l.start = now
		l.counts = map[string]int{}
	}
	l.counts[ip]++
	reset := int(l.window.Seconds() - now.Sub(l.start).Seconds())
	if reset < 1 {
		reset = 1
	}
	return l.counts[ip] <= l.limit, reset
}

// Middleware applies the limit to the auth paths; other paths pass.
func (l *RateLimiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.limit < 0 || !limited(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		ip, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			ip = r.RemoteAddr
		}
		ok, reset := l.allow(ip)
		w.Header().Set("RateLimit-Limit", strconv.Itoa(l.limit))
		if !ok {
			w.Header().Set("Retry-After", strconv.Itoa(reset))
			w.Header().Set("RateLimit-Remaining", "0")
			w.Header().Set("RateLimit-Reset", strconv.Itoa(reset))
			httpx.WriteError(w, r, l.log, &fhir.Error{Code: fhir.EThrottled, Message: "Too Many Requests"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
