package httpx_test

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/sandbot/sandbot/internal/handlers/httpx"
)

func TestClientIP(t *testing.T) {
	trusted, err := httpx.ParseTrustedProxies("10.0.0.0/8, 192.168.1.1, 2001:db8::/32")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, peer string
		headers    map[string]string
		want       string
	}{
		{"no proxy", "203.0.113.9:5555", nil, "203.0.113.9"},
		{"untrusted peer's header is ignored", "203.0.113.9:5555", map[string]string{"X-Forwarded-For": "1.2.3.4"}, "203.0.113.9"},
		{"trusted proxy", "10.1.2.3:80", map[string]string{"X-Forwarded-For": "1.2.3.4"}, "1.2.3.4"},
		{"client-written hops left of the proxy's are ignored", "10.1.2.3:80", map[string]string{"X-Forwarded-For": "6.6.6.6, 1.2.3.4"}, "1.2.3.4"},
		{"two trusted proxies", "10.1.2.3:80", map[string]string{"X-Forwarded-For": "6.6.6.6, 1.2.3.4, 192.168.1.1"}, "1.2.3.4"},
		{"trusted proxy without header", "10.1.2.3:80", nil, "10.1.2.3"},
		{"garbage hop stops at the last address known", "10.1.2.3:80", map[string]string{"X-Forwarded-For": "1.2.3.4, nonsense"}, "10.1.2.3"},
		{"every hop trusted", "10.1.2.3:80", map[string]string{"X-Forwarded-For": "10.9.9.9"}, "10.9.9.9"},
		{"Forwarded wins", "10.1.2.3:80", map[string]string{"Forwarded": `for=5.6.7.8;proto=https, for="[2001:db8::7]:443"`, "X-Forwarded-For": "1.2.3.4"}, "5.6.7.8"},
		{"Forwarded IPv6 client", "10.1.2.3:80", map[string]string{"Forwarded": `for="[2001:dead::1]:443"`}, "2001:dead::1"},
		{"Forwarded unknown", "10.1.2.3:80", map[string]string{"Forwarded": `for=unknown`}, "10.1.2.3"},
		{"port in X-Forwarded-For", "[2001:db8::1]:80", map[string]string{"X-Forwarded-For": "1.2.3.4:999"}, "1.2.3.4"},
		{"IPv4-mapped peer", "[::ffff:10.1.2.3]:80", map[string]string{"X-Forwarded-For": "1.2.3.4"}, "1.2.3.4"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.peer
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		if got := trusted.ClientIP(r); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if _, err := httpx.ParseTrustedProxies("10.0.0.0/8, not-a-cidr"); err == nil {
		t.Error("a bad CIDR was accepted")
	}
}

// FuzzClientIP: whatever the headers, the client address is the peer or an
// address the headers name, never a panic, and an untrusted peer is never
// replaced.
func FuzzClientIP(f *testing.F) {
	f.Add("10.1.2.3:80", "1.2.3.4, 5.6.7.8", `for=1.1.1.1;by=x, for="[::1]:4"`)
	f.Add("203.0.113.9:1", "", "")
	f.Add("[::1]:1", ",,,", "for=;for=\"")
	trusted, _ := httpx.ParseTrustedProxies("10.0.0.0/8, ::1/128")
	f.Fuzz(func(t *testing.T, peer, xff, fwd string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		r.Header.Set("Forwarded", fwd)
		got := trusted.ClientIP(r)
		p, err := netip.ParseAddrPort(peer)
		if err != nil {
			return
		}
		if !netip.MustParsePrefix("10.0.0.0/8").Contains(p.Addr().Unmap()) && p.Addr().Unmap() != netip.MustParseAddr("::1") {
			if got != p.Addr().Unmap().String() {
				t.Fatalf("untrusted peer %s replaced by %q", peer, got)
			}
			return
		}
		a, err := netip.ParseAddr(got)
		if err != nil {
			t.Fatalf("client %q is not an address", got)
		}
		if a != p.Addr().Unmap() && !strings.Contains(xff+fwd, a.String()) && !strings.Contains(strings.ToLower(xff+fwd), strings.ToLower(a.String())) {
			// An address may be written in another form (::ffff:…); it must
			// at least parse from one of the hops.
			found := false
			for _, h := range strings.FieldsFunc(xff+","+fwd, func(r rune) bool { return r == ',' || r == ';' || r == '=' || r == '"' || r == ' ' }) {
				if x, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil && x.Unmap() == a {
					found = true
				}
				if host, _, err := net.SplitHostPort(h); err == nil {
					if x, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil && x.Unmap() == a {
						found = true
					}
				}
			}
			if !found {
				t.Fatalf("client %s is neither the peer nor a forwarded hop (%q, %q)", a, xff, fwd)
			}
		}
	})
}

// sqlStateError stands for a driver error with a SQLSTATE (lib/pq's *Error).
type sqlStateError string

func (e sqlStateError) Error() string    { return "pq: " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

// TestUnavailableIs503: connection-level failures of the store are 503 with
// Retry-After (the request may succeed in a moment), logged as warnings;
// other errors stay 500.
func TestUnavailableIs503(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("read Bot/x: %w", driver.ErrBadConn), 503},
		{fmt.Errorf("begin: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), 503},
		{fmt.Errorf("commit: %w", syscall.ECONNRESET), 503},
		{sqlStateError("57P01"), 503}, // admin shutdown
		{sqlStateError("57P03"), 503}, // cannot connect now
		{sqlStateError("08006"), 503}, // connection failure
		{sqlStateError("23505"), 500}, // unique violation: a bug, not an outage
		{fmt.Errorf("something else"), 500},
	} {
		rec := httptest.NewRecorder()
		httpx.WriteError(rec, httptest.NewRequest("GET", "/x", nil), slog.New(slog.DiscardHandler), tc.err)
		if rec.Code != tc.want {
			t.Errorf("%v: %d, want %d", tc.err, rec.Code, tc.want)
			continue
		}
		var o struct {
			ResourceType string
			Issue        []struct{ Code string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil || o.ResourceType != "OperationOutcome" {
			t.Errorf("%v: body %s", tc.err, rec.Body)
		}
		if tc.want == 503 && (rec.Header().Get("Retry-After") == "" || o.Issue[0].Code != "transient") {
			t.Errorf("%v: Retry-After %q, issue %+v", tc.err, rec.Header().Get("Retry-After"), o.Issue)
		}
		if tc.want == 500 && rec.Header().Get("Retry-After") != "" {
			t.Errorf("%v: a 500 with Retry-After", tc.err)
		}
	}
}
