package rest

import (
	"net/http"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/httpx"
)

// definitionTypes matches the {type} of the resource types answered from
// the FHIR definitions (definitions.Serves) instead of the store.
const definitionTypes = "{type:StructureDefinition|SearchParameter|ValueSet|CodeSystem}"

// definitionRoutes serve the FHIR definitions read-only to every
// authenticated caller (they are the specification, the same for every
// project): read, vread, history, search and ValueSet/$expand. Any write is
// refused with 403 and definitions.ReadOnlyMessage.
func (h *Handler) definitionRoutes(api *mux.Router) {
	api.HandleFunc("/ValueSet/$expand", h.expandValueSet).Methods(http.MethodGet, http.MethodPost)
	api.HandleFunc("/ValueSet/{id}/$expand", h.expandValueSet).Methods(http.MethodGet, http.MethodPost)
	api.HandleFunc("/"+definitionTypes, h.searchDefinitions).Methods(http.MethodGet)
	api.HandleFunc("/"+definitionTypes+"/_search", h.searchDefinitions).Methods(http.MethodPost)
	api.HandleFunc("/"+definitionTypes+"/{id}", h.readDefinition).Methods(http.MethodGet)
	api.HandleFunc("/"+definitionTypes+"/{id}/_history/{vid}", h.readDefinition).Methods(http.MethodGet)
	api.HandleFunc("/"+definitionTypes+"/{id}/_history", h.definitionHistory).Methods(http.MethodGet)
	api.PathPrefix("/" + definitionTypes).HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, fhir.Errorf(fhir.EForbidden, "%s", definitions.ReadOnlyMessage(mux.Vars(r)["type"])))
	})
}

func (h *Handler) definitionSet(w http.ResponseWriter, r *http.Request) (*definitions.Set, bool) {
	set, err := definitions.Load()
	if err != nil {
		h.fail(w, r, err)
		return nil, false
	}
	return set, true
}

func (h *Handler) readDefinition(w http.ResponseWriter, r *http.Request) {
	set, ok := h.definitionSet(w, r)
	if !ok {
		return
	}
	v := mux.Vars(r)
	def, found := set.Read(v["type"], v["id"])
	if !found || v["vid"] != "" && v["vid"] != definitions.VersionID() {
		h.fail(w, r, fhir.ErrNotFound)
		return
	}
	w.Header().Set("ETag", `W/"`+definitions.VersionID()+`"`)
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, def.JSON)
}

// definitionHistory is the one version a definition has.
func (h *Handler) definitionHistory(w http.ResponseWriter, r *http.Request) {
	set, ok := h.definitionSet(w, r)
	if !ok {
		return
	}
	v := mux.Vars(r)
	def, found := set.Read(v["type"], v["id"])
	if !found {
		h.fail(w, r, fhir.ErrNotFound)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, fhir.Bundle{ResourceType: "Bundle", Type: "history",
		Link:  []fhir.BundleLink{{Relation: "self", URL: h.base + def.Type + "/" + def.ID + "/_history"}},
		Entry: []fhir.BundleEntry{{FullURL: h.base + def.Type + "/" + def.ID, Resource: def.JSON, Response: &fhir.EntryResponse{Status: "200", Etag: `W/"` + definitions.VersionID() + `"`}}}})
}

func (h *Handler) searchDefinitions(w http.ResponseWriter, r *http.Request) {
	set, ok := h.definitionSet(w, r)
	if !ok {
		return
	}
	query, err := h.searchQuery(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	typ := mux.Vars(r)["type"]
	req, err := fhir.ParseSearch(typ, query)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	page, err := set.Search(req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b := fhir.Bundle{ResourceType: "Bundle", Type: "searchset"}
	if req.Total == "accurate" || req.Total == "estimate" {
		b.Total = &page.Total
	}
	for _, def := range page.Resources {
		b.Entry = append(b.Entry, fhir.BundleEntry{FullURL: h.base + typ + "/" + def.ID, Search: &fhir.EntrySearch{Mode: "match"}, Resource: def.JSON})
	}
	b.Link = h.searchLinks(req, len(page.Resources), page.More)
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, b)
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
