package fhirservice

import (
	"encoding/json"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
)

// doDefinition answers the interactions on the types served from the FHIR
// definitions (definitions.Serves) instead of the store: read, vread,
// history and search, the same for every authenticated caller (they are the
// specification); anything else, writes included, is 403 with
// definitions.ReadOnlyMessage.
func (s *Service) doDefinition(typ string, segs []string, method, rawQuery string, req *Request) (*Response, error) {
	set, err := definitions.Load()
	if err != nil {
		return nil, err
	}
	switch {
	case len(segs) == 1 && method == "GET", len(segs) == 2 && segs[1] == "_search" && method == "POST":
		return s.searchDefinitions(set, typ, searchQuery(rawQuery, req))
	case len(segs) == 2 && method == "GET", len(segs) == 4 && segs[2] == "_history" && method == "GET":
		def, found := set.Read(typ, segs[1])
		if !found || len(segs) == 4 && segs[3] != definitions.VersionID() {
			return nil, fhir.ErrNotFound
		}
		return &Response{Status: 200, Body: def.JSON, ContentType: FHIRJSON, ETag: `W/"` + definitions.VersionID() + `"`}, nil
	case len(segs) == 3 && segs[2] == "_history" && method == "GET":
		def, found := set.Read(typ, segs[1])
		if !found {
			return nil, fhir.ErrNotFound
		}
		return jsonResponse(200, fhir.Bundle{ResourceType: "Bundle", Type: "history",
			Link: []fhir.BundleLink{{Relation: "self", URL: s.base + def.Type + "/" + def.ID + "/_history"}},
			Entry: []fhir.BundleEntry{{FullURL: s.base + def.Type + "/" + def.ID, Resource: json.RawMessage(def.JSON),
				Response: &fhir.EntryResponse{Status: "200", Etag: `W/"` + definitions.VersionID() + `"`}}}})
	}
	return nil, fhir.Errorf(fhir.EForbidden, "%s", definitions.ReadOnlyMessage(typ))
}

func (s *Service) searchDefinitions(set *definitions.Set, typ, rawQuery string) (*Response, error) {
	req, err := fhir.ParseSearch(typ, rawQuery)
	if err != nil {
		return nil, err
	}
	page, err := set.Search(req)
	if err != nil {
		return nil, err
	}
	b := fhir.Bundle{ResourceType: "Bundle", Type: "searchset"}
	if req.Total == "accurate" || req.Total == "estimate" {
		b.Total = &page.Total
	}
	for _, def := range page.Resources {
		b.Entry = append(b.Entry, fhir.BundleEntry{FullURL: s.base + typ + "/" + def.ID, Search: &fhir.EntrySearch{Mode: "match"}, Resource: json.RawMessage(def.JSON)})
	}
	b.Link = SearchLinks(s.base, req, len(page.Resources), page.More)
	return jsonResponse(200, b)
}
