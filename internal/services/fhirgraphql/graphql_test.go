package fhirgraphql

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/graphql-go/graphql"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/limits"
)

func engine(t testing.TB) *graphql.Schema {
	s, err := sharedSchema()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSchemaShape: the generated schema has the reference's query fields and
// types (backbone elements nested, choice elements one field per type,
// Reference.resource), and builds quickly enough to do at start.
func TestSchemaShape(t *testing.T) {
	start := time.Now()
	e := engine(t)
	t.Logf("schema built in %v", time.Since(start))
	q := e.QueryType().Fields()
	for _, f := range []string{"Patient", "PatientList", "Bot", "BotList", "ProjectMembershipList", "StructureDefinitionList", "SearchParameterList"} {
		if q[f] == nil {
			t.Errorf("no query field %s", f)
		}
	}
	args := map[string]bool{}
	for _, a := range q["PatientList"].Args {
		args[a.Name()] = true
	}
	for _, a := range []string{"name", "family", "birthdate", "general_practitioner", "_count", "_sort", "_filter", "_id"} {
		if !args[a] {
			t.Errorf("PatientList has no argument %s", a)
		}
	}
	for typ, fields := range map[string][]string{
		"Patient":        {"resourceType", "id", "name", "contact", "multipleBirthBoolean", "multipleBirthInteger", "deceasedDateTime"},
		"PatientContact": {"relationship", "name"},
		"Reference":      {"reference", "display", "resource"},
		"Observation":    {"valueQuantity", "valueString", "component"},
	} {
		o, ok := e.Type(typ).(*graphql.Object)
		if !ok {
			t.Errorf("no object type %s", typ)
			continue
		}
		have := map[string]bool{}
		for name := range o.Fields() {
			have[name] = true
		}
		for _, f := range fields {
			if !have[f] {
				t.Errorf("%s has no field %s", typ, f)
			}
		}
	}
}

// TestPrepareRefuses: what cannot run is a 400 naming the reason.
func TestPrepareRefuses(t *testing.T) {
	e := engine(t)
	deep := "{ PatientList { " + strings.Repeat("link { other { resource { ... on Patient { ", 9) + "id" + strings.Repeat(" } } } }", 9) + " } }"
	frag := "fragment F on Patient { link { other { resource { ... on Patient { " + strings.Repeat("link { other { display } } ", 1) + "} } } } } " +
		"{ PatientList { ...F link { other { resource { ... on Patient { " + strings.Repeat("link { other { resource { ... on Patient { ", 5) + "...F" + strings.Repeat(" } } } }", 5) + " } } } } } }"
	for what, q := range map[string]string{
		"syntax":           `{ Patient(id: "x") { id `,
		"unknown field":    `{ Nope { id } }`,
		"mutation":         `mutation { X { id } }`,
		"subscription":     `subscription { PatientList { id } }`,
		"deep":             deep,
		"deep by fragment": frag,
		"blank":            "  ",
		"fragment cycle":   `fragment F on Patient { id ...F } { PatientList { ...F } }`,
		"mutual cycle":     `fragment A on Patient { ...B } fragment B on Patient { ...A } { PatientList { id } }`,
		"exponential":      exponentialFragments(30),
	} {
		_, err := prepare(e, limits.Default(), &Request{Query: q})
		if !fhir.IsCode(err, fhir.EInvalid) {
			t.Errorf("%s: %v", what, err)
		}
	}
	if _, err := prepare(e, limits.Default(), &Request{Query: `{ PatientList(name: "x") { id name { family } } }`}); err != nil {
		t.Errorf("a good query: %v", err)
	}
}

// exponentialFragments spreads each of n fragments twice in the next: 2^n
// selections once expanded.
func exponentialFragments(n int) string {
	var sb strings.Builder
	sb.WriteString("{ PatientList { ...F0 } } fragment F" + fmt.Sprint(n) + " on Patient { id } ")
	for i := n - 1; i >= 0; i-- {
		fmt.Fprintf(&sb, "fragment F%d on Patient { ...F%d a%d: name { ...N } ...F%d } ", i, i+1, i, i+1)
	}
	sb.WriteString("fragment N on HumanName { family }")
	return sb.String()
}

// FuzzPrepare: any query text is either refused with a 400 or valid against
// the schema within the depth limit; nothing panics.
func FuzzPrepare(f *testing.F) {
	f.Add(`{ Patient(id: "1") { id name { given family } } }`)
	f.Add(`query Q($n: String) { PatientList(name: $n, _count: 2) { id subject: managingOrganization { resource { ... on Organization { name } } } } }`)
	f.Add(`fragment F on Patient { id ...F } { PatientList { ...F } }`)
	f.Add(`{ __schema { types { name fields { name type { name ofType { name } } } } } }`)
	f.Fuzz(func(t *testing.T, q string) {
		e := engine(t)
		doc, err := prepare(e, limits.Default(), &Request{Query: q})
		if err != nil {
			if !fhir.IsCode(err, fhir.EInvalid) {
				t.Fatalf("%q: %v", q, err)
			}
			return
		}
		if checkDocument(doc, limits.Default()) != nil {
			t.Fatalf("%q prepared but too deep", q)
		}
	})
}

// BenchmarkSchema is the cost of generating the schema (once per process).
func BenchmarkSchema(b *testing.B) {
	set, err := definitions.Load()
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		if _, err := buildSchema(set, &resolver{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrepare is the parse, limit check and validation of the query
// MedplumClient.requestSchema sends.
func BenchmarkPrepare(b *testing.B) {
	e := engine(b)
	q := `{ StructureDefinitionList(_filter: "name eq Patient") { resourceType, name, kind, description, type, url,
		snapshot { element { id, path, definition, min, max, base { path, min, max }, contentReference,
		type { code, profile, targetProfile }, binding { strength, valueSet } } } }
		SearchParameterList(base: "Patient", _count: 100) { base, code, type, expression, target } }`
	for range b.N {
		if _, err := prepare(e, limits.Default(), &Request{Query: q}); err != nil {
			b.Fatal(err)
		}
	}
}
