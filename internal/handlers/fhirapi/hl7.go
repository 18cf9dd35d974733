package fhirapi

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
)

// HL7 is what the HL7 feed's operations need of its service
// (internal/services/hl7feed).
type HL7 interface {
	Rerun(ctx context.Context, p *principal.Principal, id string) (fhir.Resource, error)
}

// registerHL7 adds POST AsyncJob/{id}/$rerun: a project admin runs a failed
// HL7 message (an AsyncJob of type hl7-message) again; the answer is the
// AsyncJob, now accepted.
func (h *Handler) registerHL7(r *mux.Router) {
	if h.cfg.HL7 == nil {
		return
	}
	r.HandleFunc("/AsyncJob/{id}/$rerun", func(w http.ResponseWriter, r *http.Request) {
		job, err := h.cfg.HL7.Rerun(r.Context(), principal.FromContext(r.Context()), mux.Vars(r)["id"])
		if err != nil {
			h.fail(w, r, err)
			return
		}
		httpx.WriteJSON(w, http.StatusAccepted, httpx.FHIRJSON, job)
	}).Methods(http.MethodPost)
}
