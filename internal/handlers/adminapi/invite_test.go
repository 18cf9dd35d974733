package adminapi_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/servertest"
)

func issues(t *testing.T, r *servertest.Response) []fhir.Issue {
	t.Helper()
	var o fhir.OperationOutcome
	if err := json.Unmarshal(r.Body, &o); err != nil {
		t.Fatalf("not an outcome: %s", r.Body)
	}
	return o.Issue
}

func TestInviteValidation(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "V")
		c := as(t, s, a.Token)
		path := "admin/projects/" + a.ProjectID + "/invite"
		r := c.Do("POST", path, map[string]any{}, "")
		expect(t, r, 400, "empty")
		got := map[string]bool{}
		noExpr := false
		for _, is := range issues(t, r) {
			if len(is.Expression) == 0 {
				noExpr = is.Details.Text == "Either email or externalId is required"
				continue
			}
			got[is.Expression[0]+":"+is.Details.Text] = true
		}
		for _, want := range []string{"resourceType:Resource type is required", "firstName:First name is required", "lastName:Last name is required"} {
			if !got[want] {
				t.Errorf("missing issue %q in %s", want, r.Body)
			}
		}
		if !noExpr {
			t.Errorf("the email/externalId issue has no expression: %s", r.Body)
		}
		b := inviteBody("Organization", "A", "B", "a@example.com")
		if is := issues(t, expect2(t, c.Do("POST", path, b, ""), 400)); is[0].Expression[0] != "resourceType" {
			t.Errorf("bad resourceType: %v", is)
		}
		b = inviteBody("Practitioner", "A", "B", "a@example.com")
		b["password"] = "short"
		if is := issues(t, expect2(t, c.Do("POST", path, b, ""), 400)); is[0].Expression[0] != "password" {
			t.Errorf("short password: %v", is)
		}
		b = inviteBody("RelatedPerson", "A", "B", "rp@example.com")
		if r := expect2(t, c.Do("POST", path, b, ""), 400); r.Issue() != "Patient is required to create a RelatedPerson" {
			t.Errorf("related person: %s", r.Body)
		}
		b["patient"] = map[string]any{"reference": "Practitioner/x"}
		if r := expect2(t, c.Do("POST", path, b, ""), 400); r.Issue() != "Patient must be a reference to a Patient resource" {
			t.Errorf("related person patient: %s", r.Body)
		}
		expect(t, c.Do("POST", path, "{not json", ""), 400, "bad json")
	})
}

func expect2(t *testing.T, r *servertest.Response, status int) *servertest.Response {
	t.Helper()
	expect(t, r, status, "request")
	return r
}

// findUsers searches Users by e-mail as the super admin.
func findUsers(t *testing.T, su *servertest.Client, email string) []map[string]any {
	return entries(t, su.Do("GET", "fhir/R4/User?email="+email, nil, ""))
}

func TestInviteScopesAndReuse(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "Alpha")
		b := s.NewProject(t, "Beta")
		ca, cb := as(t, s, a.Token), as(t, s, b.Token)
		su := as(t, s, s.SuperAdmin(t).Token)
		pathA := "admin/projects/" + a.ProjectID + "/invite"
		pathB := "admin/projects/" + b.ProjectID + "/invite"

		// A Practitioner is server-scoped: the User has no project and lives in the super-admin project.
		m := expect(t, ca.Do("POST", pathA, inviteBody("Practitioner", "Pat", "Smith", "Doc@Example.com"), ""), 200, "invite practitioner")
		if m["resourceType"] != "ProjectMembership" || ref(m, "project") != "Project/"+a.ProjectID ||
			!strings.HasPrefix(ref(m, "user"), "User/") || !strings.HasPrefix(ref(m, "profile"), "Practitioner/") {
			t.Fatalf("membership: %v", m)
		}
		if _, ok := m["admin"]; ok {
			t.Fatalf("admin must be absent when not given: %v", m)
		}
		users := findUsers(t, su, "doc@example.com")
		if len(users) != 1 || users[0]["project"] != nil || users[0]["email"] != "doc@example.com" {
			t.Fatalf("server-scoped user (lower-cased e-mail): %v", users)
		}
		if meta := users[0]["meta"].(map[string]any); meta["project"] != s.Bootstrap.ProjectID {
			t.Fatalf("server-scoped users live in the super-admin project: %v", meta)
		}
		if _, ok := users[0]["passwordHash"]; ok {
			t.Fatal("passwordHash returned")
		}
		// A project admin cannot edit a User directly.
		u := users[0]
		u["firstName"] = "Changed"
		if r := ca.Do("PUT", "fhir/R4/User/"+id(u), u, ""); r.Status != 403 {
			t.Fatalf("project admin edits a User: %d %s", r.Status, r.Body)
		}
		// Another project's admin inviting the same e-mail reuses the User.
		m2 := expect(t, cb.Do("POST", pathB, inviteBody("Practitioner", "Pat", "Smith", "doc@example.com"), ""), 200, "invite in B")
		if ref(m2, "user") != ref(m, "user") {
			t.Fatalf("existing user not reused: %v vs %v", ref(m2, "user"), ref(m, "user"))
		}
		// Duplicate → 409; upsert updates; forceNewMembership adds another.
		r := ca.Do("POST", pathA, inviteBody("Practitioner", "Pat", "Smith", "doc@example.com"), "")
		expect(t, r, 409, "duplicate")
		up := inviteBody("Practitioner", "Pat", "Smith", "doc@example.com")
		up["upsert"] = true
		up["admin"] = true
		m3 := expect(t, ca.Do("POST", pathA, up, ""), 200, "upsert")
		if id(m3) != id(m) || m3["admin"] != true || ref(m3, "profile") != ref(m, "profile") {
			t.Fatalf("upsert: %v", m3)
		}
		fn := inviteBody("Practitioner", "Pat", "Smith", "doc@example.com")
		fn["forceNewMembership"] = true
		m4 := expect(t, ca.Do("POST", pathA, fn, ""), 200, "force new")
		if id(m4) == id(m) || ref(m4, "user") != ref(m, "user") {
			t.Fatalf("forceNewMembership: %v", m4)
		}

		// A Patient is project-scoped: the User lives in the project.
		p := expect(t, ca.Do("POST", pathA, inviteBody("Patient", "Pia", "Patient", "pia@example.com"), ""), 200, "invite patient")
		pu := findUsers(t, su, "pia@example.com")
		if len(pu) != 1 || ref(pu[0], "project") != "Project/"+a.ProjectID || pu[0]["meta"].(map[string]any)["project"] != a.ProjectID {
			t.Fatalf("project-scoped user: %v", pu)
		}
		// The same e-mail as a Patient of B is another User.
		p2 := expect(t, cb.Do("POST", pathB, inviteBody("Patient", "Pia", "Patient", "pia@example.com"), ""), 200, "patient in B")
		if ref(p2, "user") == ref(p, "user") {
			t.Fatal("project-scoped users are not shared across projects")
		}
		// scope=project and externalId make a Practitioner project-scoped.
		sp := inviteBody("Practitioner", "Sam", "Scoped", "sam@example.com")
		sp["scope"] = "project"
		expect(t, ca.Do("POST", pathA, sp, ""), 200, "scope project")
		if u := findUsers(t, su, "sam@example.com"); len(u) != 1 || ref(u[0], "project") != "Project/"+a.ProjectID {
			t.Fatalf("scope=project: %v", u)
		}
		ex := map[string]any{"resourceType": "Practitioner", "firstName": "E", "lastName": "X", "externalId": "ext-1", "sendEmail": false}
		em := expect(t, ca.Do("POST", pathA, ex, ""), 200, "externalId")
		if em["externalId"] != "ext-1" {
			t.Fatalf("externalId on membership: %v", em)
		}
		expect(t, ca.Do("POST", pathA, ex, ""), 409, "duplicate externalId")
		// The same e-mail at the other scope, already a member here → 409.
		other := inviteBody("Practitioner", "Pia", "Patient", "pia@example.com")
		expect(t, ca.Do("POST", pathA, other, ""), 409, "other scope member")

		// An existing profile with the e-mail is reused.
		prac := expect(t, ca.Do("POST", "fhir/R4/Practitioner", map[string]any{"resourceType": "Practitioner",
			"telecom": []any{map[string]any{"system": "email", "value": "known@example.com"}}}, ""), 201, "practitioner")
		km := expect(t, ca.Do("POST", pathA, inviteBody("Practitioner", "K", "Nown", "known@example.com"), ""), 200, "known profile")
		if ref(km, "profile") != "Practitioner/"+id(prac) {
			t.Fatalf("profile not reused: %v", km)
		}
	})
}

func TestInviteMembershipTemplate(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "T")
		b := s.NewProject(t, "U")
		ca := as(t, s, a.Token)
		path := "admin/projects/" + a.ProjectID + "/invite"
		pol := expect(t, ca.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "p",
			"resource": []any{map[string]any{"resourceType": "Patient"}}}, ""), 201, "policy")
		polB := expect(t, as(t, s, b.Token).Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "q"}, ""), 201, "policy B")

		// membership.* wins over the top-level fields.
		body := inviteBody("Practitioner", "T", "One", "t1@example.com")
		body["admin"] = true
		body["membership"] = map[string]any{"admin": false, "accessPolicy": map[string]any{"reference": "AccessPolicy/" + id(pol)}}
		m := expect(t, ca.Do("POST", path, body, ""), 200, "template")
		if m["admin"] != false || ref(m, "accessPolicy") != "AccessPolicy/"+id(pol) {
			t.Fatalf("membership template must win: %v", m)
		}
		// The invitation decides whose membership of which project it is,
		// whatever the template says; the server writes it for the caller.
		body = inviteBody("Practitioner", "T", "Four", "t4@example.com")
		body["membership"] = map[string]any{"project": map[string]any{"reference": "Project/" + b.ProjectID},
			"user": map[string]any{"reference": "User/00000000-0000-0000-0000-000000000000"}, "id": "x", "meta": map[string]any{"project": b.ProjectID}}
		m4 := expect(t, ca.Do("POST", path, body, ""), 200, "template with project and user")
		if ref(m4, "project") != "Project/"+a.ProjectID || !strings.HasPrefix(ref(m4, "user"), "User/") || ref(m4, "user") == "User/00000000-0000-0000-0000-000000000000" ||
			id(m4) == "x" || m4["meta"].(map[string]any)["project"] != a.ProjectID {
			t.Fatalf("the invitation's own project and user: %v", m4)
		}
		if author := m4["meta"].(map[string]any)["author"].(map[string]any)["reference"]; author != a.Profile {
			t.Fatalf("membership author %v, want the inviting %s", author, a.Profile)
		}
		// An existing membership's project is fixed: an upsert cannot move it.
		body["upsert"] = true
		delete(body["membership"].(map[string]any), "user")
		delete(body["membership"].(map[string]any), "id")
		if r := expect2(t, ca.Do("POST", path, body, ""), 400); !strings.Contains(r.Issue(), "cannot change") {
			t.Fatalf("upsert moving the membership: %s", r.Body)
		}
		// Top-level admin alone.
		body = inviteBody("Practitioner", "T", "Two", "t2@example.com")
		body["admin"] = true
		if m := expect(t, ca.Do("POST", path, body, ""), 200, "admin"); m["admin"] != true {
			t.Fatalf("admin: %v", m)
		}
		// access[] with parameters.
		body = inviteBody("Patient", "T", "Three", "t3@example.com")
		body["access"] = []any{map[string]any{"policy": map[string]any{"reference": "AccessPolicy/" + id(pol)},
			"parameter": []any{map[string]any{"name": "x", "valueString": "y"}}}}
		if m := expect(t, ca.Do("POST", path, body, ""), 200, "access"); len(m["access"].([]any)) != 1 {
			t.Fatalf("access: %v", m)
		}
		// Policies must exist in the project; nothing is created otherwise.
		for _, pr := range []string{"AccessPolicy/" + id(polB), "AccessPolicy/00000000-0000-0000-0000-000000000000"} {
			body = inviteBody("Practitioner", "Bad", "Policy", "badpolicy@example.com")
			body["accessPolicy"] = map[string]any{"reference": pr}
			r := expect2(t, ca.Do("POST", path, body, ""), 400)
			if !strings.Contains(r.Issue(), pr) {
				t.Fatalf("policy error: %s", r.Body)
			}
		}
		su := as(t, s, s.SuperAdmin(t).Token)
		if u := findUsers(t, su, "badpolicy@example.com"); len(u) != 0 {
			t.Fatalf("a failed invite left a User: %v", u)
		}
		if p := entries(t, ca.Do("GET", "fhir/R4/Practitioner?email=badpolicy@example.com", nil, "")); len(p) != 0 {
			t.Fatalf("a failed invite left a profile: %v", p)
		}
	})
}

// TestInviteAtomic makes the third write (the membership) fail inside the
// transaction, as a crash would: no User and no profile may remain.
func TestInviteAtomic(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "Atomic")
		ca := as(t, s, a.Token)
		s.Admin.BeforeMembershipWrite = func() error { return errors.New("injected failure before the membership write") }
		for _, rt := range []string{"Practitioner", "Patient"} {
			email := strings.ToLower(rt) + "-atomic@example.com"
			body := inviteBody(rt, "At", "Omic", email)
			body["password"] = "a-good-password"
			r := ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", body, "")
			if r.Status != 500 || strings.Contains(string(r.Body), "injected") {
				t.Fatalf("%s: want a generic 500, got %d %s", rt, r.Status, r.Body)
			}
			su := as(t, s, s.SuperAdmin(t).Token)
			if u := findUsers(t, su, email); len(u) != 0 {
				t.Fatalf("%s: a failed invite left a User: %v", rt, u)
			}
			if p := entries(t, ca.Do("GET", "fhir/R4/"+rt+"?email="+email, nil, "")); len(p) != 0 {
				t.Fatalf("%s: a failed invite left a profile: %v", rt, p)
			}
		}
		s.Admin.BeforeMembershipWrite = nil
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inviteBody("Practitioner", "At", "Omic", "practitioner-atomic@example.com"), ""), 200, "retry")
	})
}
