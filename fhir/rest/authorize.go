package rest

import (
	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/auth"
)

type action int

const (
	actionRead action = iota
	actionSearch
	actionCreate
	actionUpdate
	actionDelete
)

func (a action) writes() bool { return a >= actionCreate }

// serverTypes are kept by the server for itself: only super admins reach them
// through the FHIR API.
var serverTypes = map[string]bool{"Login": true, "JsonWebKey": true, "DomainConfiguration": true}

// adminTypes are the reference's project-administration types: invisible to
// plain members, readable by project admins.
var adminTypes = map[string]bool{
	"AccessPolicy": true, "Project": true, "ProjectMembership": true, "User": true, "UserSecurityRequest": true,
}

// authorize decides by resource type and action, before any query runs. The
// project wall itself is the store scope; access policies refine this later.
func authorize(p *auth.Principal, typ string, a action) error {
	if p.SuperAdmin {
		return nil
	}
	if serverTypes[typ] {
		return fhir.ErrForbidden
	}
	if !adminTypes[typ] {
		return nil
	}
	if !p.Admin {
		return fhir.ErrForbidden
	}
	switch typ {
	case "ProjectMembership":
		if a.writes() {
			return fhir.Errorf(fhir.EForbidden, "Project admins change memberships through /admin/projects/{projectId}/members/{membershipId} and invite through /admin/projects/{projectId}/invite")
		}
	case "User":
		if a.writes() {
			return fhir.Errorf(fhir.EForbidden, "A User can only be changed by the user themself")
		}
	case "Project":
		if a == actionCreate || a == actionDelete {
			return fhir.ErrForbidden
		}
	}
	return nil
}
