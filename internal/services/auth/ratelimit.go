package auth

import (
	"context"
	"sync"
	"time"

	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/store"
)

// RateLimiter counts the requests of each client address to the auth
// endpoints (which ones: internal/handlers/authapi) in fixed one-minute
// windows (each begins at the first request after the address's previous
// window ended). The count lives in the store (store.CountHit), so the limit
// holds across every replica on the database: N replicas do not give N
// budgets.
//
// An address over its limit is remembered here until its window ends, and
// refused without asking the store again: a flood of auth requests from one
// address costs the database one write per allowed request, not one per
// request.
type RateLimiter struct {
	store  store.Store
	name   string
	limit  int64
	window time.Duration

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
func NewRateLimiter(s store.Store, lim limits.Limits) *RateLimiter {
	return NewNamedRateLimiter(s, "auth", lim.WithDefaults().AuthRequestsPerMinute)
}

// NewNamedRateLimiter allows perMinute requests per address (negative: no
// limit) to what name counts (the public webhooks, say), counted in s
// apart from every other limiter's.
func NewNamedRateLimiter(s store.Store, name string, perMinute int64) *RateLimiter {
	return &RateLimiter{store: s, name: name, limit: perMinute, window: time.Minute, refused: map[string]time.Time{}}
}

// Count is what the limiter decided about one request.
type Count struct {
	// Limit is the requests an address may make in a window; Remaining how
	// many it has left after this one.
	Limit, Remaining int64
	// Reset is when the address's window ends.
	Reset time.Time
	// Allowed is false when the address is over its limit.
	Allowed bool
}

// Unlimited reports whether the limiter counts nothing (a negative limit).
func (l *RateLimiter) Unlimited() bool { return l.limit < 0 }

// Hit counts one request from addr.
func (l *RateLimiter) Hit(ctx context.Context, addr string) (Count, error) {
	n, ends := l.limit+1, l.refusedUntil(addr)
	if ends.IsZero() {
		var err error
		if n, ends, err = l.store.CountHit(ctx, l.name+" "+addr, l.window); err != nil {
			return Count{}, err
		}
	}
	c := Count{Limit: l.limit, Remaining: max(0, l.limit-n), Reset: ends, Allowed: n <= l.limit}
	if !c.Allowed {
		l.refuse(addr, ends)
	}
	return c, nil
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
