package fhirservice

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// Bounds of _include and _revinclude: the resources one page may include,
// and how many rounds :iterate may go (each round follows the includes from
// the resources the previous one added). A page that reaches the first ends
// with an OperationOutcome entry that says so.
const (
	MaxIncludedPerPage = 1000
	maxIncludeRounds   = 4
	includeChunk       = 100
)

// included is a resource added to a page by an include.
type included struct {
	typ string
	rec store.Record
}

// includes finds the resources that a page's _include and _revinclude
// name: each read through Search as p (its access policy, its project, its
// hidden fields), so that an include shows nothing that p could not find by
// searching. truncated says that MaxIncludedPerPage stopped it.
func (s *Service) includes(ctx context.Context, p *principal.Principal, req *fhir.SearchRequest, page []store.Record) ([]included, bool, error) {
	if len(req.Includes) == 0 || len(page) == 0 {
		return nil, false, nil
	}
	seen := map[string]bool{}
	type node struct {
		typ string
		res fhir.Resource
	}
	var frontier []node
	for i := range page {
		seen[req.ResourceType+"/"+page[i].ID] = true
		res, err := page[i].Resource()
		if err != nil {
			return nil, false, err
		}
		frontier = append(frontier, node{req.ResourceType, res})
	}
	var out []included
	add := func(typ string, recs []store.Record) ([]node, bool, error) {
		var added []node
		for i := range recs {
			key := typ + "/" + recs[i].ID
			if seen[key] {
				continue
			}
			if len(out) >= MaxIncludedPerPage {
				return added, true, nil
			}
			seen[key] = true
			out = append(out, included{typ, recs[i]})
			res, err := recs[i].Resource()
			if err != nil {
				return nil, false, err
			}
			added = append(added, node{typ, res})
		}
		return added, false, nil
	}
	for round := 0; round < maxIncludeRounds && len(frontier) > 0; round++ {
		var next []node
		for _, inc := range req.Includes {
			if round > 0 && !inc.Iterate {
				continue
			}
			// The references to follow (_include) or to look for
			// (_revinclude), by type.
			byType := map[string][]string{}
			var order []string
			for _, n := range frontier {
				if !inc.Rev {
					if n.typ != inc.Source {
						continue
					}
					for _, v := range fhir.ExtractParam(n.res, inc.Param) {
						typ, id := v.System, v.Value
						if typ == "" || !fhir.ValidID(id) || inc.Target != "" && typ != inc.Target || seen[typ+"/"+id] {
							continue
						}
						if _, ok := byType[typ]; !ok {
							order = append(order, typ)
						}
						byType[typ] = append(byType[typ], id)
					}
				} else {
					if inc.Target != "" && n.typ != inc.Target || !paramTargets(inc.Param, n.typ) {
						continue
					}
					if _, ok := byType[inc.Source]; !ok {
						order = append(order, inc.Source)
					}
					byType[inc.Source] = append(byType[inc.Source], n.typ+"/"+n.res.ID())
				}
			}
			for _, typ := range order {
				values := dedupe(byType[typ])
				for len(values) > 0 {
					chunk := values[:min(includeChunk, len(values))]
					values = values[len(chunk):]
					query := "_id=" + strings.Join(chunk, ",")
					if inc.Rev {
						query = inc.Param.Code + "=" + strings.Join(chunk, ",")
					}
					sreq, err := fhir.ParseSearch(typ, query+"&_count="+strconv.Itoa(fhir.MaxCount))
					if err != nil {
						return nil, false, err
					}
					res, err := s.Search(ctx, p, sreq)
					if fhir.IsCode(err, fhir.EForbidden) {
						// A type p may not read includes nothing, as a
						// search of it would find nothing.
						break
					}
					if err != nil {
						return nil, false, err
					}
					added, truncated, err := add(typ, res.Records)
					if err != nil || truncated {
						return out, truncated, err
					}
					next = append(next, added...)
				}
			}
		}
		frontier = next
	}
	return out, false, nil
}

// paramTargets reports whether a reference parameter may point to typ.
func paramTargets(p *fhir.SearchParam, typ string) bool {
	if len(p.Target) == 0 {
		return true
	}
	for _, t := range p.Target {
		if t == typ || t == "Resource" {
			return true
		}
	}
	return false
}

func dedupe(values []string) []string {
	seen := make(map[string]bool, len(values))
	out := values[:0]
	for _, v := range values {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// includeEntries are the page's included resources as searchset entries
// (mode include), and an OperationOutcome entry when the bound stopped them.
func (s *Service) includeEntries(inc []included, truncated bool) []fhir.BundleEntry {
	var out []fhir.BundleEntry
	for _, i := range inc {
		out = append(out, fhir.BundleEntry{FullURL: s.base + i.typ + "/" + i.rec.ID, Search: &fhir.EntrySearch{Mode: "include"},
			Resource: json.RawMessage(i.rec.JSON)})
	}
	if truncated {
		oo, _ := json.Marshal(fhir.OperationOutcome{ResourceType: "OperationOutcome", Issue: []fhir.Issue{{Severity: "warning",
			Code: "too-costly", Details: &fhir.IssueDetails{Text: "Only the first " + strconv.Itoa(MaxIncludedPerPage) +
				" included resources of this page are given: ask for smaller pages (_count)"}}}})
		out = append(out, fhir.BundleEntry{Search: &fhir.EntrySearch{Mode: "outcome"}, Resource: oo})
	}
	return out
}
