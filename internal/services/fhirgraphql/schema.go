// Package fhirgraphql is FHIR GraphQL ($graphql) in the reference's schema
// shape: for every resource type T a query field T(id:) and a field
// TList(<T's search parameters>, _count, _offset, _sort, _filter, …), the
// resources' fields as their StructureDefinitions declare them (backbone
// elements as nested types, choice elements as one field per type), and
// Reference.resource resolving the reference. The schema is generated from
// the embedded FHIR definitions (package fhir/definitions) with
// github.com/graphql-go/graphql; every read and search goes through the FHIR
// service, so GraphQL sees exactly what REST sees for the same caller.
package fhirgraphql

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/graphql-go/graphql"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
)

// structureDefinition is the part of a StructureDefinition the schema is
// built from.
type structureDefinition struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Kind       string `json:"kind"`
	Abstract   bool   `json:"abstract"`
	Derivation string `json:"derivation"`
	Snapshot   struct {
		Element []element `json:"element"`
	} `json:"snapshot"`
}

type element struct {
	Path             string `json:"path"`
	Max              string `json:"max"`
	ContentReference string `json:"contentReference"`
	Type             []struct {
		Code string `json:"code"`
	} `json:"type"`
}

// scalars maps FHIR primitive types to GraphQL scalars; any other primitive
// is a String.
var scalars = map[string]*graphql.Scalar{
	"boolean": graphql.Boolean, "integer": graphql.Int, "positiveInt": graphql.Int, "unsignedInt": graphql.Int,
	"integer64": graphql.String, "decimal": graphql.Float,
	"http://hl7.org/fhirpath/System.Boolean": graphql.Boolean, "http://hl7.org/fhirpath/System.Integer": graphql.Int,
	"http://hl7.org/fhirpath/System.Decimal": graphql.Float,
}

// builder turns StructureDefinitions into GraphQL types.
type builder struct {
	sds      map[string]*structureDefinition // by type name: resources and complex types
	objects  map[string]*graphql.Object
	names    map[string]bool
	resource *graphql.Union // every resource type
	resolve  *resolver
}

func (b *builder) load(set *definitions.Set) error {
	for _, r := range set.All("StructureDefinition") {
		var sd structureDefinition
		if err := json.Unmarshal(r.JSON, &sd); err != nil {
			return fmt.Errorf("fhirgraphql: StructureDefinition %s: %w", r.ID, err)
		}
		if sd.Derivation == "constraint" || sd.Abstract || (sd.Kind != "resource" && sd.Kind != "complex-type") {
			continue
		}
		if len(sd.Snapshot.Element) == 0 || sd.Type == "" {
			continue
		}
		if _, dup := b.sds[sd.Type]; !dup {
			b.sds[sd.Type] = &sd
		}
	}
	return nil
}

// resourceTypes are the resource types of the schema: those the server
// knows that have a definition, sorted.
func (b *builder) resourceTypes() []string {
	var out []string
	for name, sd := range b.sds {
		if sd.Kind == "resource" && fhir.KnownType(name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// object is the GraphQL type of the elements under path in sd, named name.
func (b *builder) object(name string, sd *structureDefinition, path string) *graphql.Object {
	if o, ok := b.objects[name]; ok {
		return o
	}
	b.names[name] = true
	o := graphql.NewObject(graphql.ObjectConfig{
		Name: name,
		Fields: graphql.FieldsThunk(func() graphql.Fields {
			return b.fields(name, sd, path)
		}),
	})
	b.objects[name] = o
	return o
}

func (b *builder) fields(name string, sd *structureDefinition, path string) graphql.Fields {
	fields := graphql.Fields{}
	if sd.Kind == "resource" && path == sd.Type {
		fields["resourceType"] = &graphql.Field{Type: graphql.String}
	}
	prefix := path + "."
	for i := range sd.Snapshot.Element {
		e := &sd.Snapshot.Element[i]
		seg, ok := strings.CutPrefix(e.Path, prefix)
		if !ok || seg == "" || strings.Contains(seg, ".") {
			continue
		}
		list := e.Max == "*" || (e.Max != "" && e.Max != "0" && e.Max != "1")
		wrap := func(t graphql.Output) graphql.Output {
			if list {
				return graphql.NewList(t)
			}
			return t
		}
		switch {
		case strings.HasSuffix(seg, "[x]"):
			base := strings.TrimSuffix(seg, "[x]")
			for _, t := range e.Type {
				fields[base+upperFirst(lastSegment(t.Code))] = &graphql.Field{Type: wrap(b.typeOf(t.Code))}
			}
		case e.ContentReference != "":
			ref := strings.TrimPrefix(e.ContentReference, "#")
			if i := strings.Index(ref, "#"); i >= 0 { // "url#Path"
				ref = ref[i+1:]
			}
			fields[seg] = &graphql.Field{Type: wrap(b.object(nestedName(ref), sd, ref))}
		case len(e.Type) == 1 && (e.Type[0].Code == "BackboneElement" || e.Type[0].Code == "Element") && b.hasChildren(sd, e.Path):
			fields[seg] = &graphql.Field{Type: wrap(b.object(nestedName(e.Path), sd, e.Path))}
		case len(e.Type) >= 1:
			fields[seg] = &graphql.Field{Type: wrap(b.typeOf(e.Type[0].Code))}
		}
	}
	if path == "Reference" && sd.Type == "Reference" {
		fields["resource"] = &graphql.Field{Type: b.resource, Resolve: b.resolve.reference}
	}
	if len(fields) == 0 {
		fields["id"] = &graphql.Field{Type: graphql.String}
	}
	return fields
}

func (b *builder) hasChildren(sd *structureDefinition, path string) bool {
	prefix := path + "."
	for _, e := range sd.Snapshot.Element {
		if strings.HasPrefix(e.Path, prefix) {
			return true
		}
	}
	return false
}

// typeOf is the GraphQL type of a FHIR type code.
func (b *builder) typeOf(code string) graphql.Output {
	if s, ok := scalars[code]; ok {
		return s
	}
	if code == "Resource" || code == "DomainResource" {
		return b.resource
	}
	sd, ok := b.sds[code]
	if !ok || sd.Kind != "complex-type" && sd.Kind != "resource" {
		return graphql.String // primitives and System types
	}
	return b.object(code, sd, sd.Type)
}

// nestedName is the type name of a backbone element: its path without dots,
// each segment capitalised (Patient.contact -> PatientContact).
func nestedName(path string) string {
	var sb strings.Builder
	for _, s := range strings.Split(path, ".") {
		sb.WriteString(upperFirst(s))
	}
	return sb.String()
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func lastSegment(code string) string {
	if i := strings.LastIndexAny(code, "/."); i >= 0 {
		return code[i+1:]
	}
	return code
}

// argName is a search parameter code as a GraphQL argument ('-' is not
// allowed in GraphQL names; the reference writes '_').
func argName(code string) string { return strings.ReplaceAll(code, "-", "_") }

// buildSchema generates the schema from the definitions.
func buildSchema(set *definitions.Set, r *resolver) (graphql.Schema, error) {
	b := &builder{sds: map[string]*structureDefinition{}, objects: map[string]*graphql.Object{}, names: map[string]bool{}, resolve: r}
	if err := b.load(set); err != nil {
		return graphql.Schema{}, err
	}
	types := b.resourceTypes()
	b.resource = graphql.NewUnion(graphql.UnionConfig{
		Name: "ResourceList",
		Types: func() []*graphql.Object {
			out := make([]*graphql.Object, len(types))
			for i, t := range types {
				out[i] = b.object(t, b.sds[t], t)
			}
			return out
		}(),
		ResolveType: func(p graphql.ResolveTypeParams) *graphql.Object {
			if m, ok := p.Value.(map[string]any); ok {
				if t, ok := m["resourceType"].(string); ok {
					return b.objects[t]
				}
			}
			return nil
		},
	})
	params := searchArgs(set)
	query := graphql.Fields{}
	for _, t := range types {
		obj := b.object(t, b.sds[t], t)
		query[t] = &graphql.Field{Type: obj,
			Args:    graphql.FieldConfigArgument{"id": &graphql.ArgumentConfig{Type: graphql.NewNonNull(graphql.String)}},
			Resolve: r.read(t)}
		args := graphql.FieldConfigArgument{}
		codes := map[string]string{}
		for _, c := range append(append([]string{}, params[t]...), params["Resource"]...) {
			args[argName(c)] = &graphql.ArgumentConfig{Type: graphql.String}
			codes[argName(c)] = c
		}
		for _, c := range []string{"_count", "_offset"} {
			args[c] = &graphql.ArgumentConfig{Type: graphql.Int}
			codes[c] = c
		}
		for _, c := range []string{"_sort", "_filter", "_total", "_id", "_lastUpdated", "_project", "_compartment"} {
			if _, ok := args[c]; !ok {
				args[c] = &graphql.ArgumentConfig{Type: graphql.String}
				codes[c] = c
			}
		}
		query[t+"List"] = &graphql.Field{Type: graphql.NewList(obj), Args: args, Resolve: r.search(t, codes)}
	}
	return graphql.NewSchema(graphql.SchemaConfig{Query: graphql.NewObject(graphql.ObjectConfig{Name: "Query", Fields: query})})
}

// searchArgs lists the search parameter codes of each base type (Resource
// for the common ones).
func searchArgs(set *definitions.Set) map[string][]string {
	out := map[string][]string{}
	seen := map[string]bool{}
	for _, r := range set.All("SearchParameter") {
		var sp struct {
			Code string   `json:"code"`
			Base []string `json:"base"`
		}
		if json.Unmarshal(r.JSON, &sp) != nil || sp.Code == "" || !validName(argName(sp.Code)) {
			continue
		}
		for _, b := range sp.Base {
			if !seen[b+" "+sp.Code] {
				seen[b+" "+sp.Code] = true
				out[b] = append(out[b], sp.Code)
			}
		}
	}
	return out
}

func validName(s string) bool {
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return s != ""
}
