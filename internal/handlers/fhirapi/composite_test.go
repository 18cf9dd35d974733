package fhirapi_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestSearchComposite: composite parameters through HTTP pair their parts
// within one element (one Observation.component), keep their value in the
// Bundle links, and a malformed value is a 400 naming the parameter.
func TestSearchComposite(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "composite")
		bp := func(sys, dia float64) string {
			comp := func(code string, v float64) map[string]any {
				return map[string]any{"code": map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": code}}},
					"valueQuantity": map[string]any{"value": v, "unit": "mmHg", "system": "http://unitsofmeasure.org", "code": "mm[Hg]"}}
			}
			return c.Create(map[string]any{"resourceType": "Observation", "status": "final",
				"code":      map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "85354-9"}}},
				"component": []any{comp("8480-6", sys), comp("8462-4", dia)}})["id"].(string)
		}
		high, low := bp(150, 95), bp(95, 150)
		q := func(v string) string { return "Observation?component-code-value-quantity=" + url.QueryEscape(v) }
		wantEntries(t, c, "systolic over 100", q("http://loinc.org|8480-6$gt100"), "match Observation/"+high)
		wantEntries(t, c, "diastolic over 100", q("http://loinc.org|8462-4$gt100"), "match Observation/"+low)
		wantEntries(t, c, "either", q("8480-6$gt140,8462-4$gt140"), "match Observation/"+high, "match Observation/"+low)
		wantEntries(t, c, "not the Observation's own code", "Observation?code-value-quantity="+url.QueryEscape("85354-9$gt100"))

		r := c.Do("GET", "fhir/R4/"+q("8480-6$gt100")+"&_count=1", nil, "").JSON()
		for _, l := range r["link"].([]any) {
			if u, _ := servertest.Field(l, "url").(string); !strings.Contains(u, "component-code-value-quantity=8480-6%24gt100") {
				t.Errorf("link %s lost the composite", u)
			}
		}
		for _, bad := range []string{"8480-6", "8480-6$gt100$x", "8480-6$high"} {
			resp := c.Do("GET", "fhir/R4/"+q(bad), nil, "")
			if resp.Status != 400 || !strings.Contains(string(resp.Body), "component-code-value-quantity") {
				t.Errorf("%s: %d %s", bad, resp.Status, resp.Body)
			}
		}
	})
}
