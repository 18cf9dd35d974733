package fhir

import "sort"

// ParamType is the FHIR search parameter type, which decides how values are
// indexed and compared.
type ParamType string

// Supported search parameter types.
const (
	TokenParam     ParamType = "token"     // system|code; indexed as (system, value)
	StringParam    ParamType = "string"    // prefix match, case-insensitive; :exact
	ReferenceParam ParamType = "reference" // "Type/id"
	DateParam      ParamType = "date"      // ranges with eq/ne/gt/lt/ge/le
	BooleanParam   ParamType = "boolean"   // a token that only takes true/false
)

// Derivation transforms an extracted value before it is indexed.
type Derivation int

// Derivations.
const (
	// NoDerivation indexes the value as found.
	NoDerivation Derivation = iota
	// ReferenceType indexes the resource type of a reference ("Patient/1" ->
	// "Patient"), which is how the reference platform's resolve() behaves.
	ReferenceType
)

// SearchParam declares one search parameter. Adding a parameter is adding one
// row to SearchParams: the store indexes every path listed here on write and
// searches them with the same generic SQL.
type SearchParam struct {
	Code string
	Type ParamType
	// Base lists the resource types the parameter applies to; "*" for all.
	Base []string
	// Paths are dotted paths into the resource; an element may carry a filter
	// "[field=value]" (e.g. "telecom[system=email].value"). Several paths are ORed.
	Paths []string
	// Derive transforms extracted values (see Derivation).
	Derive Derivation
	// Column is set for parameters answered from the resource row itself
	// (_id, _lastUpdated, _project) instead of the search index.
	Column string
}

var humanProfiles = []string{"Patient", "Practitioner", "RelatedPerson"}

// SearchParams is the table of every supported search parameter.
var SearchParams = []SearchParam{
	{Code: "_id", Type: TokenParam, Base: []string{"*"}, Column: "id"},
	{Code: "_lastUpdated", Type: DateParam, Base: []string{"*"}, Column: "last_updated"},
	{Code: "_project", Type: ReferenceParam, Base: []string{"*"}, Column: "project_id"},

	{Code: "identifier", Type: TokenParam, Base: []string{"Patient", "Practitioner", "RelatedPerson", "Bot", "Project", "ClientApplication", "ProjectMembership", "Organization", "Observation", "Encounter"}, Paths: []string{"identifier"}},
	{Code: "name", Type: StringParam, Base: []string{"Patient", "Practitioner", "RelatedPerson", "Bot", "Project", "ClientApplication", "Organization", "AccessPolicy"}, Paths: []string{"name"}},
	{Code: "family", Type: StringParam, Base: humanProfiles, Paths: []string{"name.family"}},
	{Code: "given", Type: StringParam, Base: humanProfiles, Paths: []string{"name.given"}},
	{Code: "email", Type: TokenParam, Base: humanProfiles, Paths: []string{"telecom[system=email].value"}},
	{Code: "phone", Type: TokenParam, Base: humanProfiles, Paths: []string{"telecom[system=phone].value"}},
	{Code: "telecom", Type: TokenParam, Base: humanProfiles, Paths: []string{"telecom.value"}},
	{Code: "birthdate", Type: DateParam, Base: []string{"Patient", "RelatedPerson"}, Paths: []string{"birthDate"}},
	{Code: "gender", Type: TokenParam, Base: humanProfiles, Paths: []string{"gender"}},
	{Code: "active", Type: BooleanParam, Base: []string{"Patient", "Practitioner", "RelatedPerson", "Organization"}, Paths: []string{"active"}},
	{Code: "patient", Type: ReferenceParam, Base: []string{"RelatedPerson", "Observation", "Encounter"}, Paths: []string{"patient", "subject"}},
	{Code: "subject", Type: ReferenceParam, Base: []string{"Observation", "Encounter", "Communication"}, Paths: []string{"subject"}},
	{Code: "code", Type: TokenParam, Base: []string{"Observation"}, Paths: []string{"code"}},

	{Code: "email", Type: TokenParam, Base: []string{"User"}, Paths: []string{"email"}},
	{Code: "project", Type: ReferenceParam, Base: []string{"User"}, Paths: []string{"project"}},
	{Code: "external-id", Type: StringParam, Base: []string{"User"}, Paths: []string{"externalId"}},

	{Code: "project", Type: ReferenceParam, Base: []string{"ProjectMembership"}, Paths: []string{"project"}},
	{Code: "user", Type: ReferenceParam, Base: []string{"ProjectMembership"}, Paths: []string{"user"}},
	{Code: "profile", Type: ReferenceParam, Base: []string{"ProjectMembership"}, Paths: []string{"profile"}},
	{Code: "profile-type", Type: TokenParam, Base: []string{"ProjectMembership"}, Paths: []string{"profile"}, Derive: ReferenceType},
	{Code: "admin", Type: BooleanParam, Base: []string{"ProjectMembership"}, Paths: []string{"admin"}},
	{Code: "active", Type: BooleanParam, Base: []string{"ProjectMembership"}, Paths: []string{"active"}},
	{Code: "external-id", Type: StringParam, Base: []string{"ProjectMembership"}, Paths: []string{"externalId"}},
	{Code: "user-name", Type: StringParam, Base: []string{"ProjectMembership"}, Paths: []string{"userName"}},
	{Code: "access-policy", Type: ReferenceParam, Base: []string{"ProjectMembership"}, Paths: []string{"accessPolicy", "access.policy"}},

	{Code: "user", Type: ReferenceParam, Base: []string{"Login"}, Paths: []string{"user"}},

	{Code: "entity", Type: ReferenceParam, Base: []string{"AuditEvent"}, Paths: []string{"entity.what"}},
	{Code: "type", Type: TokenParam, Base: []string{"AuditEvent"}, Paths: []string{"type"}},
	{Code: "outcome", Type: TokenParam, Base: []string{"AuditEvent"}, Paths: []string{"outcome"}},
	{Code: "date", Type: DateParam, Base: []string{"AuditEvent"}, Paths: []string{"recorded"}},

	{Code: "url", Type: StringParam, Base: []string{"Binary"}, Paths: []string{"url"}},
}

var paramIndex = func() map[string]map[string]*SearchParam {
	idx := map[string]map[string]*SearchParam{}
	for i := range SearchParams {
		p := &SearchParams[i]
		for _, b := range p.Base {
			if idx[b] == nil {
				idx[b] = map[string]*SearchParam{}
			}
			if _, dup := idx[b][p.Code]; dup {
				panic("fhir: duplicate search parameter " + b + "." + p.Code)
			}
			idx[b][p.Code] = p
		}
	}
	return idx
}()

// LookupParam finds the parameter code for a resource type.
func LookupParam(resourceType, code string) *SearchParam {
	if p := paramIndex[resourceType][code]; p != nil {
		return p
	}
	return paramIndex["*"][code]
}

// ParamsFor lists the parameters of a resource type, sorted by code, including
// the ones shared by every type.
func ParamsFor(resourceType string) []*SearchParam {
	var out []*SearchParam
	for _, p := range paramIndex["*"] {
		out = append(out, p)
	}
	for _, p := range paramIndex[resourceType] {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Code < out[j].Code })
	return out
}

// IndexedParams lists the parameters whose values live in the search index
// for a resource type (those without a Column).
func IndexedParams(resourceType string) []*SearchParam {
	var out []*SearchParam
	for _, p := range paramIndex[resourceType] {
		if p.Column == "" {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Code < out[j].Code })
	return out
}
