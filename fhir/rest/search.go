package rest

import (
	"net/http"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
)

func newID() string { return uuid.NewString() }

func (h *Handler) search(w http.ResponseWriter, r *http.Request) {
	h.runSearch(w, r, r.URL.RawQuery)
}

// searchPost is POST /{type}/_search with a form body.
func (h *Handler) searchPost(w http.ResponseWriter, r *http.Request) {
	query, err := h.searchQuery(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.runSearch(w, r, query)
}

// searchQuery is the query of a search: the URL's, and a POST's form body.
func (h *Handler) searchQuery(r *http.Request) (string, error) {
	query := r.URL.RawQuery
	if r.Method == http.MethodPost && httpx.MediaType(r) == "application/x-www-form-urlencoded" {
		body, err := httpx.ReadBody(r, h.cfg.Limits.JSONBodyBytes)
		if err != nil {
			return "", err
		}
		if query != "" && len(body) > 0 {
			query += "&"
		}
		query += string(body)
	}
	return query, nil
}

func (h *Handler) runSearch(w http.ResponseWriter, r *http.Request, rawQuery string) {
	p, typ, ok := h.begin(w, r, actionSearch)
	if !ok {
		return
	}
	req, err := fhir.ParseSearch(typ, rawQuery)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The access policy's criteria restrict the search.
	req.AnyOf, err = policyFilters(p, typ, false)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := h.store.Search(r.Context(), p.Scope(), req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b := fhir.Bundle{ResourceType: "Bundle", Type: "searchset", Total: res.Total}
	for i := range res.Records {
		rec := &res.Records[i]
		b.Entry = append(b.Entry, fhir.BundleEntry{
			FullURL:  h.base + typ + "/" + rec.ID,
			Search:   &fhir.EntrySearch{Mode: "match"},
			Resource: present(rec, p),
		})
	}
	b.Link = h.searchLinks(req, len(res.Records), res.More)
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, b)
}

// searchLinks builds self/first/next/previous as the reference does: first
// only when there are results, next when another page exists, previous after
// the first page.
func (h *Handler) searchLinks(req *fhir.SearchRequest, n int, more bool) []fhir.BundleLink {
	link := func(offset int) string { return h.base + req.ResourceType + "?" + req.Query(offset) }
	out := []fhir.BundleLink{{Relation: "self", URL: link(req.Offset)}}
	if req.Count > 0 && (n > 0 || req.Offset > 0) {
		out = append(out, fhir.BundleLink{Relation: "first", URL: link(0)})
		if more {
			out = append(out, fhir.BundleLink{Relation: "next", URL: link(req.Offset + req.Count)})
		}
		if req.Offset > 0 {
			out = append(out, fhir.BundleLink{Relation: "previous", URL: link(max(0, req.Offset-req.Count))})
		}
	}
	return out
}
