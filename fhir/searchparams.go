package fhir

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

//go:generate go run ./internal/gensearch -o searchparams_gen.go

// ParamType is the FHIR search parameter type, which decides how values are
// indexed and compared.
type ParamType string

// Supported search parameter types. Special parameters are not in the
// table.
const (
	TokenParam     ParamType = "token"     // system|code; indexed as (system, value)
	StringParam    ParamType = "string"    // prefix match, case-insensitive; :exact, :contains
	ReferenceParam ParamType = "reference" // "Type/id", "id", a URL; :Type, chains
	DateParam      ParamType = "date"      // ranges with eq/ne/gt/lt/ge/le/sa/eb/ap
	BooleanParam   ParamType = "boolean"   // a token whose element is a boolean: only true/false
	NumberParam    ParamType = "number"    // decimal with implicit precision and prefixes
	QuantityParam  ParamType = "quantity"  // number|system|code
	URIParam       ParamType = "uri"       // exact; :below is a prefix
	// CompositeParam pairs the values of its components within one element
	// (code$value): see SearchParam.Components.
	CompositeParam ParamType = "composite"
)

// FHIRType is the type a parameter has in FHIR (a boolean parameter is a
// token there), for CapabilityStatement and GraphQL.
func (t ParamType) FHIRType() string {
	if t == BooleanParam {
		return string(TokenParam)
	}
	return string(t)
}

// SearchParamDef is one SearchParameter definition as the generated table
// (searchparams_gen.go) holds it: the fields of the SearchParameter resource
// the server uses. Type is BooleanParam for a token whose expression ends on
// boolean elements (the generator looks them up in the StructureDefinitions).
type SearchParamDef struct {
	URL        string
	Code       string
	Type       ParamType
	Base       []string
	Expression string
	Target     []string
	// Single is set when every resource has at most one value (a path of
	// elements of cardinality ..1): a count needs no DISTINCT.
	Single bool
	// Counted is set on a Single token whose values come from a small set
	// (a code or boolean element, a reference's type): the store keeps the
	// number of resources of each value, so that totals need no count.
	Counted bool
	// Components are a composite parameter's parts, in order: each is
	// evaluated on every element the parameter's Expression gives.
	Components []ComponentDef
}

// ComponentDef is one part of a composite parameter: the type of the
// parameter its definition names, and its expression relative to the
// composite's element ("value.ofType(Quantity)").
type ComponentDef struct {
	Type       ParamType
	Expression string
}

// MaxCompositeElements bounds the elements of one resource a composite
// parameter indexes (an Observation's components): the rows past it are
// not written, as tokens longer than MaxIndexedValue are not.
const MaxCompositeElements = 100

// SearchParam is one search parameter of one resource type: the part of a
// definition's expression that applies to that type, compiled.
type SearchParam struct {
	Code         string
	Type         ParamType
	ResourceType string
	// Expression is the FHIRPath the values are extracted with (the
	// definition's, for every type it applies to).
	Expression string
	// Target lists the resource types a reference parameter may point to.
	Target []string
	// URL is the canonical url of the SearchParameter definition.
	URL string
	// Column is set for parameters answered from the resource row itself
	// (_id, _lastUpdated, _project) instead of the search index.
	Column string
	// Single is set when a resource has at most one value.
	Single bool
	// Counted is set when the store keeps the number of resources of each
	// value (see SearchParamDef.Counted).
	Counted bool
	// Components are the parts of a composite parameter, each a parameter
	// of its own type whose Code is the composite's with "$" and its
	// position ("code-value-quantity$1") and whose expression is evaluated
	// on one element of the composite. Their index rows carry the element's
	// number (IndexValue.Group), so that a search pairs values of one
	// element only. They are not searchable by themselves.
	Components []*SearchParam

	path *PathExpr
}

// columnParams are answered from the resource row instead of the index;
// _project is the server's own (the reference has it too, without a
// SearchParameter).
var columnParams = map[string]string{"_id": "id", "_lastUpdated": "last_updated", "_project": "project_id"}

var serverParamDefs = []SearchParamDef{
	{URL: "https://medplum.com/fhir/SearchParameter/Resource-project", Code: "_project", Type: ReferenceParam, Base: []string{"Resource"}, Expression: "Resource.meta.project", Target: []string{"Project"}},
}

// SkippedParam is a definition the server does not search by, and why.
type SkippedParam struct {
	Code, Base, Expression, Reason string
}

var (
	paramIndex    map[string]map[string]*SearchParam
	paramLists    map[string][]*SearchParam // by type, sorted by code
	indexedLists  map[string][]*SearchParam // the same without Column parameters
	skippedParams []SkippedParam
)

func init() {
	paramIndex, skippedParams = buildParamIndex(append(append([]SearchParamDef{}, searchParamDefs...), serverParamDefs...))
	paramLists, indexedLists = map[string][]*SearchParam{}, map[string][]*SearchParam{}
	for typ, params := range paramIndex {
		list := make([]*SearchParam, 0, len(params))
		for _, p := range params {
			list = append(list, p)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].Code < list[j].Code })
		paramLists[typ] = list
		for _, p := range list {
			if p.Column == "" {
				indexedLists[typ] = append(indexedLists[typ], p)
			}
			if p.Counted {
				countedTypes[typ] = true
			}
		}
	}
}

// buildParamIndex compiles the definitions for every type they apply to.
// Definitions whose expression is outside the supported FHIRPath subset are
// skipped, with the reason.
func buildParamIndex(defs []SearchParamDef) (map[string]map[string]*SearchParam, []SkippedParam) {
	idx := map[string]map[string]*SearchParam{}
	var skipped []SkippedParam
	for _, d := range defs {
		expr, err := ParsePath(d.Expression)
		if d.Expression == "" {
			err = errNoExpression
		}
		if err != nil {
			skipped = append(skipped, SkippedParam{Code: d.Code, Base: strings.Join(d.Base, ","), Expression: d.Expression, Reason: err.Error()})
			continue
		}
		var types []string
		for _, b := range d.Base {
			if b == "Resource" || b == "DomainResource" {
				types = append(types, KnownTypeNames()...)
			} else if KnownType(b) {
				types = append(types, b)
			}
		}
		var comps []*PathExpr
		for _, c := range d.Components {
			if err != nil {
				break
			}
			var ce *PathExpr
			ce, err = ParsePath(c.Expression)
			comps = append(comps, ce)
		}
		if err != nil {
			skipped = append(skipped, SkippedParam{Code: d.Code, Base: strings.Join(d.Base, ","), Expression: d.Expression, Reason: err.Error()})
			continue
		}
		for _, t := range types {
			if idx[t] == nil {
				idx[t] = map[string]*SearchParam{}
			}
			if prev := idx[t][d.Code]; prev != nil && prev.URL != d.URL && isBaseDef(d) {
				continue // a type's own definition wins over Resource's
			}
			p := &SearchParam{Code: d.Code, Type: d.Type, ResourceType: t, Expression: d.Expression,
				Target: d.Target, URL: d.URL, Column: columnParams[d.Code], Single: d.Single, Counted: d.Counted, path: expr}
			for i, c := range d.Components {
				p.Components = append(p.Components, &SearchParam{Code: d.Code + "$" + strconv.Itoa(i), Type: c.Type,
					ResourceType: t, Expression: c.Expression, path: comps[i]})
			}
			idx[t][d.Code] = p
		}
	}
	return idx, skipped
}

func isBaseDef(d SearchParamDef) bool {
	return len(d.Base) == 1 && (d.Base[0] == "Resource" || d.Base[0] == "DomainResource")
}

var errNoExpression = &Error{Code: EInvalid, Message: "no expression"}

// HasCountedParams reports whether a type has Counted parameters.
func HasCountedParams(resourceType string) bool { return countedTypes[resourceType] }

var countedTypes = map[string]bool{}

// LookupParam finds the parameter code for a resource type.
func LookupParam(resourceType, code string) *SearchParam {
	return paramIndex[resourceType][code]
}

// ParamsFor lists the parameters of a resource type, sorted by code. The
// list is shared: callers must not change it.
func ParamsFor(resourceType string) []*SearchParam { return paramLists[resourceType] }

// IndexedParams lists the parameters whose values live in the search index
// for a resource type (those without a Column), sorted by code. The list is
// shared: callers must not change it.
func IndexedParams(resourceType string) []*SearchParam { return indexedLists[resourceType] }

// SearchParamsSkipped lists the definitions of the table that are not
// searchable, because their expression is outside the supported subset.
func SearchParamsSkipped() []SkippedParam { return skippedParams }

// extractVersion is bumped whenever Extract gives other values for the same
// table (a change of the FHIRPath evaluation or of how values are indexed):
// the stores then rebuild their index.
const extractVersion = "4"

var searchIndexVersion = func() string {
	h := sha256.New()
	io.WriteString(h, extractVersion)
	for _, d := range append(append([]SearchParamDef{}, searchParamDefs...), serverParamDefs...) {
		fmt.Fprintf(h, "\n%s %s %s %v %q %v %v %v %v", d.URL, d.Code, d.Type, d.Base, d.Expression, d.Target, d.Single, d.Counted, d.Components)
	}
	names := make([]string, 0, len(choiceElements))
	for n := range choiceElements {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(h, "\n%v", names)
	return hex.EncodeToString(h.Sum(nil))[:16]
}()

// SearchIndexVersion identifies the index values Extract gives: the
// parameter table and the extraction code. A store whose index rows were
// written under another version rebuilds them.
func SearchIndexVersion() string { return searchIndexVersion }
