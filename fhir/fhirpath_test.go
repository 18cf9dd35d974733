package fhir

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func mustResource(t testing.TB, js string) Resource {
	t.Helper()
	r, err := ParseResource([]byte(js))
	if err != nil {
		t.Fatalf("parse %s: %v", js, err)
	}
	return r
}

// show renders evaluation results compactly for comparison.
func show(items []any) string {
	var parts []string
	for _, it := range items {
		b, _ := json.Marshal(it)
		parts = append(parts, string(b))
	}
	return strings.Join(parts, " ")
}

func TestPathEvalSubset(t *testing.T) {
	obs := `{"resourceType":"Observation","subject":{"reference":"Patient/p1"},"performer":[{"reference":"Practitioner/d1"},{"reference":"Patient/p1"}],
		"valueQuantity":{"value":5.4,"unit":"mg"},"effectivePeriod":{"start":"2020-01-01"},
		"component":[{"valueCodeableConcept":{"text":"c1"}},{"valueQuantity":{"value":1}}],
		"extension":[{"url":"http://a","valueString":"A"},{"url":"http://b","valueString":"B"}]}`
	for _, tc := range []struct{ res, expr, want string }{
		{obs, "Observation.subject.where(resolve() is Patient)", `{"reference":"Patient/p1"}`},
		{obs, "Observation.subject.where(resolve() is Group)", ``},
		{obs, "Observation.performer.where(resolve() is Practitioner)", `{"reference":"Practitioner/d1"}`},
		{obs, "Observation.value.ofType(Quantity)", `{"unit":"mg","value":5.4}`},
		{obs, "(Observation.value as Quantity)", `{"unit":"mg","value":5.4}`},
		{obs, "Observation.value as CodeableConcept", ``},
		{obs, "Observation.effective", `{"start":"2020-01-01"}`},
		{obs, "Observation.component.value.ofType(CodeableConcept)", `{"text":"c1"}`},
		{obs, "(Observation.component.value.ofType(CodeableConcept)).text", `"c1"`},
		{obs, "AllergyIntolerance.patient | Observation.subject.where(resolve() is Patient)", `{"reference":"Patient/p1"}`},
		{obs, "Observation.extension('http://b').value", `"B"`},
		{obs, "Observation.extension.where(url = 'http://a').valueString", `"A"`},
		{obs, "Observation.performer[1]", `{"reference":"Patient/p1"}`},
		{obs, "Observation.performer.first()", `{"reference":"Practitioner/d1"}`},
		{obs, "Resource.id", ``},
		{`{"resourceType":"ProjectMembership","profile":{"reference":"ClientApplication/c"}}`, "ProjectMembership.profile.resolve().resourceType", `"ClientApplication"`},
		{`{"resourceType":"Patient","telecom":[{"system":"phone","value":"1"},{"system":"email","value":"a@b"}]}`, "Patient.telecom.where(system='email')", `{"system":"email","value":"a@b"}`},
		{`{"resourceType":"Patient","deceasedDateTime":"2020"}`, "Patient.deceased.exists() and Patient.deceased != false", `true`},
		{`{"resourceType":"Patient","deceasedBoolean":false}`, "Patient.deceased.exists() and Patient.deceased != false", `false`},
		{`{"resourceType":"Patient"}`, "Patient.deceased.exists() and Patient.deceased != false", `false`},
		{`{"resourceType":"ServiceRequest","priority":"urgent"}`, "iif(priority = 'stat', 50, iif(priority = 'urgent', 30, 10))", `30`},
		{`{"resourceType":"ServiceRequest"}`, "iif(priority = 'stat', 50, iif(priority = 'urgent', 30, 10))", `10`},
		{`{"resourceType":"Bundle","entry":[{"resource":{"resourceType":"Composition","id":"c"}},{"resource":{"resourceType":"Patient"}}]}`, "Bundle.entry[0].resource", `{"id":"c","resourceType":"Composition"}`},
		{`{"resourceType":"Patient","id":"x","meta":{"tag":[{"code":"t"}]}}`, "Resource.meta.tag", `{"code":"t"}`},
	} {
		e, err := ParsePath(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if got := show(e.Eval(mustResource(t, tc.res))); got != tc.want {
			t.Errorf("%s = %s, want %s", tc.expr, got, tc.want)
		}
	}
}

func TestParsePathRefuses(t *testing.T) {
	for _, expr := range []string{
		"Patient.name.select(given)", // function outside the subset
		"Patient.name.where(",
		"Patient.name.where(use = 'official'",
		"Patient.name.where(use = 'official)",
		"Patient.name +",
		"Patient..name",
		"Patient.name[x]",
		"Patient.name @ 1",
		"iif(a, b)",
		strings.Repeat("(", 100) + "Patient" + strings.Repeat(")", 100),
		strings.Repeat("Patient.name | ", 1000),
	} {
		if _, err := ParsePath(expr); err == nil {
			t.Errorf("ParsePath(%.60q) parsed", expr)
		}
	}
}

// TestDefinitionsCoverage: every SearchParameter of the table with an
// expression parses; the ones without are listed. The counts against the
// definitions themselves (composite and special ones included) are in
// fhir/definitions' TestSearchParameterCoverage.
func TestSkippedParamsHaveNoExpression(t *testing.T) {
	for _, s := range SearchParamsSkipped() {
		if s.Expression != "" {
			t.Errorf("%s [%s] %q is skipped: %s", s.Code, s.Base, s.Expression, s.Reason)
		}
	}
	if n := len(SearchParamsSkipped()); n > 5 {
		t.Errorf("%d parameters skipped", n)
	}
}

// TestExtractTable checks the values of parameters of every kind, through
// the generated table.
func TestExtractTable(t *testing.T) {
	values := func(js string) map[string][]string {
		out := map[string][]string{}
		for _, v := range Extract(mustResource(t, js)) {
			s := v.System + "|" + v.Value
			switch v.Kind {
			case DateIndex:
				s = v.Lo.Format("2006-01-02") + ".." + v.Hi.Format("2006-01-02")
			case NumberIndex:
				s = fmt.Sprintf("%g..%g %s|%s", v.Num, v.NumHi, v.System, v.Value)
			case StringIndex:
				s = v.Value
			}
			out[v.Code] = append(out[v.Code], s)
		}
		return out
	}
	pm := values(`{"resourceType":"ProjectMembership","profile":{"reference":"Practitioner/1"},"admin":true,
		"access":[{"policy":{"reference":"AccessPolicy/a"}}],"userName":"u1"}`)
	for code, want := range map[string]string{"profile-type": "|Practitioner", "profile": "Practitioner|1", "admin": "|true", "access-policy": "AccessPolicy|a", "user-name": "u1"} {
		if strings.Join(pm[code], ",") != want {
			t.Errorf("ProjectMembership %s = %v, want %s", code, pm[code], want)
		}
	}
	obs := values(`{"resourceType":"Observation","status":"final","subject":{"reference":"Patient/p1"},
		"code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},
		"valueQuantity":{"value":72,"unit":"beats/min","system":"http://unitsofmeasure.org","code":"/min"},
		"effectiveDateTime":"2021-03-04","referenceRange":[{"low":{"value":60},"high":{"value":100}}]}`)
	for code, want := range map[string]string{
		"patient":        "Patient|p1",
		"subject":        "Patient|p1",
		"code":           "http://loinc.org|8867-4",
		"status":         "|final",
		"value-quantity": "72..72 http://unitsofmeasure.org|/min",
		"date":           "2021-03-04..2021-03-05",
	} {
		if strings.Join(obs[code], ",") != want {
			t.Errorf("Observation %s = %v, want %s", code, obs[code], want)
		}
	}
	group := values(`{"resourceType":"Group","type":"person","actual":true,"characteristic":[{"code":{"text":"age"},"valueRange":{"low":{"value":18},"high":{"value":65,"unit":"a"}},"exclude":false}]}`)
	if got := strings.Join(group["characteristic-range"], ","); got != "18..65 |a" {
		t.Errorf("Group characteristic-range = %s", got)
	}
	if got := strings.Join(group["actual"], ","); got != "|true" {
		t.Errorf("Group actual = %s", got)
	}
}

func FuzzParsePath(f *testing.F) {
	for _, d := range searchParamDefs[:200] {
		f.Add(d.Expression)
	}
	f.Add("iif(priority = 'stat', 50, 10)")
	f.Add("Observation.extension('http://b').value[0].first()")
	sample := Resource{"resourceType": "Observation", "subject": map[string]any{"reference": "Patient/p"},
		"valueQuantity": map[string]any{"value": json.Number("1")}, "extension": []any{map[string]any{"url": "u", "valueString": "s"}}}
	f.Fuzz(func(t *testing.T, expr string) {
		e, err := ParsePath(expr)
		if err != nil {
			return
		}
		e.Eval(sample) // must not panic
	})
}
