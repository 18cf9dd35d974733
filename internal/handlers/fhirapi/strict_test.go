package fhirapi_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store"
)

// TestStrictModeBindingsAndProfiles: in a project in strictMode (the
// default of a new project), a code outside the ValueSet of a required
// binding and a meta.profile the server does not have are 400s naming the
// element, on create, update, in a transaction and through $validate;
// without strictMode the same writes pass. A reference to a type the
// element does not allow is a 400 in either mode.
func TestStrictModeBindingsAndProfiles(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		strict := s.NewProject(t, "strict")
		lax := s.NewProject(t, "lax")
		if _, err := s.Store.Update(context.Background(), store.AllProjects, "Project", lax.ProjectID, store.Write{},
			func(cur fhir.Resource) (fhir.Resource, error) { cur["strictMode"] = false; return cur, nil }); err != nil {
			t.Fatal(err)
		}
		// Each project's Patient, Practitioner and Organization, for the
		// references ({P}, {PR}, {O} in the bodies), which must exist.
		refs := map[*servertest.Client]*strings.Replacer{}
		for _, c := range []*servertest.Client{strict, lax} {
			p := c.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
			pr := c.Create(map[string]any{"resourceType": "Practitioner"})["id"].(string)
			o := c.Create(map[string]any{"resourceType": "Organization"})["id"].(string)
			refs[c] = strings.NewReplacer("{P}", p, "{PR}", pr, "{O}", o)
		}
		post := func(c *servertest.Client, path, body string) *servertest.Response {
			return c.Do("POST", path, refs[c].Replace(body), "")
		}
		cases := []struct{ name, body, expr, text string }{
			{"code", `{"resourceType":"Patient","gender":"robot"}`, "Patient.gender",
				`Value "robot" is not in the required value set http://hl7.org/fhir/ValueSet/administrative-gender`},
			{"code in a backbone", `{"resourceType":"Patient","contact":[{"gender":"female"},{"gender":"x"}]}`, "Patient.contact[1].gender", "required value set"},
			{"CodeableConcept", `{"resourceType":"Condition","subject":{"reference":"Patient/{P}"},
				"clinicalStatus":{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/condition-clinical","code":"gone"}]}}`,
				"Condition.clinicalStatus", "condition-clinical"},
			{"unknown profile", `{"resourceType":"Patient","meta":{"profile":["http://example.org/StructureDefinition/my-patient"]}}`,
				"Patient.meta.profile[0]", "Unknown profile http://example.org/StructureDefinition/my-patient"},
			{"another type's profile", `{"resourceType":"Patient","meta":{"profile":["http://hl7.org/fhir/StructureDefinition/Observation"]}}`,
				"Patient.meta.profile[0]", "is a profile of Observation"},
		}
		for _, tc := range cases {
			r := post(strict, "fhir/R4/"+typeOf(t, tc.body), tc.body)
			if r.Status != 400 || !hasIssue(issuesOf(t, r), tc.expr, tc.text) {
				t.Errorf("strict %s: %d %s", tc.name, r.Status, r.Body)
			}
			v := post(strict, "fhir/R4/"+typeOf(t, tc.body)+"/$validate", tc.body)
			if v.Status != 200 || !hasIssue(issuesOf(t, v), tc.expr, tc.text) {
				t.Errorf("strict $validate %s: %d %s", tc.name, v.Status, v.Body)
			}
			if r := post(lax, "fhir/R4/"+typeOf(t, tc.body), tc.body); r.Status != 201 {
				t.Errorf("without strictMode %s: %d %s", tc.name, r.Status, r.Body)
			}
		}
		// What is in the ValueSets, and the type's own profile, pass.
		for _, body := range []string{
			`{"resourceType":"Patient","gender":"female","meta":{"profile":["http://hl7.org/fhir/StructureDefinition/Patient"]}}`,
			`{"resourceType":"Condition","subject":{"reference":"Patient/{P}"},"clinicalStatus":{"coding":[
				{"system":"http://snomed.info/sct","code":"55561003"},
				{"system":"http://terminology.hl7.org/CodeSystem/condition-clinical","code":"active"}]}}`,
			`{"resourceType":"Condition","subject":{"reference":"Patient/{P}"},"clinicalStatus":{"text":"active"}}`,
			// A ValueSet the definitions cannot expand (mimetypes: BCP 13) is not checked.
			`{"resourceType":"Binary","contentType":"application/x-made-up"}`,
		} {
			if r := post(strict, "fhir/R4/"+typeOf(t, body), body); r.Status != 201 {
				t.Errorf("strict, valid %s: %d %s", body, r.Status, r.Body)
			}
		}
		// $validate's profile parameter is checked as a meta.profile in
		// strict mode, in the query or in a Parameters body.
		const unknown = "http://example.org/StructureDefinition/my-patient"
		params := map[string]any{"resourceType": "Parameters", "parameter": []any{
			map[string]any{"name": "resource", "resource": map[string]any{"resourceType": "Patient"}},
			map[string]any{"name": "profile", "valueCanonical": unknown}}}
		for name, r := range map[string]*servertest.Response{
			"query":      strict.Do("POST", "fhir/R4/Patient/$validate?profile="+unknown, `{"resourceType":"Patient"}`, ""),
			"Parameters": strict.Do("POST", "fhir/R4/Patient/$validate", params, ""),
		} {
			if r.Status != 200 || !hasIssue(issuesOf(t, r), "profile", "Unknown profile "+unknown) {
				t.Errorf("strict $validate with a profile in the %s: %d %s", name, r.Status, r.Body)
			}
		}
		if r := strict.Do("POST", "fhir/R4/Patient/$validate?profile=http://hl7.org/fhir/StructureDefinition/Patient", `{"resourceType":"Patient"}`, ""); r.Status != 200 || len(issuesOf(t, r)) != 1 || issuesOf(t, r)[0].Severity != "information" {
			t.Errorf("strict $validate with the type's profile: %d %s", r.Status, r.Body)
		}
		if r := lax.Do("POST", "fhir/R4/Patient/$validate", params, ""); r.Status != 200 || issuesOf(t, r)[0].Severity != "information" {
			t.Errorf("lax $validate with a profile: %d %s", r.Status, r.Body)
		}

		// An update and a transaction entry are checked the same way.
		id := strict.Create(map[string]any{"resourceType": "Patient", "gender": "male"})["id"].(string)
		r := strict.Do("PUT", "fhir/R4/Patient/"+id, map[string]any{"resourceType": "Patient", "id": id, "gender": "robot"}, "")
		if r.Status != 400 || !hasIssue(issuesOf(t, r), "Patient.gender", "required value set") {
			t.Errorf("strict update: %d %s", r.Status, r.Body)
		}
		bundle := map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"resource": map[string]any{"resourceType": "Patient", "gender": "female"}, "request": map[string]any{"method": "POST", "url": "Patient"}},
			map[string]any{"resource": map[string]any{"resourceType": "Observation", "status": "done", "code": map[string]any{"text": "x"}},
				"request": map[string]any{"method": "POST", "url": "Observation"}},
		}}
		if r := strict.Do("POST", "fhir/R4", bundle, ""); r.Status != 400 {
			t.Errorf("strict transaction: %d %s", r.Status, r.Body)
		}
		if r := lax.Do("POST", "fhir/R4", bundle, ""); r.Status != 200 {
			t.Errorf("lax transaction: %d %s", r.Status, r.Body)
		}

		// Reference target types, in both modes.
		for _, c := range []*servertest.Client{strict, lax} {
			r := post(c, "fhir/R4/Patient", `{"resourceType":"Patient","generalPractitioner":[{"reference":"Observation/x"}]}`)
			if r.Status != 400 || !hasIssue(issuesOf(t, r), "Patient.generalPractitioner[0].reference", "Invalid reference type Observation") {
				t.Errorf("reference to an Observation: %d %s", r.Status, r.Body)
			}
			for _, ok := range []string{`"Practitioner/{PR}"`, `"Organization/{O}"`, `"#c"`, `"https://example.org/fhir/Observation/x"`} {
				body := `{"resourceType":"Patient","generalPractitioner":[{"reference":` + ok + `}]`
				if ok == `"#c"` {
					body += `,"contained":[{"resourceType":"Practitioner","id":"c"}]`
				}
				if r := post(c, "fhir/R4/Patient", body+`}`); r.Status != 201 {
					t.Errorf("reference %s: %d %s", ok, r.Status, r.Body)
				}
			}
		}
	})
}

func typeOf(t *testing.T, body string) string {
	t.Helper()
	r, err := fhir.ParseResource([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r.Type()
}
