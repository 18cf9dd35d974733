package fhir

import (
	"strings"
	"testing"
)

func TestParseFilterExpr(t *testing.T) {
	for in, want := range map[string]string{
		"based-on eq Task/1 or focus eq Task/1 or subject eq Task/1": `((based-on = "Task/1" or focus = "Task/1") or subject = "Task/1")`,
		`name co "o'b" and not (gender eq male)`:                     `(name:contains = "o'b" and not (gender = "male"))`,
		`NAME eq x`:                                                  "",
		`birthdate ge 2000-01-01 AND active eq true`:                 `(birthdate = "ge2000-01-01" and active = "true")`,
		`(name sw a or name ew z) and email pr true`:                 `((name = "a" or name:endswith = "z") and email:missing = "false")`,
		`name ne "x y"`:                                              `not (name:iexact = "x y")`,
		`organization.name eq smith`:                                 `organization:Organization.name:iexact = "smith"`,
	} {
		e, err := ParseFilterExpr("Patient", in)
		if want == "" {
			if err == nil {
				t.Errorf("%q parsed as %s", in, e)
			}
			continue
		}
		if in == "based-on eq Task/1 or focus eq Task/1 or subject eq Task/1" {
			e, err = ParseFilterExpr("Task", in)
		}
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if got := e.String(); got != want {
			t.Errorf("%q = %s, want %s", in, got, want)
		}
	}
	for _, in := range []string{
		"", "name", "name eq", "name xx a", "name in a", "(name eq a", "name eq a)", "name eq a or", "not name",
		"name gt a", "gender co m", "birthdate sw 2000", "email pr maybe", "_id pr true", `name eq "unterminated`,
		strings.Repeat("(", 40) + "name eq a" + strings.Repeat(")", 40),
		strings.Repeat("name eq a or ", 101) + "name eq a",
	} {
		if _, err := ParseFilterExpr("Patient", in); !IsCode(err, EInvalid) {
			t.Errorf("%.50q: %v, want invalid", in, err)
		}
	}
}

func FuzzParseFilter(f *testing.F) {
	f.Add("Task", "based-on eq Task/1 or focus eq Task/1 or subject eq Task/1")
	f.Add("Patient", `(name co "a\"b" and not (gender eq male)) or birthdate ge 2000`)
	f.Add("Observation", "value-quantity gt 5.4|http://unitsofmeasure.org|mg and patient.name sw x")
	f.Fuzz(func(t *testing.T, typ, s string) {
		e, err := ParseFilterExpr(typ, s)
		if err != nil {
			if !IsCode(err, EInvalid) {
				t.Fatalf("error is not invalid: %v", err)
			}
			return
		}
		if e.size() > MaxFilters {
			t.Fatalf("%d comparisons", e.size())
		}
		_ = e.String()
		// A search holding it parses from its own link.
		req := &SearchRequest{ResourceType: typ, Count: DefaultCount, Expr: []*FilterExpr{e}, FilterText: []string{s}}
		if _, err := ParseSearch(typ, req.Query(0)); err != nil {
			t.Fatalf("link %q: %v", req.Query(0), err)
		}
	})
}
