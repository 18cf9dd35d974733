package httpx

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies are the peers whose X-Forwarded-For and Forwarded headers
// are believed (SANDBOT_TRUSTED_PROXIES): the load balancers in front of
// sandbot. From anyone else these headers are the client's own words and
// are ignored, or a client could choose its address, and with it its rate
// limit.
type TrustedProxies []netip.Prefix

// ParseTrustedProxies reads a comma-separated list of CIDRs or addresses
// ("10.0.0.0/8, 127.0.0.1").
func ParseTrustedProxies(list string) (TrustedProxies, error) {
	var out TrustedProxies
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR (10.0.0.0/8) or an address", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

func (t TrustedProxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP resolves the address of the client that sent r. It is the
// connection's peer, unless the peer is a trusted proxy: then the forwarded
// chain (Forwarded's for= values if the header is present, else
// X-Forwarded-For), read from the right, gives the first address that is not
// a trusted proxy. Each proxy appends the address it received the request
// from, so everything left of the first untrusted hop is whatever the client
// wrote, and is never believed. A hop that is not an address (a Forwarded
// "unknown" or obfuscated name) stops the walk at the last address known.
func (t TrustedProxies) ClientIP(r *http.Request) string {
	peer := peerAddr(r.RemoteAddr)
	if !peer.IsValid() {
		return r.RemoteAddr
	}
	if len(t) == 0 || !t.trusts(peer) {
		return peer.Unmap().String()
	}
	hops := forwardedFor(r.Header)
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseHop(hops[i])
		if !a.IsValid() {
			break
		}
		client = a
		if !t.trusts(a) {
			break
		}
	}
	return client.Unmap().String()
}

func peerAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr()
	}
	a, _ := netip.ParseAddr(remote)
	return a
}

// forwardedFor lists the hops of the forwarded chain, leftmost first.
func forwardedFor(h http.Header) []string {
	var hops []string
	if fwd := h.Values("Forwarded"); len(fwd) > 0 {
		for _, line := range fwd {
			for _, elem := range strings.Split(line, ",") {
				for _, pair := range strings.Split(elem, ";") {
					k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if ok && strings.EqualFold(k, "for") {
						hops = append(hops, strings.Trim(v, `"`))
					}
				}
			}
		}
		return hops
	}
	for _, line := range h.Values("X-Forwarded-For") {
		for _, f := range strings.Split(line, ",") {
			hops = append(hops, strings.TrimSpace(f))
		}
	}
	return hops
}

// parseHop reads "1.2.3.4", "1.2.3.4:5678", "[2001:db8::1]:80" or "2001:db8::1".
func parseHop(s string) netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return a
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		a, _ := netip.ParseAddr(strings.Trim(host, "[]"))
		return a
	}
	a, _ := netip.ParseAddr(strings.Trim(s, "[]"))
	return a
}

// ClientAddress is middleware that resolves the client address once
// (TrustedProxies.ClientIP) for ClientIP to return.
func ClientAddress(t TrustedProxies) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := context.WithValue(r.Context(), clientIPKey, t.ClientIP(r))
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// ClientIP is the client address of r as ClientAddress resolved it, or the
// connection's peer address where that middleware did not run.
func ClientIP(r *http.Request) string {
	if s, ok := r.Context().Value(clientIPKey).(string); ok {
		return s
	}
	return TrustedProxies(nil).ClientIP(r)
}
