package fhirapi_test

import (
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestProjectAdminCannotEscalate: a project admin cannot make its project a
// super-admin project, nor write or read the fields of its Project that only
// super admins own (superAdmin, systemSecret, strictMode hidden; features,
// link, systemSetting read-only), through PUT or any JSON Patch; the stored
// Project is unchanged by every refusal and the admin's next token is no
// super admin.
func TestProjectAdminCannotEscalate(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		su := s.SuperAdmin(t)
		pa := s.NewProject(t, "Tenant")
		path := "fhir/R4/Project/" + pa.ProjectID
		const jp = "application/json-patch+json"
		const secret = "system-secret-value-42"
		// The super admin sets what only it may set.
		sup := su.Do("PATCH", path, `[
			{"op":"add","path":"/systemSecret","value":[{"name":"k","valueString":"`+secret+`"}]},
			{"op":"add","path":"/features","value":["bots"]},
			{"op":"add","path":"/systemSetting","value":[{"name":"s","valueString":"v"}]}]`, jp)
		if sup.Status != 200 {
			t.Fatalf("super admin patch: %d %s", sup.Status, sup.Body)
		}
		stored := su.Do("GET", path, nil, "")
		if stored.Status != 200 || !strings.Contains(string(stored.Body), secret) || stored.JSON()["strictMode"] != true {
			t.Fatalf("super admin read: %d %s", stored.Status, stored.Body)
		}
		unchanged := func(what string) {
			t.Helper()
			if r := su.Do("GET", path, nil, ""); string(r.Body) != string(stored.Body) {
				t.Errorf("%s changed the stored Project:\n%s\nwant\n%s", what, r.Body, stored.Body)
			}
		}

		// What the project admin sees: no hidden field, by read, search, vread
		// and history.
		mine := pa.Do("GET", path, nil, "")
		if mine.Status != 200 {
			t.Fatalf("own project read: %d %s", mine.Status, mine.Body)
		}
		vid := str(mine.JSON(), "meta", "versionId")
		for _, r := range []*servertest.Response{mine,
			pa.Do("GET", "fhir/R4/Project?_id="+pa.ProjectID, nil, ""),
			pa.Do("GET", path+"/_history", nil, ""),
			pa.Do("GET", path+"/_history/"+vid, nil, "")} {
			if r.Status != 200 {
				t.Errorf("project admin read: %d %s", r.Status, r.Body)
			}
			for _, hidden := range []string{secret, "systemSecret", "superAdmin", "strictMode"} {
				if strings.Contains(string(r.Body), hidden) {
					t.Errorf("project admin sees %s: %s", hidden, r.Body)
				}
			}
		}

		view := mine.JSON()
		put := func(field string, value any) *servertest.Response {
			body := map[string]any{}
			for k, v := range view {
				body[k] = v
			}
			body[field] = value
			return pa.Do("PUT", path, body, "")
		}
		for _, tc := range []struct {
			field string
			value any
		}{
			{"superAdmin", true},
			{"superAdmin", false},
			{"systemSecret", []any{map[string]any{"name": "k", "valueString": "mine"}}},
			{"strictMode", false},
			{"features", []any{"bots", "cron"}},
			{"systemSetting", []any{map[string]any{"name": "s", "valueString": "w"}}},
			{"link", []any{map[string]any{"project": map[string]any{"reference": "Project/" + s.Bootstrap.ProjectID}}}},
		} {
			r := put(tc.field, tc.value)
			wantOutcome(t, "PUT "+tc.field, r, 403, "forbidden", "")
			if !strings.Contains(r.Issue(), tc.field) {
				t.Errorf("PUT %s: the refusal does not name the field: %q", tc.field, r.Issue())
			}
			unchanged("PUT " + tc.field)
			for _, op := range []string{"add", "replace"} {
				r := pa.Do("PATCH", path, `[{"op":"`+op+`","path":"/`+tc.field+`","value":`+jsonOf(t, tc.value)+`}]`, jp)
				if r.Status != 403 && r.Status != 400 {
					t.Errorf("PATCH %s %s: %d %s", op, tc.field, r.Status, r.Body)
				}
				unchanged("PATCH " + op + " " + tc.field)
			}
		}
		for _, patch := range []string{
			`[{"op":"remove","path":"/superAdmin"}]`,
			`[{"op":"remove","path":"/strictMode"}]`,
			`[{"op":"remove","path":"/systemSecret"}]`,
			`[{"op":"remove","path":"/features"}]`,
			`[{"op":"copy","from":"/systemSecret","path":"/description"}]`,
			`[{"op":"move","from":"/systemSecret","path":"/description"}]`,
			`[{"op":"test","path":"/strictMode","value":true}]`,
			`[{"op":"copy","from":"/name","path":"/superAdmin"}]`,
		} {
			r := pa.Do("PATCH", path, patch, jp)
			if r.Status != 403 && r.Status != 400 {
				t.Errorf("PATCH %s: %d %s", patch, r.Status, r.Body)
			}
			if strings.Contains(string(r.Body), secret) {
				t.Errorf("PATCH %s leaks the secret: %s", patch, r.Body)
			}
			unchanged("PATCH " + patch)
		}

		// A write that does not mention the hidden fields keeps them.
		view["description"] = "renamed by its admin"
		if r := pa.Do("PUT", path, view, ""); r.Status != 200 {
			t.Fatalf("plain PUT: %d %s", r.Status, r.Body)
		}
		if r := pa.Do("PATCH", path, `[{"op":"add","path":"/name","value":"Tenant 2"}]`, jp); r.Status != 200 {
			t.Fatalf("plain PATCH: %d %s", r.Status, r.Body)
		}
		after := su.Do("GET", path, nil, "").JSON()
		if after["strictMode"] != true || !strings.Contains(jsonOf(t, after["systemSecret"]), secret) || after["features"] == nil ||
			after["name"] != "Tenant 2" || after["description"] != "renamed by its admin" || after["superAdmin"] != nil {
			t.Errorf("after the admin's plain writes: %v", after)
		}

		// The admin's next token is still no super admin.
		fresh := s.As(t, s.Token(t, pa.ClientID, pa.Secret))
		if r := fresh.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "Mine"}, "application/json"); r.Status != 403 {
			t.Errorf("POST /admin/Project after the attempts: %d %s", r.Status, r.Body)
		}
		if r := fresh.Do("GET", "admin/projects/"+s.Bootstrap.ProjectID, nil, ""); r.Status != 403 {
			t.Errorf("another project's admin page: %d", r.Status)
		}
	})
}
