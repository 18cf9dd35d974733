package adminapi_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

func TestMemberUpdateAndPatch(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "M")
		b := s.NewProject(t, "N")
		ca := as(t, s, a.Token)
		m := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inviteBody("Practitioner", "Mo", "Ember", "mo@example.com"), ""), 200, "invite")
		path := "admin/projects/" + a.ProjectID + "/members/" + id(m)

		got := expect(t, ca.Do("GET", path, nil, ""), 200, "get")
		if id(got) != id(m) {
			t.Fatalf("get: %v", got)
		}
		expect(t, ca.Do("GET", "admin/projects/"+a.ProjectID+"/members/00000000-0000-0000-0000-000000000000", nil, ""), 404, "unknown")
		expect(t, as(t, s, b.Token).Do("GET", "admin/projects/"+a.ProjectID+"/members/"+id(m), nil, ""), 403, "other project's admin")
		expect(t, as(t, s, b.Token).Do("GET", "admin/projects/"+b.ProjectID+"/members/"+id(m), nil, ""), 404, "not in this project")

		// Full update: the GET body with admin=true.
		got["admin"] = true
		up := expect(t, ca.Do("POST", path, got, ""), 200, "promote")
		if up["admin"] != true || ref(up, "user") != ref(m, "user") || ref(up, "profile") != ref(m, "profile") {
			t.Fatalf("promote: %v", up)
		}
		wrongID := clone(got)
		wrongID["id"] = "00000000-0000-0000-0000-000000000000"
		expect(t, ca.Do("POST", path, wrongID, ""), 403, "wrong id")
		wrongType := clone(got)
		wrongType["resourceType"] = "Patient"
		expect(t, ca.Do("POST", path, wrongType, ""), 403, "wrong type")
		chProject := clone(got)
		chProject["project"] = map[string]any{"reference": "Project/" + b.ProjectID}
		if r := expect2(t, ca.Do("POST", path, chProject, ""), 400); !strings.Contains(r.Issue(), "cannot change") {
			t.Fatalf("project change: %s", r.Body)
		}
		chUser := clone(got)
		chUser["user"] = map[string]any{"reference": "User/00000000-0000-0000-0000-000000000000"}
		if r := expect2(t, ca.Do("POST", path, chUser, ""), 400); !strings.Contains(r.Issue(), "cannot change") {
			t.Fatalf("user change: %s", r.Body)
		}
		noProfile := clone(got)
		delete(noProfile, "profile")
		expect(t, ca.Do("POST", path, noProfile, ""), 400, "no profile")
		// Left out, or the same reference without its display: kept as stored.
		noProject := clone(got)
		delete(noProject, "project")
		noProject["user"] = map[string]any{"reference": ref(got, "user")}
		kept := expect(t, ca.Do("POST", path, noProject, ""), 200, "project left out")
		if !reflectEqual(kept["project"], got["project"]) || !reflectEqual(kept["user"], got["user"]) {
			t.Fatalf("project and user not kept: %v, was %v", kept, got)
		}
		// The membership's project and user are fixed for super admins too,
		// through /fhir/R4 as through the admin API (docs/decisions.md 4).
		su := as(t, s, s.SuperAdmin(t).Token)
		if r := expect2(t, su.Do("PUT", "fhir/R4/ProjectMembership/"+id(m), chProject, ""), 400); !strings.Contains(r.Issue(), "cannot change") {
			t.Fatalf("super admin moves a membership: %s", r.Body)
		}
		if r := expect2(t, su.Do("POST", path, chUser, ""), 400); !strings.Contains(r.Issue(), "cannot change") {
			t.Fatalf("super admin changes a membership's user: %s", r.Body)
		}

		// PATCH: replace of a missing field acts as add (docs/decisions.md 3).
		m2 := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inviteBody("Practitioner", "Pa", "Tch", "patch@example.com"), ""), 200, "invite 2")
		p2 := "admin/projects/" + a.ProjectID + "/members/" + id(m2)
		patch := `[{"op":"replace","path":"/admin","value":true}]`
		pm := expect(t, ca.Do("PATCH", p2, patch, "application/json-patch+json"), 200, "patch")
		if pm["admin"] != true {
			t.Fatalf("patch: %v", pm)
		}
		pm = expect(t, ca.Do("PATCH", p2, `[{"op":"remove","path":"/admin"},{"op":"add","path":"/externalId","value":"e-9"},{"op":"replace","path":"/active","value":false}]`, "application/json-patch+json"), 200, "patch 2")
		if _, ok := pm["admin"]; ok || pm["externalId"] != "e-9" || pm["active"] != false {
			t.Fatalf("patch 2: %v", pm)
		}
		for _, bad := range []string{`[{"op":"replace","path":"/profile","value":{"reference":"Patient/x"}}]`, `[{"op":"replace","path":"/project","value":{}}]`} {
			r := expect2(t, ca.Do("PATCH", p2, bad, "application/json-patch+json"), 400)
			if !strings.Contains(r.Issue(), "/pro") {
				t.Fatalf("bad path must be named: %s", r.Body)
			}
		}
		if r := expect2(t, ca.Do("PATCH", p2, `[{"op":"move","from":"/admin","path":"/active"}]`, "application/json-patch+json"), 400); !strings.Contains(r.Issue(), "/active") {
			t.Fatalf("bad op: %s", r.Body)
		}
		expect(t, ca.Do("PATCH", p2, `[]`, "application/json-patch+json"), 400, "empty patch")
		expect(t, ca.Do("PATCH", p2, patch, "application/json"), 415, "wrong content type")
		expect(t, ca.Do("PATCH", p2, `[{"op":"add","path":"/admin","value":"yes"}]`, "application/json-patch+json"), 400, "non-boolean admin")

		// ProjectMembership is not written through /fhir/R4 by project admins (docs/decisions.md 5).
		r := ca.Do("PUT", "fhir/R4/ProjectMembership/"+id(m), got, "")
		if r.Status != 403 || !strings.Contains(r.Issue(), "/admin/projects/") {
			t.Fatalf("fhir write: %d %s", r.Status, r.Body)
		}
	})
}

func reflectEqual(a, b any) bool { return reflect.DeepEqual(a, b) }

func clone(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestMemberDelete(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "D")
		ca := as(t, s, a.Token)
		su := as(t, s, s.SuperAdmin(t).Token)
		inv := "admin/projects/" + a.ProjectID + "/invite"

		// Project-scoped user, last membership: User deleted, profile kept.
		pm := expect(t, ca.Do("POST", inv, inviteBody("Patient", "Del", "Patient", "delpat@example.com"), ""), 200, "invite patient")
		r := expect(t, ca.Do("DELETE", "admin/projects/"+a.ProjectID+"/members/"+id(pm), nil, ""), 200, "delete")
		if r["id"] != "ok" {
			t.Fatalf("delete answer: %v", r)
		}
		expect(t, ca.Do("GET", "admin/projects/"+a.ProjectID+"/members/"+id(pm), nil, ""), 410, "deleted membership")
		expect(t, ca.Do("GET", "fhir/R4/"+ref(pm, "profile"), nil, ""), 200, "profile kept")
		if u := findUsers(t, su, "delpat@example.com"); len(u) != 0 {
			t.Fatalf("project-scoped user must go with its last membership: %v", u)
		}
		// Server-scoped user: kept.
		sm := expect(t, ca.Do("POST", inv, inviteBody("Practitioner", "Del", "Doc", "deldoc@example.com"), ""), 200, "invite doc")
		expect(t, ca.Do("DELETE", "admin/projects/"+a.ProjectID+"/members/"+id(sm), nil, ""), 200, "delete doc")
		if u := findUsers(t, su, "deldoc@example.com"); len(u) != 1 {
			t.Fatalf("server-scoped user must stay: %v", u)
		}
		expect(t, ca.Do("GET", "fhir/R4/"+ref(sm, "profile"), nil, ""), 200, "profile kept")
		// Project-scoped user with another membership in the project: kept.
		b1 := inviteBody("Patient", "Two", "Ships", "two@example.com")
		m1 := expect(t, ca.Do("POST", inv, b1, ""), 200, "first")
		b1["forceNewMembership"] = true
		expect(t, ca.Do("POST", inv, b1, ""), 200, "second")
		expect(t, ca.Do("DELETE", "admin/projects/"+a.ProjectID+"/members/"+id(m1), nil, ""), 200, "delete first")
		if u := findUsers(t, su, "two@example.com"); len(u) != 1 {
			t.Fatalf("user with another membership must stay: %v", u)
		}

		// The owner's membership cannot be deleted: a User creates a project with $init.
		ob := inviteBody("Practitioner", "Owen", "Owner", "owner@example.com")
		ob["password"] = "owner-password"
		expect(t, ca.Do("POST", inv, ob, ""), 200, "invite owner")
		ot := as(t, s, userToken(t, s, "owner@example.com", "owner-password", ""))
		proj := expect(t, ot.Do("POST", "fhir/R4/Project/$init", map[string]any{"resourceType": "Parameters",
			"parameter": []any{map[string]any{"name": "name", "valueString": "Owned"}}}, ""), 201, "init")
		oms := entries(t, su.Do("GET", "fhir/R4/ProjectMembership?project=Project/"+id(proj)+"&profile-type=Practitioner", nil, ""))
		if len(oms) != 1 || oms[0]["admin"] != true {
			t.Fatalf("owner membership: %v", oms)
		}
		r2 := expect2(t, su.Do("DELETE", "admin/projects/"+id(proj)+"/members/"+id(oms[0]), nil, ""), 400)
		if r2.Issue() != "Cannot delete the owner of the project" {
			t.Fatalf("owner delete: %s", r2.Body)
		}
		// The owner, logged into the new project, is its admin.
		ot2 := as(t, s, userToken(t, s, "owner@example.com", "owner-password", id(proj)))
		expect2(t, ot2.Do("DELETE", "admin/projects/"+id(proj)+"/members/"+id(oms[0]), nil, ""), 400)
		expect(t, ot2.Do("GET", "admin/projects/"+id(proj), nil, ""), 200, "owner administers")
		// Non-admins cannot delete members.
		expect(t, ot.Do("DELETE", "admin/projects/"+a.ProjectID+"/members/"+id(m1), nil, ""), 403, "member delete")
	})
}
