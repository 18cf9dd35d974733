package fhirservice

import (
	"context"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// NewMembership builds a ProjectMembership resource: user logs in to the
// project as profile.
func NewMembership(projectID, projectName, user, profile, profileDisplay string, admin bool) fhir.Resource {
	m := fhir.Resource{
		"resourceType": "ProjectMembership",
		"project":      map[string]any{"reference": "Project/" + projectID, "display": projectName},
		"user":         map[string]any{"reference": user},
		"profile":      map[string]any{"reference": profile, "display": profileDisplay},
	}
	if admin {
		m["admin"] = true
	}
	return m
}

// CreateBot is Create of a Bot whose membership has the AccessPolicy
// accessPolicy ("AccessPolicy/<id>" of the Bot's project, which the caller
// has checked; "" is Create's rule). For the admin API's bot route, whose
// caller names the policy.
func (s *Service) CreateBot(ctx context.Context, p *principal.Principal, bot fhir.Resource, accessPolicy string) (*store.Record, error) {
	if bot.Type() != "Bot" {
		return nil, fhir.Invalid("Incorrect resource type: expected Bot, but found "+bot.Type(), "resourceType")
	}
	return s.create(ctx, p, bot, accessPolicy)
}

// createBotMembership gives the Bot rec, just created by p in tx, its own
// membership in its project (user and profile the Bot), in the same
// transaction, whatever path created it (POST, a Bundle entry, a conditional
// create, the admin API, a bot's FHIR call): a bot's FHIR calls act as its
// membership, and a Bot without one could run but not use the FHIR API
// (medplum/medplum#8685; docs/decisions.md 32). Deleting the Bot deletes it
// (deleteCredentials).
//
// The server writes it for p (p may not write memberships itself), recorded
// as p's. Its access policy is the one named (accessPolicy), else p's own
// when p is neither a super admin nor the server: whoever may create and
// deploy a Bot then gets no more from its executions than p has. Otherwise
// it has none, the project's default rights, as the admin API always gave.
func (s *Service) createBotMembership(ctx context.Context, tx store.Store, p *principal.Principal, project string, rec *store.Record, bot fhir.Resource, accessPolicy string) error {
	prec, err := tx.Read(ctx, store.AllProjects, "Project", project)
	if err != nil {
		return err
	}
	proj, err := prec.Resource()
	if err != nil {
		return err
	}
	ref := "Bot/" + rec.ID
	m := NewMembership(project, proj.String("name"), ref, ref, bot.String("name"), false)
	switch {
	case accessPolicy != "":
		m["accessPolicy"] = map[string]any{"reference": accessPolicy}
	case !p.SuperAdmin && p.Membership != nil:
		inherited := fhir.Resource{}
		for _, f := range []string{"accessPolicy", "access"} {
			if v, ok := p.Membership[f]; ok {
				inherited[f] = v
			}
		}
		for f, v := range inherited.Clone() {
			m[f] = v
		}
	}
	_, err = s.WithStore(tx).Create(ctx, principal.System(project, p.Author()), m)
	return err
}
