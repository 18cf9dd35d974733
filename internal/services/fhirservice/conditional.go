package fhirservice

import (
	"context"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// Conditional interactions, as the reference runs them (its repository's
// conditionalCreate, conditionalUpdate, conditionalDelete and
// conditionalPatch), for every caller of Do (REST, bots' FHIR calls, Bundle
// entries): a search decides which resource a write applies to.
//
//	create  POST <Type>, If-None-Exist: <query>  0: create (201)   1: that resource, unchanged (200)  2+: 412
//	update  PUT <Type>?<query>                   0: create (201)   1: update it (200)                 2+: 412
//	patch   PATCH <Type>?<query>                 0: 404            1: patch it (200)                  2+: 412
//	delete  DELETE <Type>?<query>                0: nothing (200)  1: delete it (200)                 2+: 412
//
// The search is the caller's own (Search): another project's resource, or
// one the caller's access policy hides, is never a match, so a conditional
// interaction tells nothing a search would not. Its query is a search's, with
// the same 400 for an unknown parameter (the reference's "Unknown search
// parameter"). A query without any criterion is 400 too: the reference would
// match every resource of the type, so that a conditional update would
// overwrite whichever one a project happens to have alone.
//
// The search and the write are one store transaction that first takes a lock
// on the type and the project written to (store.Store.Lock): two conditional
// interactions on one type in one project run one after the other, so two
// concurrent conditional creates with the same query cannot both create. On
// PostgreSQL that is a transaction-scoped advisory lock; transactions are
// READ COMMITTED, so the second one's search, a later statement, sees what the
// first committed. On SQLite every write transaction holds the database's
// write lock from BEGIN (immediate transactions), which makes them serial
// anyway. The reference runs them SERIALIZABLE instead; a lock needs no retry
// of a failed serialization and works inside a transaction Bundle, whose
// transaction is already open. A plain create racing a conditional one is not
// held back (docs/decisions.md).

// conditionalMatches is the search of a conditional interaction: at most two
// of the resources of typ that p can read and that match query (a raw query
// string, a leading "?" ignored). what names the interaction in errors.
func (s *Service) conditionalMatches(ctx context.Context, p *principal.Principal, typ, query, what string) ([]store.Record, error) {
	query = strings.TrimPrefix(strings.TrimSpace(query), "?")
	req, err := fhir.ParseSearch(typ, query)
	if err != nil {
		return nil, err
	}
	if len(req.Filters) == 0 && len(req.Expr) == 0 {
		return nil, fhir.Invalid(what + " needs at least one search parameter")
	}
	// Two tell one match from several; sorting and counting would only cost.
	req.Count, req.Offset, req.Sort, req.Total = 2, 0, nil, ""
	res, err := s.Search(ctx, p, req)
	if err != nil {
		return nil, err
	}
	return res.Records, nil
}

// conditionally runs fn in one transaction holding the lock of the
// conditional interactions on typ in project.
func (s *Service) conditionally(ctx context.Context, typ, project string, fn func(tx *Service) error) error {
	return s.InTx(ctx, func(tx *Service) error {
		if err := tx.st.Lock(ctx, "fhir-conditional:"+typ+":"+project); err != nil {
			return err
		}
		return fn(tx)
	})
}

// writeProject is the project a write of res by p goes to: p's own, or the
// one a super admin names in meta.project (as Create decides).
func writeProject(p *principal.Principal, res fhir.Resource) string {
	if p.SuperAdmin {
		if mp := res.MetaProject(); mp != "" {
			return mp
		}
	}
	return p.ProjectID
}

// errMultipleMatches is the reference's 412 for a query matching several.
var errMultipleMatches = &fhir.Error{Code: fhir.EMultipleMatches, Message: "Multiple resources found matching condition"}

// errNoMatch is an If-Match that no resource can satisfy: nothing matched.
var errNoMatch = &fhir.Error{Code: fhir.EPrecondition, Message: "If-Match: no resource matches the condition"}

// CreateIfNoneExist creates res unless query (an If-None-Exist search of
// res's type) matches: one match is answered as it is, unchanged (created is
// false), several are 412. A body id that names another resource than the
// match is 400, as on the reference.
func (s *Service) CreateIfNoneExist(ctx context.Context, p *principal.Principal, res fhir.Resource, query string) (rec *store.Record, created bool, err error) {
	typ := res.Type()
	if err := Authorize(p, typ, OpCreate); err != nil {
		return nil, false, err
	}
	err = s.conditionally(ctx, typ, writeProject(p, res), func(tx *Service) error {
		found, err := tx.conditionalMatches(ctx, p, typ, query, "If-None-Exist")
		if err != nil {
			return err
		}
		switch len(found) {
		case 0:
			rec, err = tx.Create(ctx, p, res)
			created = true
			return err
		case 1:
			if id := res.ID(); id != "" && id != found[0].ID {
				return fhir.Invalid("Resource ID did not match resolved ID", typ+".id")
			}
			rec = &found[0]
			return nil
		}
		return errMultipleMatches
	})
	if err != nil {
		return nil, false, err
	}
	return rec, created, nil
}

// UpdateWhere is a conditional update: res replaces the one resource query
// matches, or is created when none does (created is true); several are 412.
// A body id must be the match's (400 otherwise), and none may be given for a
// create (the server chooses ids). ifMatch, when set, must be the match's
// current version (412 otherwise, and when nothing matches).
func (s *Service) UpdateWhere(ctx context.Context, p *principal.Principal, typ, query string, res fhir.Resource, ifMatch string) (rec *store.Record, created bool, err error) {
	if err := Authorize(p, typ, OpUpdate); err != nil {
		return nil, false, err
	}
	if res.Type() != typ {
		return nil, false, fhir.Invalid("Incorrect resource type", "resourceType")
	}
	err = s.conditionally(ctx, typ, writeProject(p, res), func(tx *Service) error {
		found, err := tx.conditionalMatches(ctx, p, typ, query, "A conditional update")
		if err != nil {
			return err
		}
		switch len(found) {
		case 0:
			if ifMatch != "" {
				return errNoMatch
			}
			if res.ID() != "" {
				return fhir.Invalid("Cannot perform create as update with client-assigned ID", typ+".id")
			}
			rec, err = tx.Create(ctx, p, res)
			created = true
			return err
		case 1:
			id := found[0].ID
			if rid := res.ID(); rid != "" && rid != id {
				return fhir.Invalid("Resource ID did not match resolved ID", typ+".id")
			}
			next := res.Clone()
			next["id"] = id
			rec, err = tx.Update(ctx, p, typ, id, next, ifMatch)
			return err
		}
		return errMultipleMatches
	})
	if err != nil {
		return nil, false, err
	}
	return rec, created, nil
}

// PatchWhere is a conditional patch: the one resource query matches is
// patched; none is 404 and several 412 (the reference's answers).
func (s *Service) PatchWhere(ctx context.Context, p *principal.Principal, typ, query string, patch jsonpatch.Patch, ifMatch string) (*store.Record, error) {
	if err := Authorize(p, typ, OpUpdate); err != nil {
		return nil, err
	}
	var rec *store.Record
	err := s.conditionally(ctx, typ, p.ProjectID, func(tx *Service) error {
		found, err := tx.conditionalMatches(ctx, p, typ, query, "A conditional patch")
		if err != nil {
			return err
		}
		switch len(found) {
		case 0:
			return fhir.ErrNotFound
		case 1:
			rec, err = tx.Patch(ctx, p, typ, found[0].ID, patch, ifMatch)
			return err
		}
		return errMultipleMatches
	})
	return rec, err
}

// DeleteWhere is a conditional delete: the one resource query matches is
// deleted, none is a success that deletes nothing, several are 412 (the
// reference deletes at most one). ifMatch, when set, must be the match's
// current version (412 otherwise, and when nothing matches).
func (s *Service) DeleteWhere(ctx context.Context, p *principal.Principal, typ, query, ifMatch string) error {
	if err := Authorize(p, typ, OpDelete); err != nil {
		return err
	}
	return s.conditionally(ctx, typ, p.ProjectID, func(tx *Service) error {
		found, err := tx.conditionalMatches(ctx, p, typ, query, "A conditional delete")
		if err != nil {
			return err
		}
		switch len(found) {
		case 0:
			if ifMatch != "" {
				return errNoMatch
			}
			return nil
		case 1:
			return tx.Delete(ctx, p, typ, found[0].ID, ifMatch)
		}
		return errMultipleMatches
	})
}
