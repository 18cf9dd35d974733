package fhirservice

import (
	"context"
	"encoding/json"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/principal"
)

// projectTerminology are the definition types a project may also keep its
// own of (project admins write them; Rules): the base definitions stay
// read-only beside them, and a read, a search or an $expand finds both.
var projectTerminology = map[string]bool{"ValueSet": true, "CodeSystem": true}

// Stored reports whether resources of typ may be written to the store: every
// type but the definitions', and of those the project terminology.
func Stored(typ string) bool { return !definitions.Serves(typ) || projectTerminology[typ] }

// doTerminology answers an interaction on a projectTerminology type: a base
// definition by its id is read from the definitions (and cannot be
// written); a search answers the project's own resources, then the
// definitions; anything else is the project's, handled as any stored
// resource (handled false).
func (s *Service) doTerminology(ctx context.Context, p *principal.Principal, typ string, segs []string, method, rawQuery string, req *Request) (*Response, bool, error) {
	set, err := definitions.Load()
	if err != nil {
		return nil, true, err
	}
	if len(segs) >= 2 && segs[1] != "_search" {
		if _, found := set.Read(typ, segs[1]); found {
			resp, err := s.doDefinition(typ, segs, method, rawQuery, req)
			return resp, true, err
		}
		return nil, false, nil
	}
	if len(segs) == 1 && method == "GET" || len(segs) == 2 && segs[1] == "_search" && method == "POST" {
		if len(segs) == 2 {
			rawQuery = searchQuery(rawQuery, req)
		}
		resp, err := s.searchTerminology(ctx, p, set, typ, rawQuery)
		return resp, true, err
	}
	return nil, false, nil
}

// searchTerminology is a search of the project's own resources of typ
// followed by the definitions': one page over both, the project's first.
func (s *Service) searchTerminology(ctx context.Context, p *principal.Principal, set *definitions.Set, typ, rawQuery string) (*Response, error) {
	req, err := fhir.ParseSearch(typ, rawQuery)
	if err != nil {
		return nil, err
	}
	if len(req.Includes) > 0 || len(req.Has) > 0 {
		return nil, fhir.Invalid("_include, _revinclude and _has are not supported on "+typ, "_include")
	}
	// The project's: the page from the offset, and how many there are.
	own := *req
	own.Total = "accurate"
	res, err := s.Search(ctx, p, &own)
	if err != nil {
		return nil, err
	}
	ownTotal := 0
	if res.Total != nil {
		ownTotal = *res.Total
	}
	b := fhir.Bundle{ResourceType: "Bundle", Type: "searchset"}
	for i := range res.Records {
		rec := &res.Records[i]
		b.Entry = append(b.Entry, fhir.BundleEntry{FullURL: s.base + typ + "/" + rec.ID, Search: &fhir.EntrySearch{Mode: "match"}, Resource: json.RawMessage(rec.JSON)})
	}
	// The definitions', after them.
	base, err := fhir.ParseSearch(typ, rawQuery)
	if err != nil {
		return nil, err
	}
	base.Offset = max(0, req.Offset-ownTotal)
	base.Count = max(0, req.Count-len(res.Records))
	page, err := set.Search(base)
	if err != nil {
		return nil, err
	}
	if base.Count > 0 {
		for _, def := range page.Resources {
			b.Entry = append(b.Entry, fhir.BundleEntry{FullURL: s.base + typ + "/" + def.ID, Search: &fhir.EntrySearch{Mode: "match"}, Resource: json.RawMessage(def.JSON)})
		}
	}
	if req.Total == "accurate" || req.Total == "estimate" {
		total := ownTotal + page.Total
		b.Total = &total
	}
	more := res.More
	switch {
	case base.Count > 0:
		more = page.More
	case !res.More:
		more = page.Total > base.Offset
	}
	b.Link = SearchLinks(s.base, req, len(b.Entry), more)
	return jsonResponse(200, b)
}

// Expand answers ValueSet/$expand for p: the base definitions' ValueSet
// with that url (or id), else the project's own, as p may read it, whose
// compose may name the project's CodeSystems and ValueSets as well as the
// definitions'. An unknown url is a 400 (the reference's answer), an
// unknown id a 404.
func (s *Service) Expand(ctx context.Context, p *principal.Principal, url, id, filter string, offset, count int) (fhir.Resource, error) {
	if err := Authorize(p, "ValueSet", OpRead); err != nil {
		return nil, err
	}
	set, err := definitions.Load()
	if err != nil {
		return nil, err
	}
	var vs fhir.Resource
	switch {
	case id != "":
		if _, found := set.Read("ValueSet", id); found {
			return set.Expand("", id, filter, offset, count)
		}
		rec, err := s.Read(ctx, p, "ValueSet", id)
		if err != nil {
			return nil, err
		}
		if vs, err = rec.Resource(); err != nil {
			return nil, err
		}
	default:
		if _, found := set.ByURL("ValueSet", url); found {
			return set.Expand(url, "", filter, offset, count)
		}
		if vs, err = s.searchOne(ctx, p, "ValueSet", "url="+url); err != nil {
			return nil, err
		}
		if vs == nil {
			return nil, fhir.Invalid("ValueSet not found: "+url, "url")
		}
	}
	local := func(typ, url string) fhir.Resource {
		found, _ := s.searchOne(ctx, p, typ, "url="+url)
		return found
	}
	return set.ExpandWith(vs, filter, offset, count, local), nil
}

func (s *Service) searchOne(ctx context.Context, p *principal.Principal, typ, query string) (fhir.Resource, error) {
	req, err := fhir.ParseSearch(typ, query+"&_count=1")
	if err != nil {
		return nil, err
	}
	res, err := s.Search(ctx, p, req)
	if err != nil || len(res.Records) == 0 {
		return nil, err
	}
	return res.Records[0].Resource()
}

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
