package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// bootstrapKey marks a store that has its super-admin project.
const bootstrapKey = "bootstrap.super-admin-project"

// BootstrapResult says what Bootstrap did.
type BootstrapResult struct {
	ProjectID string
	ClientID  string
	// Secret is set only when Bootstrap generated it (first start without a
	// configured secret): it is shown once and never again.
	Secret string
	// Created is true on the first start.
	Created bool
}

// NewSecret returns a random client secret.
func NewSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Bootstrap creates the super-admin Project, its ClientApplication and the
// client's admin membership on an empty store, in one transaction. Later
// starts create nothing; when clientID and secret are configured they are kept
// in force (a changed secret is applied). Replicas starting together agree on
// one project through the store's key-value space.
func Bootstrap(ctx context.Context, s store.Store, clientID, secret string) (*BootstrapResult, error) {
	res := &BootstrapResult{}
	err := s.InTx(ctx, func(tx store.Store) error {
		candidate := uuid.NewString()
		projectID, err := tx.KeyValue(ctx, bootstrapKey, func() (string, error) { return candidate, nil })
		if err != nil {
			return err
		}
		res.ProjectID = projectID
		if projectID != candidate {
			return syncAdminClient(ctx, tx, projectID, clientID, secret, res)
		}
		res.Created = true
		if clientID == "" {
			clientID = uuid.NewString()
		}
		if secret == "" {
			secret = NewSecret()
			res.Secret = secret
		}
		res.ClientID = clientID
		w := store.Write{Project: projectID, Author: system}
		project := fhir.Resource{"resourceType": "Project", "name": "Super Admin", "superAdmin": true, "strictMode": true,
			"owner": map[string]any{"reference": "ClientApplication/" + clientID}}
		pw := w
		pw.ID = projectID
		if _, err := tx.Create(ctx, project, pw); err != nil {
			return fmt.Errorf("create super-admin project: %w", err)
		}
		cw := w
		cw.ID = clientID
		client := fhir.Resource{"resourceType": "ClientApplication", "name": "Super Admin Client", "secret": secret,
			"description": "Created at first start; super admin of the server."}
		if _, err := tx.Create(ctx, client, cw); err != nil {
			return fmt.Errorf("create super-admin client: %w", err)
		}
		// The project and its client have the ids chosen above, which only
		// the store lets a write choose; the membership is written as any
		// other, by the server through the FHIR service.
		m := NewMembership(projectID, "Super Admin", "ClientApplication/"+clientID, "ClientApplication/"+clientID, "Super Admin Client", true)
		_, err = fhirservice.New(fhirservice.Config{Store: tx}).Create(ctx, principal.System(projectID, system), m)
		return err
	})
	return res, err
}

func syncAdminClient(ctx context.Context, s store.Store, projectID, clientID, secret string, res *BootstrapResult) error {
	if clientID == "" || secret == "" {
		return nil
	}
	res.ClientID = clientID
	rec, err := s.Read(ctx, store.AllProjects, "ClientApplication", clientID)
	if fhir.IsCode(err, fhir.ENotFound) {
		return fmt.Errorf("configured admin client %s does not exist in this store (the bootstrap client of this store has another id)", clientID)
	}
	if err != nil {
		return err
	}
	if rec.Project != projectID {
		return fmt.Errorf("configured admin client %s is not in the super-admin project", clientID)
	}
	cur, err := rec.Resource()
	if err != nil {
		return err
	}
	if cur.String("secret") == secret {
		return nil
	}
	_, err = fhirservice.New(fhirservice.Config{Store: s}).Modify(ctx, principal.System(projectID, system), "ClientApplication", clientID,
		func(c fhir.Resource) (fhir.Resource, error) { c["secret"] = secret; return c, nil })
	return err
}

// NewMembership builds a ProjectMembership resource (fhirservice's, which
// also gives every new Bot its own).
func NewMembership(projectID, projectName, user, profile, profileDisplay string, admin bool) fhir.Resource {
	return fhirservice.NewMembership(projectID, projectName, user, profile, profileDisplay, admin)
}
