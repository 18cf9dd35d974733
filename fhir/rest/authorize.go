package rest

import (
	"context"
	"net/url"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/auth"
	"github.com/sandbot/sandbot/store"
)

type action int

const (
	actionRead action = iota
	actionSearch
	actionCreate
	actionUpdate
	actionDelete
)

func (a action) writes() bool { return a >= actionCreate }

// serverTypes are kept by the server for itself: only super admins reach them
// through the FHIR API.
var serverTypes = map[string]bool{"Login": true, "JsonWebKey": true, "DomainConfiguration": true}

// adminTypes are the reference's project-administration types: invisible to
// plain members, readable by project admins.
var adminTypes = map[string]bool{
	"AccessPolicy": true, "Project": true, "ProjectMembership": true, "User": true, "UserSecurityRequest": true,
}

// authorize decides by resource type and action, before any query runs. The
// project wall itself is the store scope; access policies refine this later.
func authorize(p *auth.Principal, typ string, a action) error {
	if p.SuperAdmin {
		return nil
	}
	if serverTypes[typ] {
		return fhir.ErrForbidden
	}
	if !adminTypes[typ] {
		return authorizePolicy(p, typ, a)
	}
	if !p.Admin {
		return fhir.ErrForbidden
	}
	switch typ {
	case "ProjectMembership":
		if a.writes() {
			return fhir.Errorf(fhir.EForbidden, "Project admins change memberships through /admin/projects/{projectId}/members/{membershipId} and invite through /admin/projects/{projectId}/invite")
		}
	case "User":
		if a.writes() {
			return fhir.Errorf(fhir.EForbidden, "A User can only be changed by the user themself")
		}
	case "Project":
		if a == actionCreate || a == actionDelete {
			return fhir.ErrForbidden
		}
	}
	return nil
}

// policyFilters are the caller's access-policy restriction of a type, as
// groups of filters of which a resource must match one (see
// fhir.SearchRequest.AnyOf): nil when nothing restricts it;
// fhir.ErrForbidden when the policy does not grant it. Admin and server
// types are decided by authorize alone.
func policyFilters(p *auth.Principal, typ string, write bool) ([][]fhir.Filter, error) {
	if p == nil || p.Access == nil || p.SuperAdmin || adminTypes[typ] || serverTypes[typ] {
		return nil, nil
	}
	filters, ok := p.Access.Filters(typ, write)
	if !ok {
		return nil, fhir.ErrForbidden
	}
	return filters, nil
}

// authorizePolicy is the type-level part of the access policy.
func authorizePolicy(p *auth.Principal, typ string, a action) error {
	_, err := policyFilters(p, typ, a.writes())
	return err
}

// matchesPolicy reports whether typ/id satisfies the filters, by searching
// for it with them (so that the criteria are evaluated exactly as searches
// evaluate them).
func matchesPolicy(ctx context.Context, st store.Store, p *auth.Principal, typ, id string, groups [][]fhir.Filter) (bool, error) {
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
func (h *Handler) checkPolicy(ctx context.Context, p *auth.Principal, typ, id string, write bool) error {
	filters, err := policyFilters(p, typ, write)
	if err != nil || filters == nil {
		return err
	}
	ok, err := matchesPolicy(ctx, h.store, p, typ, id, filters)
	if err != nil {
		return err
	}
	if !ok {
		return fhir.ErrNotFound
	}
	return nil
}

// guardWrite runs a write under the caller's policy: the current resource
// (when id is set) must match the writable criteria, and so must the result;
// otherwise the write is rolled back. Without criteria the write runs as is.
func (h *Handler) guardWrite(ctx context.Context, p *auth.Principal, typ, id string, fn func(st store.Store) (*store.Record, error)) (*store.Record, error) {
	filters, err := policyFilters(p, typ, true)
	if err != nil {
		return nil, err
	}
	if filters == nil {
		return fn(h.store)
	}
	var out *store.Record
	err = h.store.InTx(ctx, func(tx store.Store) error {
		if id != "" {
			ok, err := matchesPolicy(ctx, tx, p, typ, id, filters)
			if err != nil {
				return err
			}
			if !ok {
				return fhir.ErrNotFound
			}
		}
		rec, err := fn(tx)
		if err != nil {
			return err
		}
		if rec != nil && !rec.Deleted {
			ok, err := matchesPolicy(ctx, tx, p, typ, rec.ID, filters)
			if err != nil {
				return err
			}
			if !ok {
				return fhir.Errorf(fhir.EForbidden, "Forbidden: the resource would fall outside the caller's access policy")
			}
		}
		out = rec
		return nil
	})
	return out, err
}
