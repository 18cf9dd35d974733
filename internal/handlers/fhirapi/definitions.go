package fhirapi

import (
	"net/http"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
)

// definitionRoutes add ValueSet/$expand; the other interactions on the
// types answered from the FHIR definitions (read-only, the same for every
// project) are the FHIR service's, like any resource's.
func (h *Handler) definitionRoutes(api *mux.Router) {
	api.HandleFunc("/ValueSet/$expand", h.expandValueSet).Methods(http.MethodGet, http.MethodPost)
	api.HandleFunc("/ValueSet/{id}/$expand", h.expandValueSet).Methods(http.MethodGet, http.MethodPost)
}

func (h *Handler) definitionSet(w http.ResponseWriter, r *http.Request) (*definitions.Set, bool) {
	set, err := definitions.Load()
	if err != nil {
		h.fail(w, r, err)
		return nil, false
	}
	return set, true
}

// expandValueSet is ValueSet/$expand: url (or the ValueSet of the path),
// filter, offset and count as query or form parameters.
func (h *Handler) expandValueSet(w http.ResponseWriter, r *http.Request) {
	set, ok := h.definitionSet(w, r)
	if !ok {
		return
	}
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
	out, err := set.Expand(url, id, q.Get("filter"), offset, min(count, definitions.MaxExpandCount))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, out)
}
