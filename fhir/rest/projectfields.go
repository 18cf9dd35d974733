package rest

import (
	"reflect"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/auth"
)

// Project fields a project admin may not change (medplum-wire 6.4): the
// read-only ones are shown, the hidden ones are neither shown nor written.
// Only super admins write them.
var (
	projectReadonly = []string{"features", "link", "systemSetting"}
	projectHidden   = []string{"superAdmin", "systemSecret", "strictMode"}
)

// protectProject checks a project admin's new version of its Project against
// the stored one. A hidden field the client sets is refused; one it leaves
// out keeps its stored value (the client never saw it). A read-only field
// that differs from the stored value is refused; on a full update (replace)
// one left out keeps its stored value.
func protectProject(p *auth.Principal, cur, next fhir.Resource, replace bool) error {
	if p.SuperAdmin {
		return nil
	}
	for _, f := range projectHidden {
		if _, ok := next[f]; ok {
			return fhir.Errorf(fhir.EForbidden, "Forbidden: Project.%s cannot be written", f)
		}
		if v, ok := cur[f]; ok {
			next[f] = v
		}
	}
	for _, f := range projectReadonly {
		nv, inNext := next[f]
		if !inNext && replace {
			if v, ok := cur[f]; ok {
				next[f] = v
			}
			continue
		}
		cv, inCur := cur[f]
		if inNext != inCur || !reflect.DeepEqual(nv, cv) {
			return fhir.Errorf(fhir.EForbidden, "Forbidden: Project.%s is read-only", f)
		}
	}
	return nil
}

// projectView is the Project a project admin sees: its hidden fields removed.
func projectView(p *auth.Principal, res fhir.Resource) fhir.Resource {
	if p != nil && p.SuperAdmin {
		return res
	}
	for _, f := range projectHidden {
		delete(res, f)
	}
	return res
}
