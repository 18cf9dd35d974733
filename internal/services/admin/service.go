package admin

import (
	"context"
	"log/slog"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/mail"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// Caller is who asks for an administrative action: the principal the HTTP
// layer resolved, with admin's own rules of who may do what.
type Caller struct{ *principal.Principal }

func (c Caller) author() fhir.Reference { return c.Author() }

// server is the server acting for c in project pid, once a use-case has
// decided that c may act there: for the writes c's own role may not make
// through /fhir/R4 (Users, memberships), under the FHIR service's rules for
// the server, recorded as c's.
func (c Caller) server(pid string) *principal.Principal { return principal.System(pid, c.author()) }

// MayCreateProject is the rule of POST /admin/Project: super admins only
// (docs/decisions.md 1).
func (c Caller) MayCreateProject() error {
	if !c.SuperAdmin {
		return fhir.Errorf(fhir.EForbidden, "Forbidden: only super admins create projects through this endpoint")
	}
	return nil
}

// MayInitProject is the rule of Project/$init: any User, and super admins
// (docs/decisions.md 2).
func (c Caller) MayInitProject() error {
	if !c.IsUser() && !c.SuperAdmin {
		return fhir.Errorf(fhir.EForbidden, "Forbidden: only users and super admins may create projects")
	}
	return nil
}

// MayAdminister is the rule of every /admin/projects/:id route: project
// admins and super admins (which project is checked by each use-case,
// docs/decisions.md 2).
func (c Caller) MayAdminister() error {
	if !c.Admin {
		return fhir.ErrForbidden
	}
	return nil
}

// Service runs the administrative use-cases.
type Service struct {
	Store store.Store
	// Mail sends invitations; nil logs them.
	Mail mail.Sender
	// BaseURL is the web app's base URL ending in "/" (SANDBOT_APP_BASE_URL,
	// by default the server's): mails link to its sign-in and set-password
	// pages.
	BaseURL string
	Log     *slog.Logger
	// SuperProjectID is the super-admin project, which keeps server-scoped Users.
	SuperProjectID string
	// FHIR is the FHIR service: the use-cases read and write resources on
	// a caller's behalf through it, so that its rules (Rules) apply.
	FHIR *fhirservice.Service
	// MailFailed is called when an invitation could not be sent (a metric).
	MailFailed func()
	// BeforeMembershipWrite, when set, runs inside the invite transaction
	// just before the membership is written; an error aborts the invite.
	// Tests use it to prove that a failed invite leaves nothing behind.
	BeforeMembershipWrite func() error
}

func (s *Service) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

var system = fhir.Reference{Reference: "system"}

// projectFor checks that the caller administers project id and returns it:
// project admins only their own project (403 otherwise), super admins any.
func (s *Service) projectFor(ctx context.Context, c Caller, id string) (*store.Record, fhir.Resource, error) {
	if err := c.MayAdminister(); err != nil {
		return nil, nil, err
	}
	if !c.SuperAdmin && id != c.ProjectID {
		return nil, nil, fhir.Errorf(fhir.EForbidden, "Forbidden: project admins administer only their own project")
	}
	rec, err := s.Store.Read(ctx, store.AllProjects, "Project", id)
	if err != nil {
		return nil, nil, err
	}
	p, err := rec.Resource()
	if err != nil {
		return nil, nil, err
	}
	return rec, p, nil
}

func ref(r string) map[string]any { return map[string]any{"reference": r} }

func refDisplay(r, display string) map[string]any {
	m := map[string]any{"reference": r}
	if display != "" {
		m["display"] = display
	}
	return m
}

func esc(v string) string {
	// Search values: escape commas (OR lists) and percent-encode.
	return strings.NewReplacer("%", "%25", "&", "%26", "+", "%2B", "#", "%23", ",", `\,`, " ", "%20").Replace(v)
}
