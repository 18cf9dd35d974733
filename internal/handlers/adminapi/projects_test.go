package adminapi_test

import (
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

func TestCreateProject(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		su := as(t, s, s.SuperAdmin(t).Token)
		for _, path := range []string{"admin/Project", "admin/Project/"} {
			p := expect(t, su.Do("POST", path, map[string]any{"resourceType": "Project", "name": "P " + path, "strictMode": true}, ""), 201, path)
			meta, _ := p["meta"].(map[string]any)
			if id(p) == "" || meta["project"] != id(p) || p["strictMode"] != true {
				t.Fatalf("%s: project must belong to itself: %v", path, p)
			}
		}
		// Plain FHIR create by a super admin: the project belongs to itself too.
		p := expect(t, su.Do("POST", "fhir/R4/Project", map[string]any{"resourceType": "Project", "name": "Plain"}, ""), 201, "fhir create")
		if meta, _ := p["meta"].(map[string]any); meta["project"] != id(p) {
			t.Fatalf("plain create: meta.project %v != id %v", meta["project"], id(p))
		}
		// Project admins cannot create projects; no auth is 401.
		pa := as(t, s, s.NewProject(t, "A").Token)
		expect(t, pa.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "x"}, ""), 403, "project admin")
		expect(t, pa.Do("POST", "fhir/R4/Project", map[string]any{"resourceType": "Project", "name": "x"}, ""), 403, "project admin fhir")
		expect(t, as(t, s, "").Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "x"}, ""), 401, "anonymous")
		expect(t, su.Do("POST", "admin/Project", map[string]any{"resourceType": "Project"}, ""), 400, "no name")
	})
}

func TestProjectAdminEndpoints(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "Alpha")
		b := s.NewProject(t, "Beta")
		ca := as(t, s, a.Token)
		su := as(t, s, s.SuperAdmin(t).Token)

		got := expect(t, ca.Do("GET", "admin/projects/"+a.ProjectID, nil, ""), 200, "get own project")
		pj, _ := got["project"].(map[string]any)
		if pj["id"] != a.ProjectID || pj["name"] != "Alpha" || pj["secret"] == nil || pj["setting"] == nil || pj["site"] == nil {
			t.Fatalf("project details: %s", got)
		}
		// docs/decisions.md 2: another project's id is 403 for project admins; super admins may name any.
		expect(t, ca.Do("GET", "admin/projects/"+b.ProjectID, nil, ""), 403, "other project")
		expect(t, ca.Do("POST", "admin/projects/"+b.ProjectID+"/secrets", []any{}, ""), 403, "other project secrets")
		expect(t, ca.Do("POST", "admin/projects/"+b.ProjectID+"/invite", inviteBody("Practitioner", "X", "Y", "xy@example.com"), ""), 403, "other project invite")
		expect(t, ca.Do("POST", "admin/projects/"+b.ProjectID+"/client", map[string]any{"name": "x"}, ""), 403, "other project client")
		expect(t, ca.Do("POST", "admin/projects/"+b.ProjectID+"/bot", map[string]any{"name": "x"}, ""), 403, "other project bot")
		expect(t, as(t, s, "").Do("POST", "admin/projects/"+a.ProjectID+"/invite", inviteBody("Practitioner", "X", "Y", "xy@example.com"), ""), 401, "anonymous invite")
		expect(t, su.Do("GET", "admin/projects/"+b.ProjectID, nil, ""), 200, "super admin any project")
		expect(t, as(t, s, "").Do("GET", "admin/projects/"+a.ProjectID, nil, ""), 401, "anonymous")

		secrets := []any{map[string]any{"name": "API_KEY", "valueString": "k1"}}
		p := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/secrets", secrets, ""), 200, "secrets")
		if sec, _ := p["secret"].([]any); len(sec) != 1 {
			t.Fatalf("secrets: %v", p)
		}
		p = expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/secrets", []any{map[string]any{"name": "B", "valueBoolean": true}}, ""), 200, "secrets replace")
		if sec, _ := p["secret"].([]any); len(sec) != 1 || sec[0].(map[string]any)["name"] != "B" {
			t.Fatalf("secrets are replaced wholesale: %v", p)
		}
		p = expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/settings", []any{map[string]any{"name": "bots", "valueBoolean": false}}, ""), 200, "settings")
		if set, _ := p["setting"].([]any); len(set) != 1 {
			t.Fatalf("settings: %v", p)
		}

		cl := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/client", map[string]any{"name": "Integration"}, ""), 201, "client")
		secret, _ := cl["secret"].(string)
		if cl["resourceType"] != "ClientApplication" || len(secret) < 32 {
			t.Fatalf("client: %v", cl)
		}
		// The new client can log in, into this project.
		tok := s.Token(t, id(cl), secret)
		me := expect(t, as(t, s, tok).Do("GET", "auth/me", nil, ""), 200, "client me")
		if me["project"].(map[string]any)["id"] != a.ProjectID {
			t.Fatalf("client's project: %v", me["project"])
		}
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/client", map[string]any{}, ""), 400, "client without name")

		bot := expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/bot", map[string]any{"name": "Echo"}, ""), 201, "bot")
		ms := entries(t, ca.Do("GET", "fhir/R4/ProjectMembership?profile=Bot/"+id(bot), nil, ""))
		if len(ms) != 1 || ref(ms[0], "user") != "Bot/"+id(bot) || ref(ms[0], "profile") != "Bot/"+id(bot) {
			t.Fatalf("bot membership: %v", ms)
		}
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/bot", map[string]any{}, ""), 400, "bot without name")
		// A super admin's client goes to the named project.
		cl2 := expect(t, su.Do("POST", "admin/projects/"+b.ProjectID+"/client", map[string]any{"name": "B client"}, ""), 201, "super admin client")
		if meta, _ := cl2["meta"].(map[string]any); meta["project"] != b.ProjectID {
			t.Fatalf("super admin client project: %v", cl2["meta"])
		}

		// A member that is not admin gets 403 everywhere under /admin.
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", map[string]any{"resourceType": "Practitioner", "firstName": "M", "lastName": "Ember", "email": "member@example.com", "password": "member-password", "sendEmail": false}, ""), 200, "invite member")
		mt := as(t, s, userToken(t, s, "member@example.com", "member-password", ""))
		expect(t, mt.Do("GET", "admin/projects/"+a.ProjectID, nil, ""), 403, "member project")
		expect(t, mt.Do("POST", "admin/projects/"+a.ProjectID+"/client", map[string]any{"name": "x"}, ""), 403, "member client")
		expect(t, mt.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inviteBody("Practitioner", "a", "b", "x@example.com"), ""), 403, "member invite")
		expect(t, mt.Do("GET", "fhir/R4/ProjectMembership", nil, ""), 403, "member search")
	})
}

func TestProjectInit(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		params := func(name string) map[string]any {
			return map[string]any{"resourceType": "Parameters", "parameter": []any{map[string]any{"name": "name", "valueString": name}}}
		}
		a := s.NewProject(t, "Init")
		expect(t, as(t, s, a.Token).Do("POST", "fhir/R4/Project/$init", params("x"), ""), 403, "client that is not super admin")
		su := as(t, s, s.SuperAdmin(t).Token)
		expect(t, su.Do("POST", "fhir/R4/Project/$init", map[string]any{"resourceType": "Parameters"}, ""), 400, "no name")
		p := expect(t, su.Do("POST", "fhir/R4/Project/$init", params("By super"), ""), 201, "super admin")
		if p["resourceType"] != "Project" || p["name"] != "By super" || p["meta"].(map[string]any)["project"] != id(p) {
			t.Fatalf("init: %v", p)
		}
		ms := entries(t, su.Do("GET", "fhir/R4/ProjectMembership?project=Project/"+id(p), nil, ""))
		if len(ms) != 1 || !strings.HasPrefix(ref(ms[0], "profile"), "ClientApplication/") {
			t.Fatalf("default client membership: %v", ms)
		}
		// A User creates a project it owns and administers.
		inv := inviteBody("Practitioner", "U", "Ser", "initowner@example.com")
		inv["password"] = "init-owner-pw"
		expect(t, as(t, s, a.Token).Do("POST", "admin/projects/"+a.ProjectID+"/invite", inv, ""), 200, "invite")
		uc := as(t, s, userToken(t, s, "initowner@example.com", "init-owner-pw", ""))
		p2 := expect(t, uc.Do("POST", "fhir/R4/Project/$init", params("Mine"), ""), 201, "user init")
		if !strings.HasPrefix(ref(p2, "owner"), "User/") {
			t.Fatalf("owner: %v", p2)
		}
		ms = entries(t, su.Do("GET", "fhir/R4/ProjectMembership?project=Project/"+id(p2), nil, ""))
		if len(ms) != 2 {
			t.Fatalf("owner + default client memberships: %v", ms)
		}
		// A project-scoped user cannot own a project.
		pinv := inviteBody("Patient", "P", "S", "scopedowner@example.com")
		pinv["password"] = "scoped-owner-pw"
		expect(t, as(t, s, a.Token).Do("POST", "admin/projects/"+a.ProjectID+"/invite", pinv, ""), 200, "invite patient")
		pc := as(t, s, userToken(t, s, "scopedowner@example.com", "scoped-owner-pw", a.ProjectID))
		expect(t, pc.Do("POST", "fhir/R4/Project/$init", params("Nope"), ""), 400, "project-scoped owner")
	})
}

// Project/$init answers the Project it created as it was created, strictMode
// included, to a caller who is not a super admin (a project admin here), as
// the reference does; what the caller reads back later follows the field
// rules (strictMode is hidden from all but super admins).
func TestProjectInitAnswersCreatedProject(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "Home")
		inv := inviteBody("Practitioner", "Ada", "Admin", "init-admin@example.com")
		inv["password"] = "init-admin-pw"
		inv["admin"] = true
		expect(t, as(t, s, a.Token).Do("POST", "admin/projects/"+a.ProjectID+"/invite", inv, ""), 200, "invite admin")
		uc := as(t, s, userToken(t, s, "init-admin@example.com", "init-admin-pw", a.ProjectID))
		if me := expect(t, uc.Do("GET", "auth/me", nil, ""), 200, "me"); me["membership"].(map[string]any)["admin"] != true {
			t.Fatalf("the caller must be a project admin: %v", me["membership"])
		}
		params := map[string]any{"resourceType": "Parameters", "parameter": []any{map[string]any{"name": "name", "valueString": "Created"}}}
		p := expect(t, uc.Do("POST", "fhir/R4/Project/$init", params, ""), 201, "init")
		if p["resourceType"] != "Project" || p["name"] != "Created" || p["strictMode"] != true {
			t.Errorf("$init answer: want the created Project with strictMode true: %v", p)
		}
		if p["superAdmin"] != nil || p["systemSecret"] != nil {
			t.Errorf("$init answer has fields it did not set: %v", p)
		}
		// Read back in the new project, which the caller administers: the
		// field rules apply.
		nc := as(t, s, userToken(t, s, "init-admin@example.com", "init-admin-pw", id(p)))
		got := expect(t, nc.Do("GET", "fhir/R4/Project/"+id(p), nil, ""), 200, "read back")
		if _, ok := got["strictMode"]; ok || got["name"] != "Created" {
			t.Errorf("read back by a project admin: strictMode must be hidden: %v", got)
		}
		stored := expect(t, as(t, s, s.SuperAdmin(t).Token).Do("GET", "fhir/R4/Project/"+id(p), nil, ""), 200, "super admin read")
		if stored["strictMode"] != true {
			t.Errorf("stored project: %v", stored)
		}
	})
}
