package fhirapi

import (
	"net/http"

	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
)

// bundle is POST /fhir/R4: a batch or transaction Bundle, run by the FHIR
// service entry by entry (each authorized as the same request alone). The
// Bundle is a JSON body within the JSON body limit.
func (h *Handler) bundle(w http.ResponseWriter, r *http.Request) {
	body, err := httpx.ReadJSON(r, h.cfg.Limits.JSONBodyBytes)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.write(w, r, h.svc.Bundle(r.Context(), principal.FromContext(r.Context()), body))
}
