package fhirapi

import (
	"net/http"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
)

// definitionRoutes add ValueSet/$expand (the FHIR service's Expand, over
// the definitions and the project's own ValueSets); the other interactions
// on the definition types are the FHIR service's, like any resource's.
func (h *Handler) definitionRoutes(api *mux.Router) {
	api.HandleFunc("/ValueSet/$expand", h.expandValueSet).Methods(http.MethodGet, http.MethodPost)
	api.HandleFunc("/ValueSet/{id}/$expand", h.expandValueSet).Methods(http.MethodGet, http.MethodPost)
}

// expandValueSet is ValueSet/$expand: url (or the ValueSet of the path),
// filter, offset and count as query or form parameters.
func (h *Handler) expandValueSet(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && httpx.MediaType(r) == "application/x-www-form-urlencoded" {
		r.Body = http.MaxBytesReader(w, r.Body, int64(h.cfg.Limits.JSONBodyBytes))
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, fhir.Invalid("Invalid form body"))
			return
		}
	}
	q := r.URL.Query()
	if r.Form != nil {
		q = r.Form
	}
	id := mux.Vars(r)["id"]
	url := q.Get("url")
	if id == "" && url == "" {
		h.fail(w, r, fhir.Invalid("Missing url", "url"))
		return
	}
	offset, count := 0, definitions.DefaultExpandCount
	for name, dst := range map[string]*int{"offset": &offset, "count": &count} {
		if s := q.Get(name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n > fhir.MaxOffset {
				h.fail(w, r, fhir.Invalid("Invalid "+name+": "+s, name))
				return
			}
			*dst = n
		}
	}
	out, err := h.svc.Expand(r.Context(), principal.FromContext(r.Context()), url, id, q.Get("filter"), offset, min(count, definitions.MaxExpandCount))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, out)
}
