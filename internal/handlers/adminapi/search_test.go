package adminapi_test

import (
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

func TestMemberSearch(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "S")
		other := s.NewProject(t, "Other")
		ca := as(t, s, a.Token)
		inv := "admin/projects/" + a.ProjectID + "/invite"
		for i, rt := range []string{"Patient", "Patient", "Patient", "Practitioner", "Practitioner", "RelatedPerson"} {
			b := inviteBody(rt, "F", "L", strings.ToLower(rt)+string(rune('a'+i))+"@example.com")
			if rt == "RelatedPerson" {
				pat := expect(t, ca.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient"}, ""), 201, "patient")
				b["patient"] = map[string]any{"reference": "Patient/" + id(pat)}
			}
			expect(t, ca.Do("POST", inv, b, ""), 200, "invite "+rt)
		}
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/bot", map[string]any{"name": "B"}, ""), 201, "bot")
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/client", map[string]any{"name": "C"}, ""), 201, "client")
		// Noise in another project.
		expect(t, as(t, s, other.Token).Do("POST", "admin/projects/"+other.ProjectID+"/invite", inviteBody("Patient", "O", "P", "otherpat@example.com"), ""), 200, "other")

		count := func(q string) int {
			t.Helper()
			return len(entries(t, ca.Do("GET", "fhir/R4/ProjectMembership"+q, nil, "")))
		}
		// The project's admin client (NewProject) + bot + client = 3 non-humans; 6 humans.
		if n := count(""); n != 9 {
			t.Errorf("all members: %d, want 9", n)
		}
		if n := count("?profile-type=Patient"); n != 3 {
			t.Errorf("patients: %d", n)
		}
		if n := count("?profile-type=Practitioner"); n != 2 {
			t.Errorf("practitioners: %d", n)
		}
		if n := count("?profile-type:not=ClientApplication,Bot"); n != 6 {
			t.Errorf("humans: %d", n)
		}
		// As @medplum/core sends it (URLSearchParams percent-encodes ':' and ',').
		if n := count("?profile-type%3Anot=ClientApplication%2CBot"); n != 6 {
			t.Errorf("humans (encoded): %d", n)
		}
		// Paging: 2 per page with next links until the end.
		seen := map[string]bool{}
		next := s.URL + "fhir/R4/ProjectMembership?profile-type%3Anot=ClientApplication%2CBot&_count=2"
		for pages := 0; next != ""; pages++ {
			if pages > 5 {
				t.Fatal("too many pages")
			}
			r := ca.Do("GET", strings.TrimPrefix(next, s.URL), nil, "")
			b := expect(t, r, 200, "page")
			es, _ := b["entry"].([]any)
			for _, e := range es {
				seen[id(e.(map[string]any)["resource"].(map[string]any))] = true
			}
			next = ""
			links, _ := b["link"].([]any)
			for _, l := range links {
				lm := l.(map[string]any)
				if lm["relation"] == "next" {
					next = lm["url"].(string)
				}
			}
		}
		if len(seen) != 6 {
			t.Errorf("paged humans: %d", len(seen))
		}
		expect(t, ca.Do("GET", "fhir/R4/ProjectMembership?profile-type=Patient&_total=accurate", nil, ""), 200, "total")
		expect(t, ca.Do("GET", "fhir/R4/ProjectMembership?bogus=1", nil, ""), 400, "unknown parameter")
	})
}
