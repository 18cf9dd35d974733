package fhirapi_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
)

type gqlAnswer struct {
	Data   map[string]any `json:"data"`
	Errors []struct {
		Message string `json:"message"`
	} `json:"errors"`
}

func gql(t *testing.T, c *servertest.Client, query string) (*servertest.Response, gqlAnswer) {
	t.Helper()
	r := c.Do("POST", "fhir/R4/$graphql", map[string]any{"query": query}, "application/json")
	var a gqlAnswer
	json.Unmarshal(r.Body, &a)
	return r, a
}

// TestGraphQL: the reference's schema shape through the real server: T(id:),
// TList(search parameters), field selection, Reference.resource resolved,
// the definitions MedplumClient.requestSchema loads, and the same
// authorization as REST (another project's resources are not found).
func TestGraphQL(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "graphql")
		other := s.NewProject(t, "graphql-other")
		pid := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"given": []any{"Grace"}, "family": "Graphley"}},
			"birthDate": "1906-12-09", "multipleBirthInteger": 2})["id"].(string)
		oid := c.Create(map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "g"},
			"subject": map[string]any{"reference": "Patient/" + pid}, "valueQuantity": map[string]any{"value": 1.5, "unit": "kg"}})["id"].(string)
		hidden := other.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Graphley"}}})["id"].(string)

		r, a := gql(t, c, `{ Patient(id: "`+pid+`") { resourceType id birthDate multipleBirthInteger name { given family } } }`)
		if r.Status != 200 || len(a.Errors) > 0 {
			t.Fatalf("read: %d %s", r.Status, r.Body)
		}
		p := a.Data["Patient"].(map[string]any)
		if p["id"] != pid || p["resourceType"] != "Patient" || p["birthDate"] != "1906-12-09" || p["multipleBirthInteger"] != float64(2) ||
			p["name"].([]any)[0].(map[string]any)["family"] != "Graphley" {
			t.Errorf("read: %s", r.Body)
		}
		if _, ok := p["gender"]; ok {
			t.Errorf("a field not selected was answered: %s", r.Body)
		}

		_, a = gql(t, c, `{ PatientList(family: "Graphley", _count: 10) { id } ObservationList(subject: "Patient/`+pid+`") {
			id valueQuantity { value unit } subject { reference resource { ... on Patient { id name { family } } } } } }`)
		if len(a.Errors) > 0 {
			t.Fatalf("search: %+v", a.Errors)
		}
		if list := a.Data["PatientList"].([]any); len(list) != 1 || list[0].(map[string]any)["id"] != pid {
			t.Errorf("PatientList sees another project's Patient or misses its own: %v", list)
		}
		obs := a.Data["ObservationList"].([]any)
		if len(obs) != 1 {
			t.Fatalf("ObservationList: %v", obs)
		}
		o := obs[0].(map[string]any)
		subj := o["subject"].(map[string]any)["resource"].(map[string]any)
		if o["id"] != oid || subj["id"] != pid || o["valueQuantity"].(map[string]any)["value"] != 1.5 {
			t.Errorf("reference not resolved: %v", o)
		}

		// Another project's Patient: null and an error, as REST's 404.
		_, a = gql(t, c, `{ Patient(id: "`+hidden+`") { id } }`)
		if a.Data["Patient"] != nil || len(a.Errors) != 1 || a.Errors[0].Message != "Not found" {
			t.Errorf("other project's Patient: %+v", a)
		}

		// What MedplumClient.requestSchema asks for.
		_, a = gql(t, c, `{ StructureDefinitionList(_filter: "name eq Patient") { resourceType, name, kind, type, url,
			snapshot { element { id, path, min, max, base { path, min, max }, contentReference, type { code, profile, targetProfile }, binding { strength, valueSet } } } }
			SearchParameterList(base: "Patient", _count: 100) { base, code, type, expression, target } }`)
		if len(a.Errors) > 0 {
			t.Fatalf("requestSchema query: %+v", a.Errors)
		}
		sds := a.Data["StructureDefinitionList"].([]any)
		if len(sds) != 1 || sds[0].(map[string]any)["name"] != "Patient" || len(sds[0].(map[string]any)["snapshot"].(map[string]any)["element"].([]any)) < 20 {
			t.Errorf("StructureDefinitionList: %.300v", sds)
		}
		if sps := a.Data["SearchParameterList"].([]any); len(sps) < 10 {
			t.Errorf("SearchParameterList: %d", len(sps))
		}

		// GET with the query in the URL.
		r = c.Do("GET", "fhir/R4/$graphql?query="+url.QueryEscape(`{ Patient(id: "`+pid+`") { id } }`), nil, "")
		if r.Status != 200 || !strings.Contains(string(r.Body), pid) {
			t.Errorf("GET: %d %s", r.Status, r.Body)
		}

		// Queries that cannot run: 400 OperationOutcomes.
		deep := "{ PatientList { " + strings.Repeat("link { other { resource { ... on Patient { ", 8) + "id" + strings.Repeat(" } } } }", 8) + " } }"
		for what, q := range map[string]string{
			"syntax":   `{ Patient(id: "x") { id `,
			"unknown":  `{ Nope { id } }`,
			"field":    `{ Patient(id: "x") { nope } }`,
			"mutation": `mutation { PatientCreate(res: {}) { id } }`,
			"empty":    ``,
			"deep":     deep,
		} {
			r, _ := gql(t, c, q)
			wantOutcome(t, what, r, 400, "invalid", "")
		}
		wantOutcome(t, "anonymous", s.Anonymous(t).Do("POST", "fhir/R4/$graphql", map[string]any{"query": "{ PatientList { id } }"}, "application/json"), 401, "", "")
		wantOutcome(t, "not JSON", c.Do("POST", "fhir/R4/$graphql", "{", "application/json"), 400, "invalid", "")
	})
}

// TestGraphQLReadLimit: a query stops reading at the configured number of
// reads and searches; what was read before stays in the answer.
func TestGraphQLReadLimit(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "graphql-limit")
		pid := c.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
		_, a := gql(t, c, `{ a: Patient(id: "`+pid+`") { id } b: Patient(id: "`+pid+`") { id } c: Patient(id: "`+pid+`") { id } }`)
		// The fields run in no set order: two are read, one is refused.
		read := 0
		for _, k := range []string{"a", "b", "c"} {
			if a.Data[k] != nil {
				read++
			}
		}
		if read != 2 || len(a.Errors) != 1 || a.Errors[0].Message != "GraphQL query reads too many resources (limit 2 reads and searches)" {
			t.Errorf("read limit 2: %+v", a)
		}
	}, func(c *server.Config) { c.Limits.GraphQLReads = 2 })
}
