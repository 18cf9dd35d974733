package admin

import (
	"context"
	"encoding/json"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// Member reads a membership of the project.
func (s *Service) Member(ctx context.Context, c Caller, pid, mid string) (*store.Record, error) {
	if _, _, err := s.projectFor(ctx, c, pid); err != nil {
		return nil, err
	}
	return s.Store.Read(ctx, store.ProjectScope(pid), "ProjectMembership", mid)
}

// memberUpdate is whether updateMember's fn replaces the membership (a
// full update) or patches it.
type memberUpdate bool

const (
	replaceMember memberUpdate = true
	patchMember   memberUpdate = false
)

// UpdateMember replaces a membership (POST …/members/:mid). The body must be
// that membership (403 otherwise); project and user cannot change (400);
// missing project/user are kept.
func (s *Service) UpdateMember(ctx context.Context, c Caller, pid, mid string, body fhir.Resource) (*store.Record, error) {
	if _, _, err := s.projectFor(ctx, c, pid); err != nil {
		return nil, err
	}
	if body.Type() != "ProjectMembership" || body.ID() != mid {
		return nil, fhir.ErrForbidden
	}
	return s.updateMember(ctx, c, pid, mid, replaceMember, func(cur fhir.Resource) (fhir.Resource, error) {
		next := body.Clone()
		for _, f := range []string{"project", "user"} {
			if _, ok := next[f]; !ok {
				next[f] = cur[f]
				continue
			}
			if next.Ref(f) != cur.Ref(f) {
				return nil, fhir.Invalid("The "+f+" of a membership cannot change", f)
			}
			next[f] = cur[f]
		}
		return next, nil
	})
}

// patchable are the membership fields a JSON Patch may touch.
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
	return s.updateMember(ctx, c, pid, mid, patchMember, func(cur fhir.Resource) (fhir.Resource, error) {
		for i, op := range ops {
			path := op["path"].(string)
			name := strings.TrimPrefix(path, "/")
			if op["op"] == "replace" && !strings.Contains(name, "/") {
				if _, ok := cur[name]; !ok {
					ops[i]["op"] = "add"
				}
			}
			if op["op"] == "remove" && !strings.Contains(name, "/") {
				if _, ok := cur[name]; !ok {
					// Removing what is not there leaves the membership as it is.
					ops[i] = map[string]any{"op": "test", "path": "/resourceType", "value": "ProjectMembership"}
				}
			}
		}
		raw, _ := json.Marshal(ops)
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
	})
}

// updateMember writes a membership through fn, under this use-case's rules
// (validateMember) and the field rules of the FHIR service's table.
func (s *Service) updateMember(ctx context.Context, c Caller, pid, mid string, how memberUpdate, fn store.UpdateFunc) (*store.Record, error) {
	var out *store.Record
	err := s.Store.InTx(ctx, func(tx store.Store) error {
		var err error
		out, err = tx.Update(ctx, store.ProjectScope(pid), "ProjectMembership", mid, store.Write{Author: c.author()},
			func(cur fhir.Resource) (fhir.Resource, error) {
				next, err := fn(cur.Clone())
				if err != nil {
					return nil, err
				}
				if err := fhirservice.ApplyFieldRules(c.Principal, "ProjectMembership", cur, next, bool(how)); err != nil {
					return nil, err
				}
				return next, validateMember(ctx, tx, pid, cur, next)
			})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
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
// owner's membership cannot be deleted.
func (s *Service) DeleteMember(ctx context.Context, c Caller, pid, mid string) error {
	_, project, err := s.projectFor(ctx, c, pid)
	if err != nil {
		return err
	}
	err = s.Store.InTx(ctx, func(tx store.Store) error {
		rec, err := tx.Read(ctx, store.ProjectScope(pid), "ProjectMembership", mid)
		if err != nil {
			return err
		}
		m, err := rec.Resource()
		if err != nil {
			return err
		}
		userRef := m.Ref("user")
		if owner := project.Ref("owner"); owner != "" && owner == userRef {
			return fhir.Invalid("Cannot delete the owner of the project")
		}
		if err := tx.Delete(ctx, store.ProjectScope(pid), "ProjectMembership", mid, store.Write{Author: c.author()}); err != nil {
			return err
		}
		typ, uid, _ := fhir.SplitReference(userRef)
		if typ != "User" {
			return nil
		}
		urec, err := tx.Read(ctx, store.AllProjects, "User", uid)
		if err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return nil
			}
			return err
		}
		u, err := urec.Resource()
		if err != nil {
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
		return tx.Delete(ctx, store.AllProjects, "User", uid, store.Write{Author: c.author()})
	})
	return err
}
