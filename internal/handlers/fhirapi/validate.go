package fhirapi

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
)

// validateRoutes add $validate, type and instance level.
func (h *Handler) validateRoutes(api *mux.Router) {
	api.HandleFunc("/{type}/$validate", h.validate).Methods(http.MethodPost)
	api.HandleFunc("/{type}/{id}/$validate", h.validate).Methods(http.MethodPost)
}

// validate decodes a $validate (the body; mode and profile in the query)
// and encodes the FHIR service's OperationOutcome, 200 whether or not the
// resource is valid.
func (h *Handler) validate(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	vars := mux.Vars(r)
	if err := fhirservice.Authorize(p, vars["type"], fhirservice.OpRead); err != nil {
		h.fail(w, r, err)
		return
	}
	body, err := httpx.ReadBody(r, int64(h.cfg.Limits.JSONBodyBytes))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	out, err := h.svc.Validate(r.Context(), p, fhirservice.ValidateRequest{Type: vars["type"], ID: vars["id"], Body: body,
		Mode: q.Get("mode"), Profile: q.Get("profile")})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, out)
}
