package fhirservice

import (
	"context"
	"net/url"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/access"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// policyFilters are the caller's access-policy restriction of a type, as
// groups of filters of which a resource must match one (see
// fhir.SearchRequest.AnyOf): nil when nothing restricts it;
// fhir.ErrForbidden when the policy does not grant it. Admin and server
// types are decided by the role rows alone.
func policyFilters(p *principal.Principal, typ string, write bool) ([][]fhir.Filter, error) {
	if p == nil || p.Access == nil || p.SuperAdmin || adminTypes[typ] {
		return nil, nil
	}
	filters, ok := p.Access.Filters(typ, write)
	if !ok {
		return nil, fhir.ErrForbidden
	}
	return filters, nil
}

// matchesPolicy reports whether typ/id satisfies the filters, by searching
// for it with them (so that the criteria are evaluated exactly as searches
// evaluate them).
func matchesPolicy(ctx context.Context, st store.Store, p *principal.Principal, typ, id string, groups [][]fhir.Filter) (bool, error) {
	req, err := fhir.ParseSearch(typ, "_id="+url.QueryEscape(id)+"&_count=1")
	if err != nil {
		return false, err
	}
	req.AnyOf = groups
	res, err := st.Search(ctx, p.Scope(), req)
	if err != nil {
		return false, err
	}
	return len(res.Records) > 0, nil
}

// checkPolicy answers 404 for a resource the caller's policy does not let
// it read (or, with write, write): its existence is not revealed.
func (s *Service) checkPolicy(ctx context.Context, st store.Store, p *principal.Principal, typ, id string, write bool) error {
	filters, err := policyFilters(p, typ, write)
	if err != nil || filters == nil {
		return err
	}
	ok, err := matchesPolicy(ctx, st, p, typ, id, filters)
	if err != nil {
		return err
	}
	if !ok {
		return fhir.ErrNotFound
	}
	return nil
}

// checkWritten refuses a write whose result falls outside the caller's
// writable criteria (the transaction is then rolled back).
func (s *Service) checkWritten(ctx context.Context, tx store.Store, p *principal.Principal, typ string, rec *store.Record, filters [][]fhir.Filter) error {
	if filters == nil || rec == nil || rec.Deleted {
		return nil
	}
	ok, err := matchesPolicy(ctx, tx, p, typ, rec.ID, filters)
	if err != nil {
		return err
	}
	if !ok {
		return fhir.Errorf(fhir.EForbidden, "Forbidden: the resource would fall outside the caller's access policy")
	}
	return nil
}

// fieldEntries are the caller's policy entries for typ that restrict
// fields, in policy order; nil when none does.
func fieldEntries(p *principal.Principal, typ string, write bool) []access.FieldEntry {
	if p == nil || p.SuperAdmin || adminTypes[typ] {
		return nil
	}
	return p.Access.FieldEntries(typ, write)
}

// entriesFor finds, for each id, the first of entries whose filters the
// stored resource matches (nil: none, or an entry without fields). One
// search per entry with filters answers all the ids at once.
func entriesFor(ctx context.Context, st store.Store, p *principal.Principal, typ string, ids []string, entries []access.FieldEntry) (map[string]*access.FieldEntry, error) {
	out := make(map[string]*access.FieldEntry, len(ids))
	left := append([]string(nil), ids...)
	for i := range entries {
		if len(left) == 0 {
			break
		}
		e := &entries[i]
		if e.Filters == nil {
			for _, id := range left {
				out[id] = e
			}
			break
		}
		// Ids are valid FHIR ids ([A-Za-z0-9.-]): nothing to escape.
		req, err := fhir.ParseSearch(typ, "_id="+strings.Join(left, ",")+"&_count=1000")
		if err != nil {
			return nil, err
		}
		req.AnyOf = [][]fhir.Filter{e.Filters}
		res, err := st.Search(ctx, p.Scope(), req)
		if err != nil {
			return nil, err
		}
		matched := map[string]bool{}
		for _, r := range res.Records {
			matched[r.ID] = true
			out[r.ID] = e
		}
		rest := left[:0]
		for _, id := range left {
			if !matched[id] {
				rest = append(rest, id)
			}
		}
		left = rest
	}
	return out, nil
}

// readRules gives, for each of ids, the hidden fields of what p reads of
// it: the table's, and those of the first policy entry the resource falls
// under. Without policy fields (the usual case) it is the table's for all,
// found without a query or an allocation.
func (s *Service) readRules(ctx context.Context, st store.Store, p *principal.Principal, typ string, ids []string) (func(id string) []fieldRule, error) {
	table := rulesFor(p, typ).hidden
	entries := fieldEntries(p, typ, false)
	if entries == nil {
		return func(string) []fieldRule { return table }, nil
	}
	matched, err := entriesFor(ctx, st, p, typ, ids, entries)
	if err != nil {
		return nil, err
	}
	return func(id string) []fieldRule { return hiddenOf(withPolicy(table, matched[id])) }, nil
}

// policyWriteRules are the field rules of the first writable policy entry
// that the stored typ/id falls under (nil when none restricts fields).
func (s *Service) policyWriteRules(ctx context.Context, tx store.Store, p *principal.Principal, typ, id string) ([]fieldRule, error) {
	entries := fieldEntries(p, typ, true)
	if entries == nil {
		return nil, nil
	}
	matched, err := entriesFor(ctx, tx, p, typ, []string{id}, entries)
	if err != nil {
		return nil, err
	}
	return withPolicy(nil, matched[id]), nil
}
