package fhirapi_test

import (
	"sort"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// TestDefinitionsReadOnly: the FHIR definitions are served to any
// authenticated caller (a plain member too), searched like stored
// resources, expanded, and never written. They do not depend on the store,
// so one backend is enough.
func TestDefinitionsReadOnly(t *testing.T) {
	s := servertest.Start(t, storetest.Backends(t)[0])
	adminClient := s.NewProject(t, "defs")
	member := s.NewMember(t, adminClient.ProjectID, "Plain", false)
	for _, c := range []*servertest.Client{adminClient, member} {
		r := c.Do("GET", "fhir/R4/StructureDefinition/Patient", nil, "")
		if r.Status != 200 || r.JSON()["url"] != "http://hl7.org/fhir/StructureDefinition/Patient" || r.Header.Get("ETag") == "" {
			t.Fatalf("read: %d %.200s", r.Status, r.Body)
		}
		r = c.Do("GET", "fhir/R4/SearchParameter?base=ProjectMembership&code=profile-type", nil, "")
		if es := entries(t, r); r.Status != 200 || len(es) != 1 || servertest.Field(es[0], "resource", "expression") != "ProjectMembership.profile.resolve().resourceType" {
			t.Errorf("search: %d %.300s", r.Status, r.Body)
		}
		r = c.Do("GET", "fhir/R4/StructureDefinition?name:exact=ProjectMembership&_total=accurate", nil, "")
		if r.Status != 200 || r.JSON()["total"] != float64(1) {
			t.Errorf("search by name: %d %.300s", r.Status, r.Body)
		}
		r = c.Do("GET", "fhir/R4/ValueSet/$expand?url=http%3A%2F%2Fhl7.org%2Ffhir%2FValueSet%2Fadministrative-gender&filter=mal&count=1", nil, "")
		contains, _ := servertest.Field(r.JSON(), "expansion", "contains").([]any)
		if r.Status != 200 || len(contains) != 1 || servertest.Field(r.JSON(), "expansion", "total") != float64(2) {
			t.Errorf("$expand: %d %.300s", r.Status, r.Body)
		}
	}
	c := adminClient
	wantOutcome(t, "unknown id", c.Do("GET", "fhir/R4/StructureDefinition/Nope", nil, ""), 404, "not-found", "")
	wantOutcome(t, "other version", c.Do("GET", "fhir/R4/StructureDefinition/Patient/_history/1", nil, ""), 404, "not-found", "")
	wantOutcome(t, "expand without url", c.Do("GET", "fhir/R4/ValueSet/$expand", nil, ""), 400, "invalid", "Missing url")
	wantOutcome(t, "expand unknown", c.Do("GET", "fhir/R4/ValueSet/$expand?url=urn:none", nil, ""), 400, "invalid", "ValueSet not found: urn:none")
	wantOutcome(t, "expand unknown id", c.Do("GET", "fhir/R4/ValueSet/nope/$expand", nil, ""), 404, "not-found", "")
	wantOutcome(t, "expand bad count", c.Do("GET", "fhir/R4/ValueSet/$expand?url=urn:none&count=-1", nil, ""), 400, "invalid", "Invalid count: -1")
	wantOutcome(t, "bad search", c.Do("GET", "fhir/R4/ValueSet?nope=1", nil, ""), 400, "invalid", "Unknown search parameter: nope")
	body := map[string]any{"resourceType": "ValueSet", "status": "draft", "url": "urn:mine"}
	for _, w := range []struct{ method, path string }{
		{"POST", "fhir/R4/StructureDefinition"},
		{"PUT", "fhir/R4/ValueSet/administrative-gender"},
		{"PATCH", "fhir/R4/ValueSet/administrative-gender"},
		{"DELETE", "fhir/R4/ValueSet/administrative-gender"},
		{"POST", "fhir/R4/SearchParameter"},
		{"DELETE", "fhir/R4/StructureDefinition/Patient"},
	} {
		typ := strings.Split(w.path, "/")[2]
		wantOutcome(t, w.method+" "+w.path, c.Do(w.method, w.path, body, "application/fhir+json"), 403, "forbidden",
			definitions.ReadOnlyMessage(typ))
	}
	sa := s.SuperAdmin(t)
	wantOutcome(t, "super admin write", sa.Do("PUT", "fhir/R4/CodeSystem/administrative-gender", body, "application/fhir+json"), 403, "forbidden", "")
	// The CapabilityStatement says so.
	r := c.Do("GET", "fhir/R4/metadata", nil, "")
	if !strings.Contains(string(r.Body), `"definition":"ValueSet/$expand"`) {
		t.Errorf("metadata lacks $expand")
	}
}

// TestProjectTerminology: a project's admins write its own CodeSystems and
// ValueSets beside the read-only base definitions; its members read,
// search and expand them with the base ones; other projects see none.
func TestProjectTerminology(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		admin := s.NewProject(t, "terminology")
		member := s.NewMember(t, admin.ProjectID, "Plain", false)
		cs := map[string]any{"resourceType": "CodeSystem", "status": "active", "content": "complete", "url": "urn:sandbot:cs:colors",
			"concept": []any{map[string]any{"code": "warm", "display": "Warm", "concept": []any{
				map[string]any{"code": "red", "display": "Red"}, map[string]any{"code": "orange", "display": "Orange"}}},
				map[string]any{"code": "blue", "display": "Blue"}}}
		vs := map[string]any{"resourceType": "ValueSet", "status": "active", "url": "urn:sandbot:vs:warm-and-gender",
			"compose": map[string]any{"include": []any{
				map[string]any{"system": "urn:sandbot:cs:colors", "filter": []any{map[string]any{"property": "concept", "op": "descendent-of", "value": "warm"}}},
				map[string]any{"valueSet": []any{"http://hl7.org/fhir/ValueSet/administrative-gender"}},
			}}}
		if r := member.Do("POST", "fhir/R4/CodeSystem", cs, "application/fhir+json"); r.Status != 403 {
			t.Fatalf("a member wrote a CodeSystem: %d %s", r.Status, r.Body)
		}
		for _, res := range []map[string]any{cs, vs} {
			if r := admin.Do("POST", "fhir/R4/"+res["resourceType"].(string), res, "application/fhir+json"); r.Status != 201 {
				t.Fatalf("admin create: %d %s", r.Status, r.Body)
			}
		}
		r := member.Do("GET", "fhir/R4/ValueSet/$expand?url=urn:sandbot:vs:warm-and-gender&count=100", nil, "")
		if r.Status != 200 {
			t.Fatalf("expand: %d %s", r.Status, r.Body)
		}
		var codes []string
		for _, c := range servertest.Field(r.JSON(), "expansion", "contains").([]any) {
			codes = append(codes, servertest.Field(c, "code").(string))
		}
		sort.Strings(codes)
		if strings.Join(codes, ",") != "female,male,orange,other,red,unknown" {
			t.Errorf("expansion %v", codes)
		}
		if r := member.Do("GET", "fhir/R4/ValueSet/$expand?url=urn:sandbot:vs:warm-and-gender&filter=ora", nil, "").JSON(); servertest.Field(r, "expansion", "total") != float64(1) {
			t.Errorf("filtered expansion %s", mustJSON(r))
		}
		// Search finds the project's and the base definitions.
		found := member.Do("GET", "fhir/R4/ValueSet?url=urn:sandbot:vs:warm-and-gender", nil, "").JSON()
		if entries, _ := found["entry"].([]any); len(entries) != 1 {
			t.Errorf("search of the project's ValueSet: %s", mustJSON(found))
		}
		base := member.Do("GET", "fhir/R4/ValueSet?url=http://hl7.org/fhir/ValueSet/administrative-gender", nil, "").JSON()
		if entries, _ := base["entry"].([]any); len(entries) != 1 {
			t.Errorf("search of a base ValueSet: %s", mustJSON(base))
		}
		// Another project sees none of it.
		other := s.NewProject(t, "other")
		if r := other.Do("GET", "fhir/R4/ValueSet/$expand?url=urn:sandbot:vs:warm-and-gender", nil, ""); r.Status != 400 {
			t.Errorf("another project expands it: %d %s", r.Status, r.Body)
		}
		if entries, _ := other.Do("GET", "fhir/R4/CodeSystem?url=urn:sandbot:cs:colors", nil, "").JSON()["entry"].([]any); len(entries) != 0 {
			t.Errorf("another project finds the CodeSystem")
		}
	})
}
