// Command genvalidate writes fhir/validate_gen.go, the structure table the
// validator (fhir/validate.go) checks every written resource against, from
// the StructureDefinition snapshots embedded in fhir/definitions (go
// generate ./fhir runs it; scripts/refresh-definitions.sh after every
// refresh of the data).
//
// A row is a resource type, a complex data type or a backbone element
// ("Patient.contact"): its elements by JSON name, each with its type and
// whether it is an array (max "*" or > 1). A choice element (value[x]) is
// expanded into one name per type (valueString, valueQuantity, ...) that
// share the group name. An element given by a contentReference
// ("#Questionnaire.item") has the referenced backbone as its type.
// Profiles (derivation constraint), logical models and abstract types are
// left out.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/format"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/sandbot/sandbot/fhir/definitions"
)

func main() {
	out := flag.String("o", "validate_gen.go", "output file")
	flag.Parse()
	src, err := generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "genvalidate:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, src, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "genvalidate:", err)
		os.Exit(1)
	}
}

type extension struct {
	URL      string `json:"url"`
	ValueURL string `json:"valueUrl"`
	ValueURI string `json:"valueUri"`
}

type elementDef struct {
	Path             string `json:"path"`
	Min              int    `json:"min"`
	Max              string `json:"max"`
	ContentReference string `json:"contentReference"`
	Type             []struct {
		Code          string      `json:"code"`
		Extension     []extension `json:"extension"`
		TargetProfile []string    `json:"targetProfile"`
	} `json:"type"`
	Binding struct {
		Strength string `json:"strength"`
		ValueSet string `json:"valueSet"`
	} `json:"binding"`
}

type structureDefinition struct {
	URL        string `json:"url"`
	Kind       string `json:"kind"`
	Derivation string `json:"derivation"`
	Abstract   bool   `json:"abstract"`
	Type       string `json:"type"`
	Snapshot   struct {
		Element []elementDef `json:"element"`
	} `json:"snapshot"`
}

type element struct {
	name, typ, choice string
	array             bool
	// binding is the ValueSet of a required binding, on coded types.
	binding string
	// targets are the resource types a Reference may point to (none: any).
	targets []string
}

// codedTypes are the types whose values a required binding constrains.
var codedTypes = map[string]bool{"code": true, "Coding": true, "CodeableConcept": true}

// requiredBinding is the ValueSet (its version dropped) of a required
// binding of an element of type code, "" when there is none.
func requiredBinding(e elementDef, code string) string {
	if e.Binding.Strength != "required" || !codedTypes[code] {
		return ""
	}
	vs, _, _ := strings.Cut(e.Binding.ValueSet, "|")
	return vs
}

// serverTargets are the types sandbot's own writes put in a Reference
// beside those the definitions allow: the super admin project, created at
// bootstrap, is owned by the admin ClientApplication (there is no User).
var serverTargets = map[string][]string{"Project.owner": {"ClientApplication"}}

// referenceTargets are the resource types a Reference element allows, from
// its target profiles ("http://hl7.org/fhir/StructureDefinition/Patient" is
// Patient); none when any resource is allowed.
func referenceTargets(path, code string, profiles []string) []string {
	if code != "Reference" || len(profiles) == 0 {
		return nil
	}
	out := append([]string{}, serverTargets[path]...)
	for _, p := range profiles {
		t := p[strings.LastIndexByte(p, '/')+1:]
		if t == "Resource" || t == "DomainResource" {
			return nil
		}
		out = append(out, t)
	}
	return out
}

type structure struct {
	resource bool
	elements []element
	required []string
}

const fhirTypeExt = "http://hl7.org/fhir/StructureDefinition/structuredefinition-fhir-type"

// typeCode is an element type's FHIR type: the System types of id and
// value elements carry theirs in an extension.
func typeCode(code string, ext []extension) string {
	if !strings.HasPrefix(code, "http://hl7.org/fhirpath/System.") {
		return code
	}
	for _, e := range ext {
		if e.URL == fhirTypeExt {
			if e.ValueURL != "" {
				return e.ValueURL
			}
			return e.ValueURI
		}
	}
	switch code {
	case "http://hl7.org/fhirpath/System.Boolean":
		return "boolean"
	case "http://hl7.org/fhirpath/System.Integer":
		return "integer"
	case "http://hl7.org/fhirpath/System.Decimal":
		return "decimal"
	}
	return "string"
}

func generate() ([]byte, error) {
	set, err := definitions.Load()
	if err != nil {
		return nil, err
	}
	structures := map[string]*structure{}
	var primitives []string
	profiles := map[string]string{} // url -> resource type
	for _, r := range set.All("StructureDefinition") {
		var sd structureDefinition
		if err := json.Unmarshal(r.JSON, &sd); err != nil {
			return nil, fmt.Errorf("%s: %w", r.ID, err)
		}
		if sd.Derivation == "constraint" || sd.Kind == "logical" || sd.Type == "" {
			continue
		}
		if sd.Kind == "primitive-type" {
			primitives = append(primitives, sd.Type)
			continue
		}
		if _, dup := structures[sd.Type]; dup {
			continue
		}
		// Abstract types (Resource, DomainResource, Element, BackboneElement)
		// are never the type of a value: their elements are in every
		// snapshot that derives from them.
		if sd.Abstract {
			continue
		}
		structures[sd.Type] = &structure{resource: sd.Kind == "resource"}
		if sd.Kind == "resource" {
			profiles[sd.URL] = sd.Type
		}
		for _, e := range sd.Snapshot.Element {
			i := strings.LastIndexByte(e.Path, '.')
			if i < 0 {
				continue
			}
			parent, name := e.Path[:i], e.Path[i+1:]
			st := structures[parent]
			if st == nil {
				st = &structure{}
				structures[parent] = st
			}
			array := e.Max != "1" && e.Max != "0"
			if e.Max == "0" {
				continue
			}
			if e.ContentReference != "" {
				st.elements = append(st.elements, element{name: name, typ: strings.TrimPrefix(e.ContentReference, "#"), array: array})
				if e.Min > 0 {
					st.required = append(st.required, name)
				}
				continue
			}
			if strings.HasSuffix(name, "[x]") {
				base := strings.TrimSuffix(name, "[x]")
				for _, t := range e.Type {
					code := typeCode(t.Code, t.Extension)
					st.elements = append(st.elements, element{name: base + strings.ToUpper(code[:1]) + code[1:], typ: code, choice: base, array: array,
						binding: requiredBinding(e, code), targets: referenceTargets(e.Path, code, t.TargetProfile)})
				}
				if e.Min > 0 {
					st.required = append(st.required, base+"[x]")
				}
				continue
			}
			if len(e.Type) != 1 {
				return nil, fmt.Errorf("%s: %d types", e.Path, len(e.Type))
			}
			code := typeCode(e.Type[0].Code, e.Type[0].Extension)
			if code == "BackboneElement" || code == "Element" {
				code = e.Path
			}
			st.elements = append(st.elements, element{name: name, typ: code, array: array,
				binding: requiredBinding(e, code), targets: referenceTargets(e.Path, code, e.Type[0].TargetProfile)})
			if e.Min > 0 {
				st.required = append(st.required, name)
			}
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "// Code generated by fhir/internal/genvalidate from %s; DO NOT EDIT.\n\npackage fhir\n\n", definitions.Version())
	sort.Strings(primitives)
	b.WriteString("// primitiveTypes are the FHIR primitive types (their formats are in\n// validate.go).\nvar primitiveTypes = map[string]bool{\n")
	for _, p := range primitives {
		fmt.Fprintf(&b, "\t%q: true,\n", p)
	}
	b.WriteString("}\n\n")
	b.WriteString("// structures are the resource types, complex data types and backbone\n// elements, by name.\nvar structures = map[string]*structure{\n")
	for _, n := range slices.Sorted(maps.Keys(structures)) {
		st := structures[n]
		fmt.Fprintf(&b, "\t%q: {", n)
		if st.resource {
			b.WriteString("Resource: true, ")
		}
		if len(st.required) > 0 {
			fmt.Fprintf(&b, "Required: %s, ", goStrings(st.required))
		}
		b.WriteString("Elements: map[string]element{\n")
		for _, e := range st.elements {
			fmt.Fprintf(&b, "\t\t%q: {Type: %q", e.name, e.typ)
			if e.array {
				b.WriteString(", Array: true")
			}
			if e.choice != "" {
				fmt.Fprintf(&b, ", Choice: %q", e.choice)
			}
			if e.binding != "" {
				fmt.Fprintf(&b, ", Binding: %q", e.binding)
			}
			if len(e.targets) > 0 {
				fmt.Fprintf(&b, ", Targets: %s", goStrings(e.targets))
			}
			b.WriteString("},\n")
		}
		b.WriteString("\t}},\n")
	}
	b.WriteString("}\n\n")
	b.WriteString("// profileTypes are the profiles the server has, by url: the definitions of\n// the resource types.\nvar profileTypes = map[string]string{\n")
	for _, u := range slices.Sorted(maps.Keys(profiles)) {
		fmt.Fprintf(&b, "\t%q: %q,\n", u, profiles[u])
	}
	b.WriteString("}\n")
	return format.Source(b.Bytes())
}

// goStrings is list as a Go []string literal.
func goStrings(list []string) string {
	q := make([]string, len(list))
	for i, v := range list {
		q[i] = strconv.Quote(v)
	}
	return "[]string{" + strings.Join(q, ", ") + "}"
}
