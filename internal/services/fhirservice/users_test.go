package fhirservice_test

import (
	"context"
	"slices"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/servertest"
)

// TestUsersByEmail: the lookup of accounts by e-mail compares the whole
// address without regard to case: BOB@Example.com finds bob@example.com,
// and an address that begins, ends or extends another finds nothing of it.
func TestUsersByEmail(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		su := s.SuperAdmin(t)
		ids := map[string]string{}
		for _, e := range []string{"bob@example.com", "Ann@Example.org", "bob@example.co", "bob@example.com.au", "xbob@example.com"} {
			ids[e] = su.Create(map[string]any{"resourceType": "User", "firstName": "B", "lastName": "Ob", "email": e})["id"].(string)
		}
		sys := principal.System("", fhir.Reference{Reference: "system"})
		for _, tc := range []struct {
			email string
			want  []string
		}{
			{"bob@example.com", []string{"bob@example.com"}},
			{"BOB@Example.com", []string{"bob@example.com"}},
			{"  bob@EXAMPLE.COM ", []string{"bob@example.com"}},
			{"ann@example.org", []string{"Ann@Example.org"}},
			{"bob@example.co", []string{"bob@example.co"}},
			{"bob@example.c", nil},
			{"ob@example.com", nil},
			{"bob@example", nil},
			{"%", nil},
			{"", nil},
		} {
			users, err := s.Service.UsersByEmail(context.Background(), sys, tc.email)
			if err != nil {
				t.Fatalf("%q: %v", tc.email, err)
			}
			var got, want []string
			for _, u := range users {
				got = append(got, u.ID())
			}
			for _, e := range tc.want {
				want = append(want, ids[e])
			}
			if !slices.Equal(got, want) {
				t.Errorf("UsersByEmail(%q) = %v, want %v", tc.email, got, want)
			}
		}
		// The server writes and reads the credentials of what it finds; no
		// caller, not even a super admin, sees them.
		ctx := context.Background()
		if _, err := s.Service.Modify(ctx, sys, "User", ids["bob@example.com"], func(u fhir.Resource) (fhir.Resource, error) {
			u["passwordHash"] = "h"
			return u, nil
		}); err != nil {
			t.Fatal(err)
		}
		users, err := s.Service.UsersByEmail(ctx, sys, "bob@example.com")
		if err != nil || len(users) != 1 || users[0].String("passwordHash") != "h" {
			t.Fatalf("as the server: %v %v", users, err)
		}
		super := &principal.Principal{SuperAdmin: true, Admin: true, ProjectID: s.Bootstrap.ProjectID, Profile: su.Profile}
		users, err = s.Service.UsersByEmail(ctx, super, "bob@example.com")
		if err != nil || len(users) != 1 || users[0]["passwordHash"] != nil {
			t.Fatalf("as a super admin: %v %v", users, err)
		}
	})
}
