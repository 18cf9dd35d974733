package admin

import (
	"context"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// CreateProject stores a Project (super admins only). A project belongs to
// itself: its id is its meta.project.
func (s *Service) CreateProject(ctx context.Context, c Caller, project fhir.Resource) (*store.Record, error) {
	if err := c.MayCreateProject(); err != nil {
		return nil, err
	}
	if project.Type() != "Project" {
		return nil, fhir.Invalid("Incorrect resource type: expected Project, but found "+project.Type(), "resourceType")
	}
	if strings.TrimSpace(project.String("name")) == "" {
		return nil, fhir.Invalid("Project name is required", "name")
	}
	// What a super admin may set of a Project is the FHIR service's rule.
	return s.FHIR.Create(ctx, c.Principal, project)
}

// InitProject is Project/$init: a Project owned by the caller (when it is a
// User) or by the named owner, its default ClientApplication with its
// membership, and the owner's Practitioner with an admin membership, in one
// transaction, written through the FHIR service by the server for the
// caller. A ClientApplication caller must be super admin.
func (s *Service) InitProject(ctx context.Context, c Caller, name, ownerRef string) (*store.Record, error) {
	if err := c.MayInitProject(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(name) == "" {
		return nil, fhir.Invalid("Expected required input parameter 'name'", "Parameters.parameter")
	}
	if ownerRef == "" && c.IsUser() {
		ownerRef = c.User
	}
	var owner fhir.Resource
	if ownerRef != "" {
		typ, id, ok := fhir.SplitReference(ownerRef)
		if !ok || typ != "User" {
			return nil, fhir.Invalid("Only Users are permitted to be the owner of a new Project", "owner")
		}
		rec, err := s.Store.Read(ctx, store.AllProjects, "User", id)
		if err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return nil, fhir.Invalid("Owner "+ownerRef+" does not exist", "owner")
			}
			return nil, err
		}
		if owner, err = rec.Resource(); err != nil {
			return nil, err
		}
		if owner.Ref("project") != "" {
			return nil, fhir.Invalid("Project owner must not belong to another Project", "owner")
		}
	}
	var out *store.Record
	err := s.FHIR.InTx(ctx, func(tx *fhirservice.Service) error {
		// The caller has no rights in a project that does not exist yet:
		// the server creates it for the caller, and everything in it.
		project := fhir.Resource{"resourceType": "Project", "name": name, "strictMode": true}
		if owner != nil {
			project["owner"] = ref(ownerRef)
		}
		rec, err := tx.Create(ctx, principal.System("", c.author()), project)
		if err != nil {
			return err
		}
		out = rec
		pid := rec.ID
		server := c.server(pid)
		client := fhir.Resource{"resourceType": "ClientApplication", "name": name + " Default Client",
			"description": "Default client for " + name, "secret": NewSecret()}
		crec, err := tx.Create(ctx, server, client)
		if err != nil {
			return err
		}
		cref := "ClientApplication/" + crec.ID
		if _, err := tx.Create(ctx, server, NewMembership(pid, name, cref, cref, name+" Default Client", false)); err != nil {
			return err
		}
		if owner != nil {
			prof := fhir.Resource{"resourceType": "Practitioner",
				"name": []any{map[string]any{"given": []any{owner.String("firstName")}, "family": owner.String("lastName")}}}
			if e := owner.String("email"); e != "" {
				prof["telecom"] = []any{map[string]any{"system": "email", "use": "work", "value": e}}
			}
			prec, err := tx.Create(ctx, server, prof)
			if err != nil {
				return err
			}
			m := NewMembership(pid, name, ownerRef, "Practitioner/"+prec.ID, strings.TrimSpace(owner.String("firstName")+" "+owner.String("lastName")), true)
			if _, err := tx.Create(ctx, server, m); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ProjectDetails is GET /admin/projects/:id.
func (s *Service) ProjectDetails(ctx context.Context, c Caller, id string) (map[string]any, error) {
	if _, _, err := s.projectFor(ctx, c, id); err != nil {
		return nil, err
	}
	rec, err := s.FHIR.Read(ctx, c.Principal, "Project", id)
	if err != nil {
		return nil, err
	}
	p, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	out := map[string]any{"id": p.ID(), "name": p["name"]}
	for _, f := range []string{"setting", "secret", "site"} {
		if v, ok := p[f]; ok {
			out[f] = v
		} else {
			out[f] = []any{}
		}
	}
	return map[string]any{"project": out}, nil
}

// ReplaceProjectList replaces Project.secret, .setting or .site wholesale.
func (s *Service) ReplaceProjectList(ctx context.Context, c Caller, id, field string, value []any) (*store.Record, error) {
	switch field {
	case "secret", "setting", "site":
	default:
		return nil, fhir.ErrNotFound
	}
	if _, _, err := s.projectFor(ctx, c, id); err != nil {
		return nil, err
	}
	for i, v := range value {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fhir.Invalid("Each entry must be an object", field+"["+itoa(i)+"]")
		}
		if n, _ := m["name"].(string); n == "" {
			return nil, fhir.Invalid("Each entry needs a name", field+"["+itoa(i)+"].name")
		}
	}
	return s.FHIR.Modify(ctx, c.Principal, "Project", id, func(cur fhir.Resource) (fhir.Resource, error) {
		if len(value) == 0 {
			delete(cur, field)
		} else {
			cur[field] = value
		}
		return cur, nil
	})
}

// CreateClient creates a ClientApplication with a generated secret and its
// membership in the project.
func (s *Service) CreateClient(ctx context.Context, c Caller, pid string, body map[string]any) (*store.Record, error) {
	_, project, err := s.projectFor(ctx, c, pid)
	if err != nil {
		return nil, err
	}
	name, _ := body["name"].(string)
	if strings.TrimSpace(name) == "" {
		return nil, fhir.Invalid("Client name is required", "name")
	}
	client := fhir.Resource{"resourceType": "ClientApplication", "name": name, "secret": NewSecret()}
	for _, f := range []string{"description", "redirectUri", "identityProvider", "refreshTokenLifetime"} {
		if v, ok := body[f]; ok {
			client[f] = v
		}
	}
	return s.createWithMembership(ctx, c, pid, project, client, body["accessPolicy"])
}

// CreateBot creates a Bot in project pid; the FHIR service gives it its own
// membership (user = profile = the Bot), with the body's accessPolicy.
func (s *Service) CreateBot(ctx context.Context, c Caller, pid string, body map[string]any) (*store.Record, error) {
	_, _, err := s.projectFor(ctx, c, pid)
	if err != nil {
		return nil, err
	}
	name, _ := body["name"].(string)
	if strings.TrimSpace(name) == "" {
		return nil, fhir.Invalid("Bot name is required", "name")
	}
	bot := fhir.Resource{"resourceType": "Bot", "name": name, "runtimeVersion": "wasm"}
	for _, f := range []string{"description", "runtimeVersion", "identifier", "timeout"} {
		if v, ok := body[f]; ok {
			bot[f] = v
		}
	}
	// meta.project names the project (a super admin may name any; for
	// anyone else the service keeps it to their own, which is pid).
	bot["meta"] = map[string]any{"project": pid}
	var out *store.Record
	err = s.Store.InTx(ctx, func(tx store.Store) error {
		policy, err := policyRef(ctx, tx, pid, body["accessPolicy"])
		if err != nil {
			return err
		}
		out, err = s.FHIR.WithStore(tx).CreateBot(ctx, c.Principal, bot, policy)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// policyRef is the reference of an accessPolicy given to the admin API
// ({"reference": "AccessPolicy/<id>"}, or nil for none), checked to be one
// of project pid's policies.
func policyRef(ctx context.Context, st store.Store, pid string, policy any) (string, error) {
	if policy == nil {
		return "", nil
	}
	pref, _ := policy.(map[string]any)
	pr, _ := pref["reference"].(string)
	if err := checkPolicies(ctx, st, pid, []string{pr}); err != nil {
		return "", err
	}
	return pr, nil
}

// createWithMembership creates a ClientApplication and its membership (a
// Bot's is the FHIR service's, CreateBot).
func (s *Service) createWithMembership(ctx context.Context, c Caller, pid string, project, res fhir.Resource, policy any) (*store.Record, error) {
	var out *store.Record
	err := s.Store.InTx(ctx, func(tx store.Store) error {
		// The resource is the caller's write, under the FHIR service's
		// rules; its membership is this use-case's, which the server
		// writes for the caller.
		svc := s.FHIR.WithStore(tx)
		// meta.project names the project (a super admin may name any; for
		// anyone else the service keeps it to their own, which is pid).
		res["meta"] = map[string]any{"project": pid}
		rec, err := svc.Create(ctx, c.Principal, res)
		if err != nil {
			return err
		}
		out = rec
		r := res.Type() + "/" + rec.ID
		m := NewMembership(pid, project.String("name"), r, r, res.String("name"), false)
		pr, err := policyRef(ctx, tx, pid, policy)
		if err != nil {
			return err
		}
		if pr != "" {
			m["accessPolicy"] = ref(pr)
		}
		_, err = svc.Create(ctx, c.server(pid), m)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checkPolicies verifies that every AccessPolicy reference exists in the project.
func checkPolicies(ctx context.Context, st store.Store, pid string, refs []string) error {
	for _, r := range refs {
		typ, id, ok := fhir.SplitReference(r)
		if !ok || typ != "AccessPolicy" {
			return fhir.Invalid("Access policy "+r+" does not exist", "accessPolicy")
		}
		rec, err := st.Read(ctx, store.AllProjects, "AccessPolicy", id)
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return fhir.Invalid("Access policy "+r+" does not exist", "accessPolicy")
		}
		if err != nil {
			return err
		}
		if rec.Project != pid {
			return fhir.Invalid("Access policy "+r+" does not belong to this project", "accessPolicy")
		}
	}
	return nil
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}
