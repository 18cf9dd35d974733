package fhirservice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/store"
)

// Config configures the service.
type Config struct {
	Store store.Store
	// BaseURL is the server's public base URL, ending in "/": answers link
	// to BaseURL + "fhir/R4/".
	BaseURL string
	// Limits bound the bodies Do accepts (JSON, raw Binary); zero fields
	// take the defaults.
	Limits limits.Limits
}

// Service is the FHIR API for a principal: every read and write of a
// resource on behalf of a caller goes through it. A Service bound to a store
// transaction (InTx) runs everything in that transaction.
type Service struct {
	st   store.Store
	base string
	lim  limits.Limits
}

// New builds the service.
func New(cfg Config) *Service {
	return &Service{st: cfg.Store, base: cfg.BaseURL + "fhir/R4/", lim: cfg.Limits.WithDefaults()}
}

// InTx runs fn with a Service bound to one store transaction: what fn does
// through it is kept together or not at all (a transaction Bundle's
// entries). Nested calls join the transaction.
func (s *Service) InTx(ctx context.Context, fn func(tx *Service) error) error {
	return s.st.InTx(ctx, func(st store.Store) error {
		c := *s
		c.st = st
		return fn(&c)
	})
}

// BaseURL is the FHIR base the service's answers link to ("…/fhir/R4/").
func (s *Service) BaseURL() string { return s.base }

// Authorize decides an interaction on a resource type before anything is
// read: the role rows of Rules and the type-level part of the caller's
// access policy. Every method below starts with it; use-cases that act on a
// type (an operation such as $deploy) ask it first.
func Authorize(p *principal.Principal, typ string, op Op) error {
	if p == nil {
		return fhir.ErrUnauthorized
	}
	if !fhir.KnownType(typ) {
		return fhir.Errorf(fhir.ENotFound, "Unknown resource type: %s", typ)
	}
	if err := authorizeType(p, typ, op); err != nil {
		return err
	}
	_, err := policyFilters(p, typ, op != OpRead)
	return err
}

// authorizeID is Authorize plus a syntactically valid id (else 404: nothing
// can exist under it).
func authorizeID(p *principal.Principal, typ, id string, op Op) error {
	if err := Authorize(p, typ, op); err != nil {
		return err
	}
	if !fhir.ValidID(id) {
		return fhir.ErrNotFound
	}
	return nil
}

// Read is the current version of typ/id as p may see it: 404 outside p's
// project or policy, 410 when deleted.
func (s *Service) Read(ctx context.Context, p *principal.Principal, typ, id string) (*store.Record, error) {
	rec, err := s.Load(ctx, p, typ, id)
	if err != nil {
		return nil, err
	}
	return s.present(ctx, p, rec)
}

// Load is Read's authorization with the stored record as it is, hidden
// fields included: for use-cases that act on a resource the caller may read
// ($execute runs the Bot it loads). Never answer a caller with it.
func (s *Service) Load(ctx context.Context, p *principal.Principal, typ, id string) (*store.Record, error) {
	return s.load(ctx, p, typ, id, false)
}

// LoadCached is Load through store.Store.ReadCached, for a bot's execution
// (whose Bot's writers wait for every replica to have seen their change).
func (s *Service) LoadCached(ctx context.Context, p *principal.Principal, typ, id string) (*store.Record, error) {
	return s.loadFrom(ctx, p, typ, id, false, s.st.ReadCached)
}

// LoadForUpdate is Load for a resource p may also update (its write
// criteria hold): what a use-case reads before it changes it through Modify.
func (s *Service) LoadForUpdate(ctx context.Context, p *principal.Principal, typ, id string) (*store.Record, error) {
	if err := authorizeID(p, typ, id, OpUpdate); err != nil {
		return nil, err
	}
	return s.load(ctx, p, typ, id, true)
}

func (s *Service) load(ctx context.Context, p *principal.Principal, typ, id string, write bool) (*store.Record, error) {
	return s.loadFrom(ctx, p, typ, id, write, s.st.Read)
}

func (s *Service) loadFrom(ctx context.Context, p *principal.Principal, typ, id string, write bool,
	read func(ctx context.Context, scope store.Scope, typ, id string) (*store.Record, error)) (*store.Record, error) {
	if err := authorizeID(p, typ, id, OpRead); err != nil {
		return nil, err
	}
	rec, err := read(ctx, p.Scope(), typ, id)
	if err != nil {
		return nil, err
	}
	if err := s.checkPolicy(ctx, s.st, p, typ, id, write); err != nil {
		return nil, err
	}
	return rec, nil
}

// VRead is one version of typ/id (the current version decides access).
func (s *Service) VRead(ctx context.Context, p *principal.Principal, typ, id, versionID string) (*store.Record, error) {
	if err := authorizeID(p, typ, id, OpRead); err != nil {
		return nil, err
	}
	if !fhir.ValidID(versionID) {
		return nil, fhir.ErrNotFound
	}
	rec, err := s.st.ReadVersion(ctx, p.Scope(), typ, id, versionID)
	if err != nil {
		return nil, err
	}
	if err := s.checkPolicy(ctx, s.st, p, typ, id, false); err != nil {
		return nil, err
	}
	return s.present(ctx, p, rec)
}

// History lists the versions of typ/id, newest first; a deletion is a
// Record with Deleted set and no JSON.
func (s *Service) History(ctx context.Context, p *principal.Principal, typ, id string, count, offset int) ([]store.Record, error) {
	if err := authorizeID(p, typ, id, OpRead); err != nil {
		return nil, err
	}
	recs, err := s.st.History(ctx, p.Scope(), typ, id, count, offset)
	if err != nil {
		return nil, err
	}
	if err := s.checkPolicy(ctx, s.st, p, typ, id, false); err != nil {
		return nil, err
	}
	rules, err := s.readRules(ctx, s.st, p, typ, []string{id})
	if err != nil {
		return nil, err
	}
	for i := range recs {
		if recs[i].JSON, err = presentJSON(&recs[i], rules(id)); err != nil {
			return nil, err
		}
	}
	return recs, nil
}

// Search runs a search for p: within p's project, restricted by p's access
// policy, with what p may not see removed from each resource. A search on
// a field hidden from p is refused (it would tell its values). req.AnyOf is
// set from the policy.
func (s *Service) Search(ctx context.Context, p *principal.Principal, req *fhir.SearchRequest) (*store.SearchResult, error) {
	typ := req.ResourceType
	if err := Authorize(p, typ, OpRead); err != nil {
		return nil, err
	}
	if err := checkSearchHidden(p, req); err != nil {
		return nil, err
	}
	var err error
	if req.AnyOf, err = policyFilters(p, typ, false); err != nil {
		return nil, err
	}
	sreq, none, err := s.resolveHas(ctx, p, req)
	if err != nil {
		return nil, err
	}
	if none {
		res := &store.SearchResult{}
		if req.Total == "accurate" || req.Total == "estimate" {
			zero := 0
			res.Total = &zero
		}
		return res, nil
	}
	res, err := s.st.Search(ctx, p.Scope(), sreq)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(res.Records))
	for i := range res.Records {
		ids[i] = res.Records[i].ID
	}
	rules, err := s.readRules(ctx, s.st, p, typ, ids)
	if err != nil {
		return nil, err
	}
	for i := range res.Records {
		rec := &res.Records[i]
		if rec.JSON, err = presentJSON(rec, rules(rec.ID)); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// MaxHasMatches bounds the resources one _has may find: its matches become
// an _id filter of the search.
const MaxHasMatches = fhir.MaxCount

// resolveHas answers the search to hand the store: req with each _has
// turned into an _id filter of the resources it finds, each reverse chain
// searched as p (so that it finds only what p may read). none says that a
// _has found nothing, so the search finds nothing.
func (s *Service) resolveHas(ctx context.Context, p *principal.Principal, req *fhir.SearchRequest) (*fhir.SearchRequest, bool, error) {
	if len(req.Has) == 0 {
		return req, false, nil
	}
	out := *req
	out.Has = nil
	out.Filters = slices.Clone(req.Filters)
	for _, h := range req.Has {
		inner := *h.Search
		inner.Count, inner.Offset, inner.Total = MaxHasMatches, 0, ""
		res, err := s.Search(ctx, p, &inner)
		if fhir.IsCode(err, fhir.EForbidden) {
			return nil, true, nil
		}
		if err != nil {
			return nil, false, err
		}
		if res.More {
			return nil, false, fhir.Invalid(fmt.Sprintf("_has: more than %d %s resources match %s; narrow it", MaxHasMatches, h.Type, h.Value), "_has")
		}
		var ids []string
		seen := map[string]bool{}
		for i := range res.Records {
			r, err := res.Records[i].Resource()
			if err != nil {
				return nil, false, err
			}
			for _, v := range fhir.ExtractParam(r, h.Param) {
				if v.System == req.ResourceType && fhir.ValidID(v.Value) && !seen[v.Value] {
					seen[v.Value] = true
					ids = append(ids, v.Value)
				}
			}
		}
		if len(ids) == 0 {
			return nil, true, nil
		}
		byID, err := fhir.ParseSearch(req.ResourceType, "_id="+strings.Join(ids, ","))
		if err != nil {
			return nil, false, err
		}
		out.Filters = append(out.Filters, byID.Filters...)
	}
	return &out, false, nil
}

// checkSearchHidden refuses a search parameter that reads a field hidden
// from p (by the table or, conservatively, by any entry of p's policy for
// the type).
func checkSearchHidden(p *principal.Principal, req *fhir.SearchRequest) error {
	rules := rulesFor(p, req.ResourceType).fields
	if !adminTypes[req.ResourceType] {
		for _, e := range p.Access.FieldEntries(req.ResourceType, false) {
			rules = withPolicy(rules, &e)
		}
	}
	hidden := hiddenOf(rules)
	for _, f := range req.Filters {
		for _, h := range hidden {
			if exprTouches(f.Param.Expression, req.ResourceType, h.path) {
				return fhir.Errorf(fhir.EForbidden, "Forbidden: %s searches %s.%s, which is hidden", f.Param.Code, req.ResourceType, h.path)
			}
		}
	}
	return nil
}

// exprTouches reports whether a search parameter's FHIRPath expression reads
// field of typ ("Patient.birthDate" for birthDate, "Patient.name.family" for
// name or name.family).
func exprTouches(expr, typ, field string) bool {
	needle := typ + "." + field
	for i := 0; ; {
		j := strings.Index(expr[i:], needle)
		if j < 0 {
			return false
		}
		end := i + j + len(needle)
		if end == len(expr) || !isIdentChar(expr[end]) {
			return true
		}
		i = end
	}
}

func isIdentChar(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// Create stores a new resource for p in p's project (a super admin may name
// another in meta.project). The server chooses the id; the table's managed
// fields are the server's, and a hidden or read-only field may not be set.
// A Bot gets its own membership in the same transaction
// (createBotMembership).
func (s *Service) Create(ctx context.Context, p *principal.Principal, res fhir.Resource) (*store.Record, error) {
	return s.create(ctx, p, res, "")
}

// create is Create; botPolicy is the AccessPolicy of a Bot's membership
// (CreateBot).
func (s *Service) create(ctx context.Context, p *principal.Principal, res fhir.Resource, botPolicy string) (*store.Record, error) {
	typ := res.Type()
	if err := Authorize(p, typ, OpCreate); err != nil {
		return nil, err
	}
	project := p.ProjectID
	if p.Scope().All {
		// A super admin (or the server) may create into another project by
		// naming it.
		if mp := res.MetaProject(); mp != "" {
			if _, err := s.st.Read(ctx, store.AllProjects, "Project", mp); err != nil {
				return nil, fhir.Invalid("Unknown meta.project: "+mp, "meta.project")
			}
			project = mp
		}
	}
	delete(res, "id")
	if err := enforce(typ, nil, res, rulesFor(p, typ).fields, true); err != nil {
		return nil, err
	}
	// What is stored must be valid FHIR (decision 44), and more in a
	// project in strictMode (decision 51).
	if err := checkValid(p, res); err != nil {
		return nil, err
	}
	if typ == "Subscription" && !p.IsSystem() {
		if err := s.checkSubscription(ctx, p, res); err != nil {
			return nil, err
		}
	}
	if scheduled(typ) {
		if err := s.checkSchedule(ctx, s.st, project, res); err != nil {
			return nil, err
		}
	}
	w := store.Write{Project: project, Author: p.Author(), CheckReferences: !p.SuperAdmin}
	switch typ {
	case "Project":
		// A project belongs to itself: its id is its meta.project.
		w.ID = uuid.NewString()
		w.Project = w.ID
	case "Binary":
		// The reference answers Binary uploads with a url the CLI copies
		// into Bot.sourceCode; the id is needed for it, so it is chosen here.
		w.ID = uuid.NewString()
		res["url"] = "Binary/" + w.ID
	}
	if w.Project == "" {
		// Only the server has no project of its own: what it creates names
		// its project in meta.project.
		return nil, errors.New("fhirservice: a create by the server must name meta.project")
	}
	filters, err := policyFilters(p, typ, true)
	if err != nil {
		return nil, err
	}
	var out *store.Record
	err = s.st.InTx(ctx, func(tx store.Store) error {
		rec, err := tx.Create(ctx, res, w)
		if err != nil {
			return err
		}
		if err := s.checkWritten(ctx, tx, p, typ, rec, filters); err != nil {
			return err
		}
		// The policy entry that the new resource falls under may restrict
		// fields too.
		if rules, err := s.policyWriteRules(ctx, tx, p, typ, rec.ID); err != nil {
			return err
		} else if len(rules) > 0 {
			if err := enforce(typ, nil, res.Clone(), rules, true); err != nil {
				return err
			}
		}
		if typ == "Bot" {
			if err := s.createBotMembership(ctx, tx, p, w.Project, rec, res, botPolicy); err != nil {
				return err
			}
		}
		out = rec
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.present(ctx, p, out)
}

// Update replaces typ/id with res (whose type and id must be typ and id).
// ifMatch, when set, must be the current version id. A field hidden from p
// that res leaves out keeps its stored value, as does a read-only one; one
// that res sets (hidden) or changes (read-only) is refused.
func (s *Service) Update(ctx context.Context, p *principal.Principal, typ, id string, res fhir.Resource, ifMatch string) (*store.Record, error) {
	if res.Type() != typ {
		if err := Authorize(p, typ, OpUpdate); err != nil {
			return nil, err
		}
		return nil, fhir.Invalid("Incorrect resource type", "resourceType")
	}
	if res.ID() != id {
		if err := authorizeID(p, typ, id, OpUpdate); err != nil {
			return nil, err
		}
		return nil, fhir.Invalid("Incorrect resource ID", "id")
	}
	return s.modify(ctx, p, typ, id, ifMatch, true, func(fhir.Resource) (fhir.Resource, error) { return res.Clone(), nil })
}

// Patch applies a JSON Patch to typ/id. The patch sees the resource as p
// does: a hidden field can be neither tested, copied nor moved, and adding
// one is refused like any other write of it.
func (s *Service) Patch(ctx context.Context, p *principal.Principal, typ, id string, patch jsonpatch.Patch, ifMatch string) (*store.Record, error) {
	return s.modify(ctx, p, typ, id, ifMatch, false, func(view fhir.Resource) (fhir.Resource, error) {
		return applyPatch(view, patch)
	})
}

// DecodePatch decodes a JSON Patch body, with the reference's errors.
func DecodePatch(body []byte) (jsonpatch.Patch, error) {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, fhir.Invalid("Empty patch body")
	}
	ops, err := jsonpatch.DecodePatch(body)
	if err != nil {
		return nil, fhir.Invalid("Invalid patch body")
	}
	return ops, nil
}

// Modify is a read-modify-write of typ/id under every rule of Update and
// Patch: fn receives the resource as p sees it and returns the new version
// (as a patch would). For use-cases that change a resource on a caller's
// behalf (a project's secrets, a Bot's deployed code).
func (s *Service) Modify(ctx context.Context, p *principal.Principal, typ, id string, fn func(view fhir.Resource) (fhir.Resource, error)) (*store.Record, error) {
	return s.modify(ctx, p, typ, id, "", false, fn)
}

func (s *Service) modify(ctx context.Context, p *principal.Principal, typ, id, ifMatch string, replace bool, fn func(fhir.Resource) (fhir.Resource, error)) (*store.Record, error) {
	if err := authorizeID(p, typ, id, OpUpdate); err != nil {
		return nil, err
	}
	filters, err := policyFilters(p, typ, true)
	if err != nil {
		return nil, err
	}
	var out *store.Record
	err = s.st.InTx(ctx, func(tx store.Store) error {
		if filters != nil {
			// The current resource must be one p may write.
			ok, err := matchesPolicy(ctx, tx, p, typ, id, filters)
			if err != nil {
				return err
			}
			if !ok {
				return fhir.ErrNotFound
			}
		}
		rules, err := s.policyWriteRules(ctx, tx, p, typ, id)
		if err != nil {
			return err
		}
		rules = append(rules, rulesFor(p, typ).fields...)
		w := store.Write{Author: p.Author(), IfMatch: ifMatch, CheckReferences: !p.SuperAdmin}
		rec, err := tx.Update(ctx, p.Scope(), typ, id, w, func(cur fhir.Resource) (fhir.Resource, error) {
			view := cur.Clone()
			hide(view, rules)
			next, err := fn(view)
			if err != nil {
				return nil, err
			}
			if next.Type() != typ {
				return nil, fhir.Invalid("Incorrect resource type", "resourceType")
			}
			if next.ID() != id {
				return nil, fhir.Invalid("Incorrect resource ID", "id")
			}
			if err := enforce(typ, cur, next, rules, replace); err != nil {
				return nil, err
			}
			// What is stored must be valid FHIR, whatever the write (an
			// update, a patch, a use-case's change); what was stored before
			// validation existed is read as it is (decision 44).
			if err := checkValid(p, next); err != nil {
				return nil, err
			}
			if typ == "Subscription" && !p.IsSystem() {
				if err := s.checkSubscription(ctx, p, next); err != nil {
					return nil, err
				}
			}
			if scheduled(typ) {
				if err := s.checkSchedule(ctx, tx, cur.MetaProject(), next); err != nil {
					return nil, err
				}
			}
			return next, nil
		})
		if err != nil {
			return err
		}
		if err := s.checkWritten(ctx, tx, p, typ, rec, filters); err != nil {
			return err
		}
		out = rec
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.present(ctx, p, out)
}

// applyPatch applies a JSON Patch; the result must keep its type and id.
func applyPatch(cur fhir.Resource, ops jsonpatch.Patch) (fhir.Resource, error) {
	doc, err := cur.Marshal()
	if err != nil {
		return nil, err
	}
	out, err := ops.ApplyWithOptions(doc, &jsonpatch.ApplyOptions{SupportNegativeIndices: true, EnsurePathExistsOnAdd: true})
	if err != nil {
		return nil, fhir.Invalid("Invalid patch: " + err.Error())
	}
	return fhir.ParseResource(out)
}

// Delete deletes typ/id (deleting a deleted resource succeeds). What a
// credential belongs to takes the credential with it, in the same
// transaction: a ClientApplication's, a Bot's or a User's memberships are
// deleted, so that no token or secret of it works any more (the store's
// change feed tells every cache).
func (s *Service) Delete(ctx context.Context, p *principal.Principal, typ, id, ifMatch string) error {
	if err := authorizeID(p, typ, id, OpDelete); err != nil {
		return err
	}
	filters, err := policyFilters(p, typ, true)
	if err != nil {
		return err
	}
	return s.st.InTx(ctx, func(tx store.Store) error {
		if filters != nil {
			ok, err := matchesPolicy(ctx, tx, p, typ, id, filters)
			if err != nil {
				return err
			}
			if !ok {
				return fhir.ErrNotFound
			}
		}
		if err := tx.Delete(ctx, p.Scope(), typ, id, store.Write{Author: p.Author(), IfMatch: ifMatch}); err != nil {
			return err
		}
		return deleteCredentials(ctx, tx, p, typ, id)
	})
}

// credentialTypes are the resource types whose deletion deletes the
// memberships they log in with.
var credentialTypes = map[string]bool{"ClientApplication": true, "Bot": true, "User": true}

func deleteCredentials(ctx context.Context, tx store.Store, p *principal.Principal, typ, id string) error {
	if !credentialTypes[typ] {
		return nil
	}
	for {
		found, err := store.SearchResources(ctx, tx, store.AllProjects, "ProjectMembership", "user="+typ+"/"+id+"&_count=100")
		if err != nil {
			return err
		}
		for _, m := range found {
			if err := tx.Delete(ctx, store.AllProjects, "ProjectMembership", m.ID(), store.Write{Author: p.Author()}); err != nil {
				return err
			}
		}
		if len(found) < 100 {
			return nil
		}
	}
}

// present is rec as p may see it.
func (s *Service) present(ctx context.Context, p *principal.Principal, rec *store.Record) (*store.Record, error) {
	rules, err := s.readRules(ctx, s.st, p, rec.ResourceType, []string{rec.ID})
	if err != nil {
		return nil, err
	}
	out := *rec
	if out.JSON, err = presentJSON(rec, rules(rec.ID)); err != nil {
		return nil, err
	}
	return &out, nil
}

// parseBody parses a resource a caller sent to typ's endpoint.
func parseBody(body []byte, typ string) (fhir.Resource, error) {
	res, err := fhir.ParseResource(body)
	if err != nil {
		return nil, err
	}
	if typ != "" && res.Type() != typ {
		return nil, fhir.Invalid("Incorrect resource type: expected "+typ+", but found "+res.Type(), "resourceType")
	}
	return res, nil
}

// WithStore is the service on st, a transaction of the service's store that
// a use-case opened itself (it writes resources of its own beside the
// caller's).
func (s *Service) WithStore(st store.Store) *Service {
	c := *s
	c.st = st
	return &c
}
