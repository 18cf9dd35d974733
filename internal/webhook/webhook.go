// Package webhook posts to URLs outside the server on a user's behalf (a
// Subscription's HTTP rest-hook), refusing every address inside: loopback,
// private, link-local (the cloud metadata service among them), unspecified,
// multicast and reserved addresses, unless the operator allows a range. The
// check is made on the address actually dialled, after DNS resolution and
// again for every redirect, so neither a name that resolves inside nor a
// redirect to one gets through.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrRefusedAddress is wrapped by the error of a call to an address the
// client may not reach.
var ErrRefusedAddress = errors.New("webhook: the address is not a public one")

// maxRedirects is how many redirects a call follows.
const maxRedirects = 3

// maxResponseBytes is how much of an answer is read (and thrown away) so
// that its connection can be reused.
const maxResponseBytes = 64 << 10

// Config configures a Client.
type Config struct {
	// Allow are ranges the client may reach although they are not public
	// (SANDBOT_WEBHOOK_ALLOW); empty allows none.
	Allow []netip.Prefix
	// Timeout bounds a whole call, redirects included.
	Timeout time.Duration
}

// Client posts to outside URLs.
type Client struct {
	http  *http.Client
	allow []netip.Prefix
}

// New builds a client.
func New(cfg Config) *Client {
	c := &Client{allow: cfg.Allow}
	dialer := &net.Dialer{Timeout: cfg.Timeout, Control: c.control}
	transport := &http.Transport{
		// No proxy from the environment: it would be dialled instead of the
		// address checked.
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
	}
	c.http = &http.Client{
		Transport: transport,
		Timeout:   cfg.Timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > maxRedirects {
				return fmt.Errorf("webhook: more than %d redirects", maxRedirects)
			}
			return checkURL(req.URL)
		},
	}
	return c
}

// control refuses, at the socket, an address that is neither public nor
// allowed.
func (c *Client) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrRefusedAddress, address)
	}
	if !c.Allowed(ap.Addr()) {
		return fmt.Errorf("%w: %s", ErrRefusedAddress, ap.Addr())
	}
	return nil
}

// reserved are ranges that are not public although netip does not say so.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // this network
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (carrier NAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),    // NAT64: an IPv4 address inside
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local NAT64
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("2002::/16"),       // 6to4: an IPv4 address inside
	netip.MustParsePrefix("2001::/32"),       // Teredo
}

// Allowed reports whether the client may call addr: a public unicast
// address, or one in the operator's allowed ranges.
func (c *Client) Allowed(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range c.allow {
		if p.Contains(addr) {
			return true
		}
	}
	if !addr.IsGlobalUnicast() || addr.IsPrivate() {
		return false
	}
	for _, p := range reserved {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}

// checkURL refuses a URL that is not http or https, or that carries
// credentials.
func checkURL(u *url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("webhook: %q is not an http or https URL", u.Scheme)
	}
	if u.User != nil {
		return errors.New("webhook: a URL may not carry credentials")
	}
	if u.Host == "" {
		return errors.New("webhook: the URL has no host")
	}
	return nil
}

// CheckURL reports whether raw is a URL the client would call (its address
// is only checked when it is called): http or https, absolute, without
// credentials.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("webhook: not a URL")
	}
	return checkURL(u)
}

// Header is one header of a call, in order.
type Header struct{ Name, Value string }

// Post sends body to rawURL with the headers, and answers the status of the
// answer (after redirects).
func (c *Client) Post(ctx context.Context, rawURL string, body []byte, headers []Header) (int, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, errors.New("webhook: not a URL")
	}
	if err := checkURL(u); err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	for _, h := range headers {
		// A header that net/http would refuse (a line break in it, say) is
		// left out rather than failing the call.
		if h.Name == "" || strings.ContainsAny(h.Name+h.Value, "\r\n\x00") {
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// Sign is the signature of body with secret, as the reference sends it in
// X-Signature: the hex HMAC-SHA256.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// ParseAllow parses SANDBOT_WEBHOOK_ALLOW: comma-separated CIDRs or single
// addresses.
func ParseAllow(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("%q is not an address or a CIDR", f)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
