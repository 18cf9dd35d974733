package adminapi_test

import (
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

func TestAccessPolicy(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "AP")
		ca := as(t, s, a.Token)
		mine := expect(t, ca.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Mine"}}}, ""), 201, "patient A")
		theirs := expect(t, ca.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Theirs"}}}, ""), 201, "patient B")
		obsMine := expect(t, ca.Do("POST", "fhir/R4/Observation", map[string]any{"resourceType": "Observation", "status": "final",
			"code": map[string]any{"text": "x"}, "subject": map[string]any{"reference": "Patient/" + id(mine)}}, ""), 201, "obs A")
		obsTheirs := expect(t, ca.Do("POST", "fhir/R4/Observation", map[string]any{"resourceType": "Observation", "status": "final",
			"code": map[string]any{"text": "x"}, "subject": map[string]any{"reference": "Patient/" + id(theirs)}}, ""), 201, "obs B")
		pol := expect(t, ca.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "Own record",
			"resource": []any{
				map[string]any{"resourceType": "Patient", "criteria": "Patient?_id=%patient"},
				map[string]any{"resourceType": "Observation", "readonly": true, "criteria": "Observation?subject=%patient"},
			}}, ""), 201, "policy")
		inv := inviteBody("Patient", "Own", "Record", "own@example.com")
		inv["password"] = "own-record-pw"
		inv["membership"] = map[string]any{
			"profile": map[string]any{"reference": "Patient/" + id(mine)},
			"access": []any{map[string]any{"policy": map[string]any{"reference": "AccessPolicy/" + id(pol)},
				"parameter": []any{map[string]any{"name": "patient", "valueReference": map[string]any{"reference": "Patient/" + id(mine)}}}}},
		}
		m := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inv, ""), 200, "invite")
		if ref(m, "profile") != "Patient/"+id(mine) {
			t.Fatalf("membership.profile: %v", m)
		}
		pc := as(t, s, userToken(t, s, "own@example.com", "own-record-pw", a.ProjectID))

		expect(t, pc.Do("GET", "fhir/R4/Patient/"+id(mine), nil, ""), 200, "own record")
		expect(t, pc.Do("GET", "fhir/R4/Patient/"+id(theirs), nil, ""), 404, "other patient hidden")
		expect(t, pc.Do("GET", "fhir/R4/Patient/"+id(theirs)+"/_history", nil, ""), 404, "other patient history hidden")
		ps := entries(t, pc.Do("GET", "fhir/R4/Patient", nil, ""))
		if len(ps) != 1 || id(ps[0]) != id(mine) {
			t.Fatalf("search sees only its own record: %v", ps)
		}
		if ps := entries(t, pc.Do("GET", "fhir/R4/Patient?_id="+id(theirs), nil, "")); len(ps) != 0 {
			t.Fatalf("search by id of another patient: %v", ps)
		}
		os := entries(t, pc.Do("GET", "fhir/R4/Observation", nil, ""))
		if len(os) != 1 || id(os[0]) != id(obsMine) {
			t.Fatalf("observations: %v", os)
		}
		expect(t, pc.Do("GET", "fhir/R4/Observation/"+id(obsTheirs), nil, ""), 404, "other observation")
		// Writes: own record yes, other record no, readonly type no.
		mine["gender"] = "female"
		expect(t, pc.Do("PUT", "fhir/R4/Patient/"+id(mine), mine, ""), 200, "update own")
		theirs["gender"] = "male"
		expect(t, pc.Do("PUT", "fhir/R4/Patient/"+id(theirs), theirs, ""), 404, "update other")
		expect(t, pc.Do("DELETE", "fhir/R4/Patient/"+id(theirs), nil, ""), 404, "delete other")
		expect(t, pc.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient"}, ""), 403, "create outside criteria")
		expect(t, pc.Do("POST", "fhir/R4/Observation", map[string]any{"resourceType": "Observation", "status": "final",
			"code": map[string]any{"text": "y"}, "subject": map[string]any{"reference": "Patient/" + id(mine)}}, ""), 403, "readonly type")
		expect(t, pc.Do("PATCH", "fhir/R4/Observation/"+id(obsMine), `[{"op":"replace","path":"/status","value":"amended"}]`, "application/json-patch+json"), 403, "readonly patch")
		// Types the policy does not name, and admin types.
		expect(t, pc.Do("GET", "fhir/R4/Practitioner", nil, ""), 403, "unlisted type")
		expect(t, pc.Do("GET", "fhir/R4/ProjectMembership", nil, ""), 403, "memberships")
		expect(t, pc.Do("GET", "fhir/R4/AccessPolicy", nil, ""), 403, "policies")
		// The admin still sees everything.
		if ps := entries(t, ca.Do("GET", "fhir/R4/Patient", nil, "")); len(ps) != 2 {
			t.Fatalf("admin search: %d", len(ps))
		}

		// A member without a policy: the whole project except admin types.
		inv2 := inviteBody("Practitioner", "No", "Policy", "nopolicy@example.com")
		inv2["password"] = "no-policy-pw"
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inv2, ""), 200, "invite 2")
		nc := as(t, s, userToken(t, s, "nopolicy@example.com", "no-policy-pw", ""))
		if ps := entries(t, nc.Do("GET", "fhir/R4/Patient", nil, "")); len(ps) != 2 {
			t.Fatalf("no policy: %d patients", len(ps))
		}
		expect(t, nc.Do("POST", "fhir/R4/Observation", map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "z"}}, ""), 201, "no policy write")
		for _, typ := range []string{"ProjectMembership", "AccessPolicy", "User", "Project"} {
			if r := nc.Do("GET", "fhir/R4/"+typ, nil, ""); r.Status != 403 {
				t.Fatalf("%s for a member: %d %s", typ, r.Status, strings.TrimSpace(string(r.Body)))
			}
		}

		// A policy change applies at once (the cache is dropped on membership changes).
		expect(t, ca.Do("PATCH", "admin/projects/"+a.ProjectID+"/members/"+id(m), `[{"op":"remove","path":"/access"}]`, "application/json-patch+json"), 200, "drop policy")
		if ps := entries(t, pc.Do("GET", "fhir/R4/Patient", nil, "")); len(ps) != 2 {
			t.Fatalf("after removing the policy: %d", len(ps))
		}
	})
}
