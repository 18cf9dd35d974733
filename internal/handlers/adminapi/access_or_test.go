package adminapi_test

import (
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// Two entries for one type are ORed: the member sees a patient that matches
// either criteria, and nothing else.
func TestAccessPolicyEntriesAreORed(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "AP-or")
		ca := as(t, s, a.Token)
		mine := expect(t, ca.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "gender": "male"}, ""), 201, "own")
		female := expect(t, ca.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "gender": "female"}, ""), 201, "female")
		other := expect(t, ca.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "gender": "male"}, ""), 201, "other")
		pol := expect(t, ca.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "Two rules",
			"resource": []any{
				map[string]any{"resourceType": "Patient", "criteria": "Patient?_id=%patient"},
				map[string]any{"resourceType": "Patient", "readonly": true, "criteria": "Patient?gender=female"},
			}}, ""), 201, "policy")
		inv := inviteBody("Patient", "Or", "Rule", "or@example.com")
		inv["password"] = "or-rule-password"
		inv["membership"] = map[string]any{
			"profile": map[string]any{"reference": "Patient/" + id(mine)},
			"access": []any{map[string]any{"policy": map[string]any{"reference": "AccessPolicy/" + id(pol)},
				"parameter": []any{map[string]any{"name": "patient", "valueReference": map[string]any{"reference": "Patient/" + id(mine)}}}}},
		}
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inv, ""), 200, "invite")
		pc := as(t, s, userToken(t, s, "or@example.com", "or-rule-password", a.ProjectID))

		expect(t, pc.Do("GET", "fhir/R4/Patient/"+id(mine), nil, ""), 200, "own record (first rule)")
		expect(t, pc.Do("GET", "fhir/R4/Patient/"+id(female), nil, ""), 200, "female patient (second rule)")
		expect(t, pc.Do("GET", "fhir/R4/Patient/"+id(other), nil, ""), 404, "neither rule")
		got := map[string]bool{}
		for _, e := range entries(t, pc.Do("GET", "fhir/R4/Patient", nil, "")) {
			got[id(e)] = true
		}
		if len(got) != 2 || !got[id(mine)] || !got[id(female)] {
			t.Errorf("search sees %v, want own and female", got)
		}
		// The second rule is read-only: the female patient cannot be written.
		upd := map[string]any{"resourceType": "Patient", "id": id(female), "gender": "female", "active": true}
		if r := pc.Do("PUT", "fhir/R4/Patient/"+id(female), upd, ""); r.Status != 404 && r.Status != 403 {
			t.Errorf("write through a read-only rule: %d %s", r.Status, r.Body)
		}
	})
}
