package httpx

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sandbot/sandbot/fhir"
)

// CORS lets browser applications served from other origins (the reference's
// web app, or any app built on @medplum/react) call the API. Only origins
// listed exactly are allowed: an allowed Origin is reflected with
// Access-Control-Allow-Credentials (the client sends credentials: 'include',
// so a wildcard would be refused by browsers and is never sent), and every
// answer on a CORS path carries Vary: Origin so that caches keep answers for
// different origins apart. Preflights are answered here, before rate limits
// and authentication: a browser sends them without the Authorization header.
type CORS struct {
	origins  map[string]bool
	prefixes []string
}

// CORSPrefixes are the API paths that answer cross-origin requests: the FHIR
// API, the sign-in endpoints, OAuth, project administration and the signing
// keys. Ops endpoints and the root are not among them.
var CORSPrefixes = []string{"/fhir/", "/auth/", "/oauth2/", "/admin/", "/.well-known/"}

// corsAllowHeaders are the request headers @medplum/core (and the browser on
// its behalf) sends: credentials, content negotiation, conditional requests,
// the extended-mode and on-behalf-of headers, Binary security contexts and
// tracing.
var corsAllowHeaders = strings.Join([]string{
	"Accept", "Authorization", "Cache-Control", "Content-Type", "If-Match", "If-Modified-Since",
	"If-None-Exist", "If-None-Match", "Pragma", "Prefer", "traceparent", "X-Medplum",
	"X-Medplum-On-Behalf-Of", "X-Security-Context", "X-Trace-Id",
}, ", ")

// corsExposeHeaders are the response headers the client reads beyond the
// safelisted ones: where a resource or a job is, versions, rate limits and
// the request id to quote in a support request.
var corsExposeHeaders = strings.Join([]string{
	"Content-Location", "ETag", "Last-Modified", "Location", "RateLimit", "RateLimit-Limit",
	"RateLimit-Remaining", "RateLimit-Reset", "Retry-After", "X-Request-Id",
}, ", ")

const corsMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

// corsMaxAge is how long a browser may reuse a preflight (Chromium caps it
// at two hours).
const corsMaxAge = 2 * 60 * 60

// NewCORS allows the given origins (scheme://host[:port], as a browser sends
// them in the Origin header; ParseOrigin normalises configured values).
// With no origins every cross-origin request is refused.
func NewCORS(origins []string) *CORS {
	c := &CORS{origins: map[string]bool{}, prefixes: CORSPrefixes}
	for _, o := range origins {
		if n, err := ParseOrigin(o); err == nil {
			c.origins[n] = true
		}
	}
	return c
}

// ParseOrigin checks that s is an origin, an absolute http(s) URL with no
// path, query or credentials ("*" is refused), and returns it in the form
// browsers send: lower-case scheme and host, no trailing slash.
func ParseOrigin(s string) (string, error) {
	s = strings.TrimSpace(s)
	u, err := url.Parse(strings.TrimSuffix(s, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
		return "", fhir.Invalid("not an origin like https://app.example.com or http://localhost:3000: " + quoteShort(s))
	}
	return strings.ToLower(u.Scheme + "://" + u.Host), nil
}

func quoteShort(s string) string {
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strconv.Quote(s)
}

// OriginOf is the origin of an absolute URL (for instance the app's base
// URL), or "" when it has none.
func OriginOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return ""
	}
	return strings.ToLower(u.Scheme + "://" + u.Host)
}

func (c *CORS) applies(path string) bool {
	for _, p := range c.prefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// Middleware answers preflights and adds the CORS headers to the answers of
// allowed origins; requests without an Origin pass untouched.
func (c *CORS) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.applies(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		origin := r.Header.Get("Origin")
		allowed := origin != "" && c.origins[strings.ToLower(origin)]
		preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
		if preflight {
			if !allowed {
				WriteOutcome(w, r, http.StatusForbidden, fhir.OutcomeFor(fhir.Errorf(fhir.EForbidden,
					"Origin not allowed: add it to SANDBOT_CORS_ORIGINS")))
				return
			}
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Credentials", "true")
			h.Set("Access-Control-Allow-Methods", corsMethods)
			h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
			h.Set("Access-Control-Max-Age", strconv.Itoa(corsMaxAge))
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if allowed {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Credentials", "true")
			h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		}
		next.ServeHTTP(w, r)
	})
}
