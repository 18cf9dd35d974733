package admin

import (
	"context"
	"encoding/json"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// Member reads a membership of the project.
func (s *Service) Member(ctx context.Context, c Caller, pid, mid string) (*store.Record, error) {
	if _, _, err := s.projectFor(ctx, c, pid); err != nil {
		return nil, err
	}
	return s.Store.Read(ctx, store.ProjectScope(pid), "ProjectMembership", mid)
}

// UpdateMember replaces a membership (POST …/members/:mid). The body must be
// that membership (403 otherwise); its project and user are fixed (the FHIR
// service's rules: a change is 400, and left out they are kept).
func (s *Service) UpdateMember(ctx context.Context, c Caller, pid, mid string, body fhir.Resource) (*store.Record, error) {
	if _, _, err := s.projectFor(ctx, c, pid); err != nil {
		return nil, err
	}
	if body.Type() != "ProjectMembership" || body.ID() != mid {
		return nil, fhir.ErrForbidden
	}
	return s.updateMember(ctx, c, pid, mid, func(svc *fhirservice.Service, server *principal.Principal) (*store.Record, error) {
		return svc.Update(ctx, server, "ProjectMembership", mid, body, "")
	})
}

// patchable are the membership fields a JSON Patch of this endpoint may
// touch (docs/decisions.md 3): what it is for, not what the FHIR service
// lets be written (a full update may also change the profile).
var patchable = map[string]bool{"admin": true, "accessPolicy": true, "access": true, "active": true, "externalId": true, "userName": true}

// PatchMember applies a JSON Patch limited to replace/add/remove on the
// patchable fields; replace of a missing field acts as add.
func (s *Service) PatchMember(ctx context.Context, c Caller, pid, mid string, body []byte) (*store.Record, error) {
	if _, _, err := s.projectFor(ctx, c, pid); err != nil {
		return nil, err
	}
	var ops []map[string]any
	if err := json.Unmarshal(body, &ops); err != nil || len(ops) == 0 {
		return nil, fhir.Invalid("Invalid patch body: expected a non-empty JSON Patch array")
	}
	for i, op := range ops {
		path, _ := op["path"].(string)
		name, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
		if !strings.HasPrefix(path, "/") || !patchable[name] {
			return nil, fhir.Invalid("Patch path "+path+" is not allowed: only /admin, /accessPolicy, /access, /active, /externalId and /userName can change", "["+itoa(i)+"].path")
		}
		switch op["op"] {
		case "replace", "add", "remove":
		default:
			o, _ := op["op"].(string)
			return nil, fhir.Invalid("Patch operation "+o+" on "+path+" is not allowed: only replace, add and remove", "["+itoa(i)+"].op")
		}
	}
	return s.updateMember(ctx, c, pid, mid, func(svc *fhirservice.Service, server *principal.Principal) (*store.Record, error) {
		return svc.Modify(ctx, server, "ProjectMembership", mid, func(cur fhir.Resource) (fhir.Resource, error) {
			return applyMemberPatch(cur, ops)
		})
	})
}

// applyMemberPatch applies PatchMember's checked operations to cur, where a
// replace of a missing field acts as an add and a remove of one does
// nothing (docs/decisions.md 3).
func applyMemberPatch(cur fhir.Resource, ops []map[string]any) (fhir.Resource, error) {
	run := make([]map[string]any, len(ops))
	for i, op := range ops {
		run[i] = op
		name := strings.TrimPrefix(op["path"].(string), "/")
		if strings.Contains(name, "/") {
			continue
		}
		if _, ok := cur[name]; ok {
			continue
		}
		switch op["op"] {
		case "replace":
			run[i] = map[string]any{"op": "add", "path": op["path"], "value": op["value"]}
		case "remove":
			// Removing what is not there leaves the membership as it is.
			run[i] = map[string]any{"op": "test", "path": "/resourceType", "value": "ProjectMembership"}
		}
	}
	raw, _ := json.Marshal(run)
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		return nil, fhir.Invalid("Invalid patch body")
	}
	doc, err := cur.Marshal()
	if err != nil {
		return nil, err
	}
	out, err := patch.Apply(doc)
	if err != nil {
		return nil, fhir.Invalid("Invalid patch: " + err.Error())
	}
	return fhir.ParseResource(out)
}

// updateMember changes a membership of pid by write, which makes the change
// through the FHIR service as the server acting for c (its rules: the
// membership's project and user are fixed, meta is the server's), and checks
// what was written against this use-case's rules (validateMember), all in
// one transaction.
func (s *Service) updateMember(ctx context.Context, c Caller, pid, mid string, write func(svc *fhirservice.Service, server *principal.Principal) (*store.Record, error)) (*store.Record, error) {
	var out *store.Record
	err := s.Store.InTx(ctx, func(tx store.Store) error {
		cur, err := readResource(ctx, tx, store.ProjectScope(pid), "ProjectMembership", mid)
		if err != nil {
			return err
		}
		rec, err := write(s.FHIR.WithStore(tx), c.server(pid))
		if err != nil {
			return err
		}
		next, err := rec.Resource()
		if err != nil {
			return err
		}
		if err := validateMember(ctx, tx, pid, cur, next); err != nil {
			return err
		}
		out = rec
		return nil
	})
	return out, err
}

// readResource reads typ/id as a resource.
func readResource(ctx context.Context, st store.Store, scope store.Scope, typ, id string) (fhir.Resource, error) {
	rec, err := st.Read(ctx, scope, typ, id)
	if err != nil {
		return nil, err
	}
	return rec.Resource()
}

// validateMember checks an updated membership: a profile of the project of a
// profile type, booleans that are booleans, policies of the project, and a
// unique externalId.
func validateMember(ctx context.Context, tx store.Store, pid string, cur, next fhir.Resource) error {
	pref := next.Ref("profile")
	typ, id, ok := fhir.SplitReference(pref)
	if !ok {
		return fhir.Invalid("Missing required property", "ProjectMembership.profile")
	}
	switch typ {
	case "Patient", "Practitioner", "RelatedPerson", "ClientApplication", "Bot":
	default:
		return fhir.Invalid("Invalid profile type "+typ, "ProjectMembership.profile")
	}
	if pref != cur.Ref("profile") {
		if _, err := tx.Read(ctx, store.ProjectScope(pid), typ, id); err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return fhir.Invalid("Profile does not belong to project", "ProjectMembership.profile")
			}
			return err
		}
	}
	for _, f := range []string{"admin", "active"} {
		if v, ok := next[f]; ok {
			if _, isBool := v.(bool); !isBool {
				return fhir.Invalid(f+" must be a boolean", "ProjectMembership."+f)
			}
		}
	}
	if v, ok := next["access"]; ok {
		if _, isList := v.([]any); !isList {
			return fhir.Invalid("access must be an array", "ProjectMembership.access")
		}
	}
	if err := checkPolicies(ctx, tx, pid, policyRefs(next)); err != nil {
		return err
	}
	if ext, _ := next["externalId"].(string); ext != "" && ext != cur.String("externalId") {
		dups, err := store.SearchResources(ctx, tx, store.ProjectScope(pid), "ProjectMembership", "external-id:exact="+esc(ext)+"&_count=2")
		if err != nil {
			return err
		}
		for _, d := range dups {
			if d.ID() != cur.ID() {
				return fhir.Errorf(fhir.EConflict, "Membership with externalId %s already exists in this project", ext)
			}
		}
	}
	return nil
}

// DeleteMember removes a membership, never the profile. The User goes too
// when it is scoped to this project and this was its last membership. The
// owner's membership cannot be deleted. Both deletions are the server's for
// c, through the FHIR service.
func (s *Service) DeleteMember(ctx context.Context, c Caller, pid, mid string) error {
	_, project, err := s.projectFor(ctx, c, pid)
	if err != nil {
		return err
	}
	err = s.Store.InTx(ctx, func(tx store.Store) error {
		svc := s.FHIR.WithStore(tx)
		m, err := readResource(ctx, tx, store.ProjectScope(pid), "ProjectMembership", mid)
		if err != nil {
			return err
		}
		userRef := m.Ref("user")
		if owner := project.Ref("owner"); owner != "" && owner == userRef {
			return fhir.Invalid("Cannot delete the owner of the project")
		}
		if err := svc.Delete(ctx, c.server(pid), "ProjectMembership", mid, ""); err != nil {
			return err
		}
		typ, uid, _ := fhir.SplitReference(userRef)
		if typ != "User" {
			return nil
		}
		u, err := readResource(ctx, tx, store.AllProjects, "User", uid)
		if err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return nil
			}
			return err
		}
		if u.Ref("project") != "Project/"+pid {
			return nil
		}
		others, err := store.SearchResources(ctx, tx, store.AllProjects, "ProjectMembership", "user="+userRef+"&_count=1")
		if err != nil {
			return err
		}
		if len(others) > 0 {
			return nil
		}
		// A project-scoped User lives in its project.
		return svc.Delete(ctx, c.server(pid), "User", uid, "")
	})
	return err
}
