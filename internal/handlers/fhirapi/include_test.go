package fhirapi_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// entriesByMode lists a searchset's entries as "mode Type/id", sorted.
func entriesByMode(b map[string]any) []string {
	var out []string
	entries, _ := b["entry"].([]any)
	for _, e := range entries {
		mode, _ := servertest.Field(e, "search", "mode").(string)
		typ, _ := servertest.Field(e, "resource", "resourceType").(string)
		id, _ := servertest.Field(e, "resource", "id").(string)
		out = append(out, mode+" "+typ+"/"+id)
	}
	sort.Strings(out)
	return out
}

// wantEntries searches as c and checks the page's entries ("mode
// Type/id", in any order).
func wantEntries(t *testing.T, c *servertest.Client, name, query string, expect ...string) {
	t.Helper()
	r := c.Do("GET", "fhir/R4/"+query, nil, "")
	if r.Status != 200 {
		t.Fatalf("%s: %d %s", name, r.Status, r.Body)
	}
	sort.Strings(expect)
	if got := entriesByMode(r.JSON()); strings.Join(got, "|") != strings.Join(expect, "|") {
		t.Errorf("%s: entries %q, want %q", name, got, expect)
	}
}

// TestSearchInclude: _include, _revinclude and :iterate add the resources
// they name as entries of mode include, each once, through the caller's
// access; the links keep them; * and a parameter that is not a reference
// are 400.
func TestSearchInclude(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "include")
		org := c.Create(map[string]any{"resourceType": "Organization", "name": "Clinic"})["id"].(string)
		pat := c.Create(map[string]any{"resourceType": "Patient", "managingOrganization": map[string]any{"reference": "Organization/" + org}})["id"].(string)
		var obs []string
		for i := range 2 {
			obs = append(obs, c.Create(map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": fmt.Sprint("o", i)},
				"subject": map[string]any{"reference": "Patient/" + pat}})["id"].(string))
		}
		enc := c.Create(map[string]any{"resourceType": "Encounter", "status": "finished", "class": map[string]any{"code": "AMB"},
			"subject": map[string]any{"reference": "Patient/" + pat}})["id"].(string)
		want := func(name, query string, expect ...string) { t.Helper(); wantEntries(t, c, name, query, expect...) }
		want("include", "Observation?_include=Observation:subject",
			"match Observation/"+obs[0], "match Observation/"+obs[1], "include Patient/"+pat)
		want("include with a target type that does not match", "Observation?_include=Observation:subject:Group",
			"match Observation/"+obs[0], "match Observation/"+obs[1])
		want("revinclude", "Patient?_id="+pat+"&_revinclude=Observation:subject&_revinclude=Encounter:subject",
			"match Patient/"+pat, "include Observation/"+obs[0], "include Observation/"+obs[1], "include Encounter/"+enc)
		want("iterate", "Observation?_id="+obs[0]+"&_include=Observation:subject&_include:iterate=Patient:organization",
			"match Observation/"+obs[0], "include Patient/"+pat, "include Organization/"+org)
		want("without iterate, the second include does not follow included resources",
			"Observation?_id="+obs[0]+"&_include=Observation:subject&_include=Patient:organization",
			"match Observation/"+obs[0], "include Patient/"+pat)
		want("revinclude iterate", "Organization?_revinclude=Patient:organization&_revinclude:iterate=Observation:subject",
			"match Organization/"+org, "include Patient/"+pat, "include Observation/"+obs[0], "include Observation/"+obs[1])

		r := c.Do("GET", "fhir/R4/Observation?_include=Observation:subject&_count=1", nil, "").JSON()
		for _, l := range r["link"].([]any) {
			if u, _ := servertest.Field(l, "url").(string); !strings.Contains(u, "_include=Observation%3Asubject") {
				t.Errorf("link %s lost the _include", u)
			}
		}
		for _, bad := range []string{"_include=*", "_include=Observation:*", "_include=Observation:code", "_include=Nothing:subject",
			"_revinclude=Observation", "_include:bogus=Observation:subject"} {
			if r := c.Do("GET", "fhir/R4/Observation?"+bad, nil, ""); r.Status != 400 {
				t.Errorf("%s: %d %s", bad, r.Status, r.Body)
			}
		}

		// A member who may read Observations but not Patients gets the
		// Observations and nothing included.
		m := memberWithPolicy(t, s, c, "Observation")
		r = m.Do("GET", "fhir/R4/Observation?_include=Observation:subject", nil, "").JSON()
		if got := entriesByMode(r); len(got) != 2 || strings.Contains(strings.Join(got, " "), "include") {
			t.Errorf("a member without Patients: %q", got)
		}
		// Another project's resources are never included.
		other := s.NewProject(t, "other")
		r = other.Do("GET", "fhir/R4/Patient?_revinclude=Observation:subject", nil, "").JSON()
		if got := entriesByMode(r); len(got) != 0 {
			t.Errorf("another project sees %q", got)
		}
	})
}

// TestSearchHas: _has finds the resources that matching resources of
// another type refer to, nested, as the caller may see them.
func TestSearchHas(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "has")
		var pats []string
		for i := range 3 {
			pats = append(pats, c.Create(map[string]any{"resourceType": "Patient", "gender": "female", "name": []any{map[string]any{"family": fmt.Sprint("p", i)}}})["id"].(string))
		}
		obs := func(pat, code string) string {
			return c.Create(map[string]any{"resourceType": "Observation", "status": "final",
				"code":    map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": code}}},
				"subject": map[string]any{"reference": "Patient/" + pat}})["id"].(string)
		}
		o0 := obs(pats[0], "8302-2")
		obs(pats[1], "8302-2")
		obs(pats[2], "29463-7")
		c.Create(map[string]any{"resourceType": "DiagnosticReport", "status": "final", "code": map[string]any{"text": "r"},
			"result": []any{map[string]any{"reference": "Observation/" + o0}}})
		want := func(name, query string, expect ...string) { t.Helper(); wantEntries(t, c, name, query, expect...) }
		want("has", "Patient?_has:Observation:subject:code=8302-2", "match Patient/"+pats[0], "match Patient/"+pats[1])
		want("has with another filter", "Patient?name=p1&_has:Observation:subject:code=8302-2", "match Patient/"+pats[1])
		want("has that matches nothing", "Patient?_has:Observation:subject:code=0000-0")
		want("nested", "Patient?_has:Observation:subject:_has:DiagnosticReport:result:status=final", "match Patient/"+pats[0])
		for _, bad := range []string{"_has:Observation:code:x=1", "_has:Nothing:subject:code=1", "_has:Observation:subject:nope=1", "_has:Observation=1"} {
			if r := c.Do("GET", "fhir/R4/Patient?"+bad, nil, ""); r.Status != 400 {
				t.Errorf("%s: %d %s", bad, r.Status, r.Body)
			}
		}
		// A member who may not read Observations finds nothing through them.
		m := memberWithPolicy(t, s, c, "Patient")
		if got := entriesByMode(m.Do("GET", "fhir/R4/Patient?_has:Observation:subject:code=8302-2", nil, "").JSON()); len(got) != 0 {
			t.Errorf("a member without Observations found %q", got)
		}
	})
}

// TestSearchText: :text finds a coded element by a word of its text (a
// CodeableConcept's text, a coding's display) and a string by a part of
// it; a code equal to such a word is not found by a plain search.
func TestSearchText(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "text")
		hr := c.Create(map[string]any{"resourceType": "Observation", "status": "final",
			"code": map[string]any{"text": "Heart rate", "coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}}}})["id"].(string)
		bw := c.Create(map[string]any{"resourceType": "Observation", "status": "final",
			"code": map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "29463-7", "display": "Body Weight"}}}})["id"].(string)
		pat := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Lovelace", "given": []any{"Ada"}}}})["id"].(string)
		want := func(name, query string, expect ...string) { t.Helper(); wantEntries(t, c, name, query, expect...) }
		want("text", "Observation?code:text=heart", "match Observation/"+hr)
		want("display, a later word", "Observation?code:text=weig", "match Observation/"+bw)
		want("no match", "Observation?code:text=rate%20heart")
		want("a plain search does not find text", "Observation?code=heart%20rate")
		want("the code still found", "Observation?code=8867-4", "match Observation/"+hr)
		want("string :text", "Patient?name:text=ovela", "match Patient/"+pat)
		if r := c.Do("GET", "fhir/R4/Observation?date:text=2020", nil, ""); r.Status != 400 {
			t.Errorf(":text on a date: %d", r.Status)
		}
	})
}
