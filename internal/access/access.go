// Package access compiles AccessPolicy resources into the rules that limit
// what a member may read and write. It is domain logic only: the FHIR layer
// (internal/handlers/fhirapi) asks it which resource types are allowed, whether a type is
// writable, and which search filters restrict a type.
//
// A policy has resource[] entries, each with a resourceType ("*" for every
// type), an optional readonly flag and an optional criteria ("Type?query").
// Criteria may use %profile (the member's profile reference) and the names of
// the membership's access[].parameter values (e.g. %patient). Several
// policies on one membership are unioned.
//
// Several entries with criteria for one type are ORed (a resource matching
// any of them is visible); an entry without criteria for the type grants the
// whole type.
//
// An entry may also name hiddenFields (removed from what the member reads,
// refused when it writes them) and readonlyFields (shown, never changed), as
// dotted paths ("address", "name.family"). As in the reference, the fields of
// the first entry, in policy order, that grants the interaction and matches
// the resource apply (FieldEntries gives them in that order); the FHIR
// service (internal/services/fhirservice) enforces them.
package access

import (
	"net/url"
	"strings"

	"github.com/sandbot/sandbot/fhir"
)

// Entry is one compiled resource rule.
type Entry struct {
	ResourceType string
	Readonly     bool
	// Criteria restricts the entry to matching resources; nil means the whole
	// type within the project.
	Criteria *fhir.SearchRequest
	// HiddenFields and ReadonlyFields are the entry's field restrictions,
	// dotted paths into the resource.
	HiddenFields, ReadonlyFields []string
}

// Policy is the compiled union of a member's policies. A nil *Policy means
// "no policy": the project without limit (admin types are decided elsewhere).
type Policy struct {
	Entries []Entry
}

// Binding is one policy applied to a membership with its parameters.
type Binding struct {
	Policy fhir.Resource
	// Params maps a variable name (without "%") to its value, a reference
	// ("Patient/123") or a string.
	Params map[string]string
}

// Compile builds the policy of a membership from its bindings. Errors are
// *fhir.Error (a malformed criteria in a stored policy).
func Compile(bindings []Binding) (*Policy, error) {
	p := &Policy{}
	for _, b := range bindings {
		entries, _ := b.Policy["resource"].([]any)
		for _, e := range entries {
			m, _ := e.(map[string]any)
			if m == nil {
				continue
			}
			rt, _ := m["resourceType"].(string)
			if rt == "" {
				continue
			}
			ro, _ := m["readonly"].(bool)
			ent := Entry{ResourceType: rt, Readonly: ro, HiddenFields: stringList(m["hiddenFields"]), ReadonlyFields: stringList(m["readonlyFields"])}
			if c, _ := m["criteria"].(string); c != "" {
				req, err := ParseCriteria(c, b.Params)
				if err != nil {
					return nil, err
				}
				if rt != "*" && req.ResourceType != rt {
					return nil, fhir.Invalid("Access policy criteria must search the entry's resource type: "+c, "AccessPolicy.resource.criteria")
				}
				ent.Criteria = req
			}
			p.Entries = append(p.Entries, ent)
		}
	}
	return p, nil
}

// stringList is the non-empty strings of a JSON array.
func stringList(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, _ := x.(string); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ParseCriteria parses "Type?query", substituting %name variables from
// params. A reference variable used with _id is replaced by its id part.
func ParseCriteria(criteria string, params map[string]string) (*fhir.SearchRequest, error) {
	typ, query, _ := strings.Cut(criteria, "?")
	if !fhir.KnownType(typ) {
		return nil, fhir.Invalid("Invalid access policy criteria: "+criteria, "AccessPolicy.resource.criteria")
	}
	var parts []string
	for _, pair := range strings.Split(query, "&") {
		if pair == "" {
			continue
		}
		name, value, _ := strings.Cut(pair, "=")
		value = substitute(value, params, name == "_id")
		parts = append(parts, name+"="+url.QueryEscape(value))
	}
	return fhir.ParseSearch(typ, strings.Join(parts, "&"))
}

// substitute replaces %name tokens. An unknown variable becomes a value that
// matches nothing, so a policy never widens by a missing parameter.
func substitute(value string, params map[string]string, idOnly bool) string {
	if raw, err := url.QueryUnescape(value); err == nil {
		value = raw
	}
	if !strings.Contains(value, "%") {
		return value
	}
	var out []string
	for _, v := range strings.Split(value, ",") {
		if strings.HasPrefix(v, "%") {
			name := strings.TrimPrefix(v, "%")
			rep, ok := params[name]
			if !ok || rep == "" {
				rep = "__no_such_value__"
			}
			if idOnly {
				if i := strings.LastIndex(rep, "/"); i >= 0 {
					rep = rep[i+1:]
				}
			}
			v = rep
		}
		out = append(out, v)
	}
	return strings.Join(out, ",")
}

func (p *Policy) matching(typ string) []Entry {
	var out []Entry
	for _, e := range p.Entries {
		if e.ResourceType == typ || e.ResourceType == "*" {
			out = append(out, e)
		}
	}
	return out
}

// Allows reports whether the policy grants any access to the type.
func (p *Policy) Allows(typ string) bool {
	if p == nil {
		return true
	}
	return len(p.matching(typ)) > 0
}

// CanWrite reports whether some matching entry is not read-only.
func (p *Policy) CanWrite(typ string) bool {
	if p == nil {
		return true
	}
	for _, e := range p.matching(typ) {
		if !e.Readonly {
			return true
		}
	}
	return false
}

// Filters returns the restriction of the type as groups of filters, one
// group per matching entry with criteria: a resource is visible when it
// matches every filter of at least one group (nil: no restriction). ok is
// false when the type is not allowed at all. When write is true only
// writable entries count.
func (p *Policy) Filters(typ string, write bool) (groups [][]fhir.Filter, ok bool) {
	if p == nil {
		return nil, true
	}
	allowed := false
	for _, e := range p.matching(typ) {
		if write && e.Readonly {
			continue
		}
		allowed = true
		if e.Criteria == nil {
			return nil, true
		}
		// A "*" entry's criteria names one type; it restricts only that type.
		if e.Criteria.ResourceType == typ {
			groups = append(groups, e.Criteria.Filters)
		}
	}
	if !allowed {
		return nil, false
	}
	if len(groups) == 0 {
		return [][]fhir.Filter{{noMatch(typ)}}, true
	}
	return groups, true
}

// noMatch is a filter no resource satisfies.
func noMatch(typ string) fhir.Filter {
	req, _ := fhir.ParseSearch(typ, "_id=__none__")
	return req.Filters[0]
}

// FieldEntry is one entry's field restrictions for one type, with the filters
// a resource must match for the entry to apply (nil: every resource of the
// type).
type FieldEntry struct {
	Filters                      []fhir.Filter
	HiddenFields, ReadonlyFields []string
}

// FieldEntries lists, in policy order, the entries that grant typ (for
// writes, only the writable ones) with their field restrictions: the first
// whose filters a resource matches gives its hidden and read-only fields. nil
// when no entry for the type names any field (nothing to enforce).
func (p *Policy) FieldEntries(typ string, write bool) []FieldEntry {
	if p == nil {
		return nil
	}
	var out []FieldEntry
	any := false
	for _, e := range p.matching(typ) {
		if write && e.Readonly {
			continue
		}
		fe := FieldEntry{HiddenFields: e.HiddenFields, ReadonlyFields: e.ReadonlyFields}
		if e.Criteria != nil {
			if e.Criteria.ResourceType != typ {
				continue // a "*" entry's criteria restricts only its own type
			}
			fe.Filters = e.Criteria.Filters
		}
		any = any || len(fe.HiddenFields) > 0 || len(fe.ReadonlyFields) > 0
		out = append(out, fe)
	}
	if !any {
		return nil
	}
	return out
}
