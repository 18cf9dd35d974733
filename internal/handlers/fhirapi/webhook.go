package fhirapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/services/auth"
	"github.com/sandbot/sandbot/internal/services/bots"
)

// RegisterWebhooks adds the public webhooks, POST /webhook/{membership}
// without a token, rate-limited per client address by limit (a limiter of
// its own, apart from the auth endpoints'). The bots service decides
// whether the membership's Bot may be run this way (bots.Service.Webhook).
func (h *Handler) RegisterWebhooks(r *mux.Router, limit *auth.RateLimiter) {
	if h.bots == nil {
		return
	}
	r.Handle("/webhook/{id}", h.webhookLimit(limit, http.HandlerFunc(h.webhook))).Methods(http.MethodPost)
}

// webhookLimit refuses a client address over its budget with 429 and
// Retry-After, before anything of the request is read.
func (h *Handler) webhookLimit(l *auth.RateLimiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l == nil || l.Unlimited() {
			next.ServeHTTP(w, r)
			return
		}
		c, err := l.Hit(r.Context(), httpx.ClientIP(r))
		if err != nil {
			h.fail(w, r, err)
			return
		}
		reset := max(1, int(time.Until(c.Reset).Seconds()+0.999))
		w.Header().Set("RateLimit-Limit", strconv.FormatInt(c.Limit, 10))
		w.Header().Set("RateLimit-Remaining", strconv.FormatInt(c.Remaining, 10))
		w.Header().Set("RateLimit-Reset", strconv.Itoa(reset))
		if !c.Allowed {
			w.Header().Set("Retry-After", strconv.Itoa(reset))
			h.fail(w, r, &fhir.Error{Code: fhir.EThrottled, Message: "Too Many Requests"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// webhook decodes a public webhook's request (its body, of its media type,
// and its headers) and encodes what the bot answered, as $execute does.
func (h *Handler) webhook(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	mt := httpx.MediaType(r)
	body, err := httpx.ReadBody(r, h.bots.InputLimit(mt))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := h.bots.Webhook(ctx, mux.Vars(r)["id"], bots.Execute{Input: body, ContentType: mt,
		Headers: eventHeaders(r), TraceID: httpx.TraceID(ctx)})
	switch {
	case err != nil && ctx.Err() != nil:
		return
	case err != nil:
		h.fail(w, r, err)
	case res.Outcome != nil:
		httpx.WriteOutcome(w, r, res.Status, res.Outcome)
	default:
		httpx.WriteJSON(w, res.Status, res.ContentType, res.Body)
	}
}
