package fhirapi

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/bulkexport"
)

// registerExport adds Bulk Data export: $export at the system, Patient and
// Group levels, and the export's status (its manifest once done) and
// cancellation.
func (h *Handler) registerExport(r *mux.Router) {
	if h.cfg.Export == nil {
		return
	}
	r.HandleFunc("/$export", h.export(bulkexport.System)).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/Patient/$export", h.export(bulkexport.Patient)).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/Group/{id}/$export", h.export(bulkexport.Group)).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/bulkdata/export/{id}", h.exportStatus).Methods(http.MethodGet)
	r.HandleFunc("/bulkdata/export/{id}", h.exportCancel).Methods(http.MethodDelete)
}

// export decodes a $export: Prefer: respond-async is required (Bulk
// Data), the parameters come from the query and, on a POST, from a
// Parameters body; the answer is 202 with the status URL.
func (h *Handler) export(level string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(strings.ToLower(r.Header.Get("Prefer")), "respond-async") {
			h.fail(w, r, fhir.Invalid("$export needs the header Prefer: respond-async", "Prefer"))
			return
		}
		params := r.URL.Query()
		if r.Method == http.MethodPost && r.ContentLength != 0 {
			body, err := httpx.ReadBody(r, 1<<20)
			if err != nil {
				h.fail(w, r, err)
				return
			}
			if len(strings.TrimSpace(string(body))) > 0 {
				if err := parametersInto(body, params); err != nil {
					h.fail(w, r, err)
					return
				}
			}
		}
		id, err := h.cfg.Export.Start(r.Context(), principal.FromContext(r.Context()), bulkexport.Request{Level: level,
			GroupID: mux.Vars(r)["id"], Params: params, URL: h.cfg.BaseURL + strings.TrimPrefix(r.URL.RequestURI(), "/")})
		if err != nil {
			h.fail(w, r, err)
			return
		}
		status := h.cfg.BaseURL + "fhir/R4/bulkdata/export/" + id
		w.Header().Set("Content-Location", status)
		httpx.WriteOutcome(w, r, http.StatusAccepted, fhir.Accepted(status))
	}
}

// parametersInto adds a Parameters body's valueString, valueCode and
// valueInstant parameters to params.
func parametersInto(body []byte, params url.Values) error {
	var p struct {
		ResourceType string `json:"resourceType"`
		Parameter    []map[string]any
	}
	if err := json.Unmarshal(body, &p); err != nil || p.ResourceType != "Parameters" {
		return fhir.Invalid("The body of $export must be a Parameters resource")
	}
	for _, prm := range p.Parameter {
		name, _ := prm["name"].(string)
		for _, k := range []string{"valueString", "valueCode", "valueInstant", "valueDateTime"} {
			if v, ok := prm[k].(string); ok && name != "" {
				params.Add(name, v)
			}
		}
	}
	return nil
}

// exportStatus answers 202 (with X-Progress) while the export runs, its
// manifest when it is done, and the outcome of one that failed.
func (h *Handler) exportStatus(w http.ResponseWriter, r *http.Request) {
	st, err := h.cfg.Export.StatusOf(r.Context(), principal.FromContext(r.Context()), mux.Vars(r)["id"])
	if err != nil {
		h.fail(w, r, err)
		return
	}
	switch {
	case !st.Done:
		w.Header().Set("X-Progress", st.Progress)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusAccepted)
	case st.Failed != nil:
		h.fail(w, r, st.Failed)
	default:
		httpx.WriteJSON(w, http.StatusOK, "application/json", st.Manifest)
	}
}

func (h *Handler) exportCancel(w http.ResponseWriter, r *http.Request) {
	if err := h.cfg.Export.Cancel(r.Context(), principal.FromContext(r.Context()), mux.Vars(r)["id"]); err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusAccepted, fhir.Accepted(""))
}
