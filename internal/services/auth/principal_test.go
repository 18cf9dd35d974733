package auth

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// TestPrincipalForUserIsCachedUntilAChange: a Bot's principal is resolved
// once, and resolved again (here: found gone) once a change of a
// membership is announced.
func TestPrincipalForUserIsCachedUntilAChange(t *testing.T) {
	ctx := context.Background()
	st, err := sqlstore.Open(ctx, filepath.Join(t.TempDir(), "a.db"), sqlstore.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	w := store.Write{Project: "p1"}
	proj, err := st.Create(ctx, fhir.Resource{"resourceType": "Project", "name": "one"}, w)
	if err != nil {
		t.Fatal(err)
	}
	bot, err := st.Create(ctx, fhir.Resource{"resourceType": "Bot", "name": "b"}, w)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.Create(ctx, fhir.Resource{"resourceType": "ProjectMembership", "project": map[string]any{"reference": "Project/" + proj.ID},
		"user": map[string]any{"reference": "Bot/" + bot.ID}, "profile": map[string]any{"reference": "Bot/" + bot.ID}}, w)
	if err != nil {
		t.Fatal(err)
	}
	a := NewAuthenticator(st, nil, nil)
	p, err := a.PrincipalForUser(ctx, "Bot/"+bot.ID)
	if err != nil || p == nil || p.ProjectID != proj.ID {
		t.Fatalf("principal = %+v, %v; want the Bot's", p, err)
	}
	p.ProjectID = "changed by a caller"
	if err := st.Delete(ctx, store.ProjectScope("p1"), "ProjectMembership", m.ID, w); err != nil {
		t.Fatal(err)
	}
	// Not announced yet: the cached principal, unchanged by what a caller
	// did to its copy.
	if p, err := a.PrincipalForUser(ctx, "Bot/"+bot.ID); err != nil || p == nil || p.ProjectID != proj.ID {
		t.Fatalf("before the change is announced: %+v, %v; want the cached principal", p, err)
	}
	a.Changed([]store.Change{{ResourceType: "ProjectMembership", ID: m.ID, Project: "p1"}})
	if p, err := a.PrincipalForUser(ctx, "Bot/"+bot.ID); err != nil || p != nil {
		t.Fatalf("after the membership's deletion was announced: %+v, %v; want none", p, err)
	}
}
