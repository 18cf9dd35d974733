package access

import (
	"testing"

	"github.com/sandbot/sandbot/fhir"
)

func policy(entries ...map[string]any) fhir.Resource {
	var list []any
	for _, e := range entries {
		list = append(list, e)
	}
	return fhir.Resource{"resourceType": "AccessPolicy", "resource": list}
}

func TestCompileAndFilters(t *testing.T) {
	p, err := Compile([]Binding{{
		Policy: policy(
			map[string]any{"resourceType": "Patient", "criteria": "Patient?_id=%patient"},
			map[string]any{"resourceType": "Observation", "readonly": true, "criteria": "Observation?subject=%patient"},
			map[string]any{"resourceType": "Practitioner"},
		),
		Params: map[string]string{"patient": "Patient/p1", "profile": "Patient/p1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	g, ok := p.Filters("Patient", false)
	if !ok || len(g) != 1 || len(g[0]) != 1 || g[0][0].Param.Code != "_id" || g[0][0].Values[0].Code != "p1" {
		t.Fatalf("Patient filters: %+v %v", g, ok)
	}
	g, ok = p.Filters("Observation", false)
	if !ok || len(g) != 1 || g[0][0].Values[0].Raw != "Patient/p1" || g[0][0].Values[0].System != "Patient" || g[0][0].Values[0].Code != "p1" {
		t.Fatalf("Observation filters: %+v", g)
	}
	if _, ok := p.Filters("Observation", true); ok {
		t.Fatal("readonly entry allows writes")
	}
	if f, ok := p.Filters("Practitioner", true); !ok || f != nil {
		t.Fatal("entry without criteria must be unrestricted")
	}
	if p.Allows("Encounter") || p.CanWrite("Observation") || !p.CanWrite("Patient") {
		t.Fatal("Allows/CanWrite")
	}
	var none *Policy
	if !none.Allows("Anything") {
		t.Fatal("nil policy allows everything")
	}
}

func TestMissingParameterMatchesNothing(t *testing.T) {
	p, err := Compile([]Binding{{Policy: policy(map[string]any{"resourceType": "Patient", "criteria": "Patient?_id=%patient"})}})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := p.Filters("Patient", false)
	if len(g) != 1 || g[0][0].Values[0].Code == "" && g[0][0].Values[0].Raw == "" {
		t.Fatalf("a missing parameter must not widen the policy: %+v", g)
	}
}

func TestWildcardAndBadCriteria(t *testing.T) {
	p, _ := Compile([]Binding{{Policy: policy(map[string]any{"resourceType": "*"})}})
	if !p.Allows("Observation") {
		t.Fatal("wildcard")
	}
	if _, err := Compile([]Binding{{Policy: policy(map[string]any{"resourceType": "Patient", "criteria": "Observation?code=x"})}}); err == nil {
		t.Fatal("criteria of another type must fail")
	}
	if _, err := Compile([]Binding{{Policy: policy(map[string]any{"resourceType": "Patient", "criteria": "Patient?nope=x"})}}); err == nil {
		t.Fatal("unknown parameter must fail")
	}
}

func TestEntriesForOneTypeAreORed(t *testing.T) {
	p, err := Compile([]Binding{{
		Policy: policy(
			map[string]any{"resourceType": "Patient", "criteria": "Patient?_id=%patient"},
			map[string]any{"resourceType": "Patient", "readonly": true, "criteria": "Patient?gender=female"},
		),
		Params: map[string]string{"patient": "Patient/p1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := p.Filters("Patient", false); !ok || len(g) != 2 || g[1][0].Param.Code != "gender" {
		t.Fatalf("read groups: %+v", g)
	}
	if g, ok := p.Filters("Patient", true); !ok || len(g) != 1 || g[0][0].Param.Code != "_id" {
		t.Fatalf("write groups (readonly entry left out): %+v", g)
	}
}
