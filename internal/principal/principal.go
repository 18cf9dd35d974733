// Package principal is who a request acts as: one membership of one project,
// with the roles and the access policy that come with it. internal/services/auth
// resolves credentials (tokens, client secrets) into a Principal; a bot's
// in-process FHIR calls act as the Principal of the bot's own membership;
// the server itself acts as System (logins, set-password links, the Users
// and memberships an invitation makes). The package knows nothing of HTTP:
// the FHIR service (internal/services/fhirservice) and the admin use-cases take a
// Principal, whoever made it.
package principal

import (
	"context"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/access"
	"github.com/sandbot/sandbot/store"
)

// Principal is an authenticated caller: one login into one project through
// one membership.
type Principal struct {
	LoginID string
	// ClientID is the ClientApplication that logged in, if any.
	ClientID string
	// User is the membership's user reference (User/…, ClientApplication/… or Bot/…).
	User string
	// Profile is the membership's profile reference.
	Profile    string
	ProjectID  string
	Project    fhir.Resource
	Membership fhir.Resource
	// SuperAdmin is set for members of the super-admin project.
	SuperAdmin bool
	// Admin is set for project administrators (and super admins).
	Admin bool
	// Access is the compiled access policy of the membership; nil when the
	// membership names none (or for super admins).
	Access *access.Policy

	// system and author are set for System principals only.
	system bool
	author fhir.Reference
}

// System is the server acting by itself, or for a caller where the caller's
// own rights do not reach once a use-case has decided that it may act: a
// login's record and codes, a set-password link, the User and membership of
// an invitation. The FHIR service gives it the role of the server
// (fhirservice.System): it reads and writes the credentials no caller may
// (password hashes, login codes), and the server-managed fields stay the
// server's. With a projectID it sees and writes that project only (what it
// creates is created there); with none, every project (what it creates
// names its project in meta.project). author is the meta.author of its
// writes: "system" when the server acts by itself, else the caller it acts
// for.
func System(projectID string, author fhir.Reference) *Principal {
	return &Principal{ProjectID: projectID, SuperAdmin: true, Admin: true, system: true, author: author}
}

// IsSystem reports whether p is the server itself (System).
func (p *Principal) IsSystem() bool { return p.system }

// Scope is the set of projects the principal may see.
func (p *Principal) Scope() store.Scope {
	if p.SuperAdmin && (!p.system || p.ProjectID == "") {
		return store.AllProjects
	}
	return store.ProjectScope(p.ProjectID)
}

// Author is the meta.author of the principal's writes.
func (p *Principal) Author() fhir.Reference {
	if p.system {
		return p.author
	}
	return fhir.Reference{Reference: p.Profile}
}

// MembershipID is the id of the principal's membership.
func (p *Principal) MembershipID() string { return p.Membership.ID() }

// IsBot reports whether the principal is a Bot acting through its own
// membership (its in-process FHIR calls).
func (p *Principal) IsBot() bool { return strings.HasPrefix(p.User, "Bot/") }

// IsUser reports whether the principal is a person (a User login).
func (p *Principal) IsUser() bool { return strings.HasPrefix(p.User, "User/") }

// Credentials are what a principal was resolved from, kept so that it can
// be resolved again later (internal/services/auth Resume), when work done on its
// behalf runs after the request that asked for it.
type Credentials struct {
	MembershipID string `json:"membership"`
	LoginID      string `json:"login,omitempty"`
	ClientID     string `json:"client,omitempty"`
}

// CredentialsOf is what p was resolved from.
func CredentialsOf(p *Principal) Credentials {
	return Credentials{MembershipID: p.MembershipID(), LoginID: p.LoginID, ClientID: p.ClientID}
}

type contextKey struct{}

// FromContext returns the principal stored in ctx, or nil.
func FromContext(ctx context.Context) *Principal {
	p, _ := ctx.Value(contextKey{}).(*Principal)
	return p
}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, contextKey{}, p)
}

// FindMembership returns the first active membership whose user is ref, or nil.
func FindMembership(ctx context.Context, s store.Store, userRef string) (fhir.Resource, error) {
	found, err := store.SearchResources(ctx, s, store.AllProjects, "ProjectMembership", "user="+userRef+"&_count=5")
	if err != nil {
		return nil, err
	}
	for _, m := range found {
		if active, ok := m["active"].(bool); ok && !active {
			continue
		}
		return m, nil
	}
	return nil, nil
}

// ForMembership loads a membership, its project and its access policy into
// a Principal (without LoginID and ClientID, which the caller knows).
// fhir.ErrUnauthorized when the membership or its project is gone or the
// membership is inactive.
func ForMembership(ctx context.Context, s store.Store, membershipID string) (*Principal, error) {
	mrec, err := s.Read(ctx, store.AllProjects, "ProjectMembership", membershipID)
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return nil, fhir.ErrUnauthorized
		}
		return nil, err
	}
	m, err := mrec.Resource()
	if err != nil {
		return nil, err
	}
	if active, ok := m["active"].(bool); ok && !active {
		return nil, fhir.ErrUnauthorized
	}
	_, projectID, _ := fhir.SplitReference(m.Ref("project"))
	prec, err := s.Read(ctx, store.AllProjects, "Project", projectID)
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return nil, fhir.ErrUnauthorized
		}
		return nil, err
	}
	project, err := prec.Resource()
	if err != nil {
		return nil, err
	}
	p := &Principal{
		User:       m.Ref("user"),
		Profile:    m.Ref("profile"),
		ProjectID:  projectID,
		Project:    project,
		Membership: m,
		SuperAdmin: project.Bool("superAdmin"),
	}
	p.Admin = p.SuperAdmin || m.Bool("admin")
	if !p.SuperAdmin {
		if p.Access, err = loadPolicy(ctx, s, m); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// ForUser is the principal of the active membership whose user is userRef
// (a Bot's own membership, say), or nil when there is none.
func ForUser(ctx context.Context, s store.Store, userRef string) (*Principal, error) {
	m, err := FindMembership(ctx, s, userRef)
	if err != nil || m == nil {
		return nil, err
	}
	return ForMembership(ctx, s, m.ID())
}
