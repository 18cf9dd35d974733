package fhirservice_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// fieldCase is one use of a field rule (the server's table or an access
// policy entry's) by one role: what it sends, the status, the field a
// refusal names, what the answer must not show, and what must hold of the
// stored resource afterwards.
type fieldCase struct {
	role, what string
	method     string
	// path is relative to the FHIR base; {project}, {bot}, {user}, {client},
	// {patient}, {vip}, {binary} and {botMembership} are the world's.
	path string
	// body is sent as is; a function of the role's view of path builds a
	// PUT from what the role sees.
	body   any
	status int
	names  string
	hides  []string
	stored func(t *testing.T, stored map[string]any)
}

// edit is a PUT body: the role's view of the resource, changed by fn.
type edit func(view map[string]any)

const jsonPatch = "application/json-patch+json"

func storedHas(field string, want any) func(*testing.T, map[string]any) {
	return func(t *testing.T, m map[string]any) {
		t.Helper()
		got, _ := json.Marshal(servertest.Field(m, strings.Split(field, ".")...))
		w, _ := json.Marshal(want)
		if string(got) != string(w) {
			t.Errorf("stored %s = %s, want %s", field, got, w)
		}
	}
}

func storedLacks(field string) func(*testing.T, map[string]any) {
	return func(t *testing.T, m map[string]any) {
		t.Helper()
		if v := servertest.Field(m, strings.Split(field, ".")...); v != nil {
			t.Errorf("stored %s = %v, want none", field, v)
		}
	}
}

var projectHidden = []string{systemSecretValue, `"systemSecret"`, `"superAdmin"`, `"strictMode"`}

var fieldCases = []fieldCase{
	// A project admin and its Project (the reference's 6.4).
	{role: "project admin", what: "read", method: "GET", path: "Project/{project}", status: 200, hides: projectHidden},
	{role: "project admin", what: "search", method: "GET", path: "Project?_id={project}", status: 200, hides: projectHidden},
	{role: "project admin", what: "history", method: "GET", path: "Project/{project}/_history", status: 200, hides: projectHidden},
	{role: "project admin", what: "PUT superAdmin", method: "PUT", path: "Project/{project}", body: edit(func(v map[string]any) { v["superAdmin"] = true }), status: 403, names: "superAdmin", stored: storedLacks("superAdmin")},
	{role: "project admin", what: "PUT superAdmin false", method: "PUT", path: "Project/{project}", body: edit(func(v map[string]any) { v["superAdmin"] = false }), status: 403, names: "superAdmin"},
	{role: "project admin", what: "patch add superAdmin", method: "PATCH", path: "Project/{project}", body: `[{"op":"add","path":"/superAdmin","value":true}]`, status: 403, names: "superAdmin", stored: storedLacks("superAdmin")},
	{role: "project admin", what: "patch replace superAdmin", method: "PATCH", path: "Project/{project}", body: `[{"op":"replace","path":"/superAdmin","value":true}]`, status: 400, stored: storedLacks("superAdmin")},
	{role: "project admin", what: "patch copy into superAdmin", method: "PATCH", path: "Project/{project}", body: `[{"op":"copy","from":"/features","path":"/superAdmin"}]`, status: 403, names: "superAdmin", stored: storedLacks("superAdmin")},
	{role: "project admin", what: "PUT systemSecret", method: "PUT", path: "Project/{project}", body: edit(func(v map[string]any) { v["systemSecret"] = []any{map[string]any{"name": "k", "valueString": "mine"}} }), status: 403, names: "systemSecret", stored: storedHas("systemSecret", []any{map[string]any{"name": "k", "valueString": systemSecretValue}})},
	{role: "project admin", what: "patch add systemSecret", method: "PATCH", path: "Project/{project}", body: `[{"op":"add","path":"/systemSecret","value":[]}]`, status: 403, names: "systemSecret"},
	{role: "project admin", what: "patch copy systemSecret out", method: "PATCH", path: "Project/{project}", body: `[{"op":"copy","from":"/systemSecret","path":"/description"}]`, status: 400, hides: projectHidden, stored: storedLacks("description")},
	{role: "project admin", what: "patch test strictMode", method: "PATCH", path: "Project/{project}", body: `[{"op":"test","path":"/strictMode","value":true}]`, status: 400},
	{role: "project admin", what: "PUT strictMode off", method: "PUT", path: "Project/{project}", body: edit(func(v map[string]any) { v["strictMode"] = false }), status: 403, names: "strictMode", stored: storedHas("strictMode", true)},
	{role: "project admin", what: "patch remove strictMode", method: "PATCH", path: "Project/{project}", body: `[{"op":"remove","path":"/strictMode"}]`, status: 400, stored: storedHas("strictMode", true)},
	{role: "project admin", what: "PUT features", method: "PUT", path: "Project/{project}", body: edit(func(v map[string]any) { v["features"] = []any{"bots", "cron"} }), status: 403, names: "features", stored: storedHas("features", []any{"bots"})},
	{role: "project admin", what: "patch remove features", method: "PATCH", path: "Project/{project}", body: `[{"op":"remove","path":"/features"}]`, status: 403, names: "features", stored: storedHas("features", []any{"bots"})},
	{role: "project admin", what: "patch add systemSetting", method: "PATCH", path: "Project/{project}", body: `[{"op":"add","path":"/systemSetting/-","value":{"name":"t","valueString":"w"}}]`, status: 403, names: "systemSetting"},
	{role: "project admin", what: "patch move into link", method: "PATCH", path: "Project/{project}", body: `[{"op":"move","from":"/features","path":"/link"}]`, status: 403, names: "features"},
	{role: "project admin", what: "PUT what it sees", method: "PUT", path: "Project/{project}", body: edit(func(v map[string]any) { v["description"] = "by its admin" }), status: 200, hides: projectHidden,
		stored: func(t *testing.T, m map[string]any) {
			storedHas("strictMode", true)(t, m)
			storedHas("description", "by its admin")(t, m)
			storedHas("systemSecret", []any{map[string]any{"name": "k", "valueString": systemSecretValue}})(t, m)
		}},

	// A member and a client's secret: hidden, so neither read nor written.
	{role: "member", what: "read", method: "GET", path: "ClientApplication/{client}", status: 200, hides: []string{`"secret"`}},
	{role: "member", what: "search", method: "GET", path: "ClientApplication?_id={client}", status: 200, hides: []string{`"secret"`}},
	{role: "member", what: "PUT secret", method: "PUT", path: "ClientApplication/{client}", body: edit(func(v map[string]any) { v["secret"] = "known-to-me" }), status: 403, names: "secret"},
	{role: "member", what: "patch add secret", method: "PATCH", path: "ClientApplication/{client}", body: `[{"op":"add","path":"/secret","value":"known-to-me"}]`, status: 403, names: "secret"},
	{role: "member", what: "PUT what it sees", method: "PUT", path: "ClientApplication/{client}", body: edit(func(v map[string]any) { v["description"] = "x" }), status: 200, hides: []string{`"secret"`},
		stored: func(t *testing.T, m map[string]any) {
			if s, _ := m["secret"].(string); len(s) < 20 {
				t.Errorf("the client's secret was lost: %v", m["secret"])
			}
		}},

	// A bot and its own limits, code and membership.
	{role: "bot", what: "patch replace timeout", method: "PATCH", path: "Bot/{bot}", body: `[{"op":"replace","path":"/timeout","value":900}]`, status: 403, names: "timeout", stored: storedHas("timeout", 10)},
	{role: "bot", what: "PUT timeout", method: "PUT", path: "Bot/{bot}", body: edit(func(v map[string]any) { v["timeout"] = 900 }), status: 403, names: "timeout", stored: storedHas("timeout", 10)},
	{role: "bot", what: "patch remove timeout", method: "PATCH", path: "Bot/{bot}", body: `[{"op":"remove","path":"/timeout"}]`, status: 403, names: "timeout", stored: storedHas("timeout", 10)},
	{role: "bot", what: "patch runtimeVersion", method: "PATCH", path: "Bot/{bot}", body: `[{"op":"replace","path":"/runtimeVersion","value":"wasm"}]`, status: 403, names: "runtimeVersion", stored: storedHas("runtimeVersion", "vmcontext")},
	{role: "bot", what: "patch executableCode", method: "PATCH", path: "Bot/{bot}", body: `[{"op":"add","path":"/executableCode","value":{"contentType":"application/wasm","url":"Binary/{binary}"}}]`, status: 403, names: "executableCode"},
	{role: "bot", what: "create a Bot with a timeout", method: "POST", path: "Bot", body: map[string]any{"resourceType": "Bot", "name": "spawn", "timeout": 900}, status: 403, names: "timeout"},
	{role: "bot", what: "PUT what it sees", method: "PUT", path: "Bot/{bot}", body: edit(func(v map[string]any) { delete(v, "timeout"); v["description"] = "by myself" }), status: 200, stored: storedHas("timeout", 10)},
	{role: "bot", what: "patch own membership", method: "PATCH", path: "ProjectMembership/{botMembership}", body: `[{"op":"add","path":"/admin","value":true}]`, status: 403, stored: storedLacks("admin")},
	{role: "bot", what: "patch own project", method: "PATCH", path: "Project/{project}", body: `[{"op":"add","path":"/name","value":"mine"}]`, status: 403},

	// Nobody reads or writes a password hash, not even a super admin.
	{role: "super admin", what: "read user", method: "GET", path: "User/{user}", status: 200, hides: []string{passwordHashValue, "passwordHash"}},
	{role: "super admin", what: "user history", method: "GET", path: "User/{user}/_history", status: 200, hides: []string{passwordHashValue, "passwordHash"}},
	{role: "super admin", what: "PUT passwordHash", method: "PUT", path: "User/{user}", body: edit(func(v map[string]any) { v["passwordHash"] = "x" }), status: 403, names: "passwordHash", stored: storedHas("passwordHash", passwordHashValue)},
	{role: "super admin", what: "PUT what it sees", method: "PUT", path: "User/{user}", body: edit(func(v map[string]any) { v["firstName"] = "Augusta" }), status: 200, stored: storedHas("passwordHash", passwordHashValue)},

	// A membership's project and user are fixed, for super admins too: a
	// change is 400; the same reference without its display, or (PUT) none,
	// keeps what is stored.
	{role: "super admin", what: "PUT membership project", method: "PUT", path: "ProjectMembership/{botMembership}", body: edit(func(v map[string]any) {
		v["project"] = map[string]any{"reference": "Project/elsewhere"}
	}), status: 400, names: "ProjectMembership.project cannot change"},
	{role: "super admin", what: "patch membership user", method: "PATCH", path: "ProjectMembership/{botMembership}", body: `[{"op":"replace","path":"/user/reference","value":"Bot/other"}]`, status: 400, names: "ProjectMembership.user cannot change"},
	{role: "super admin", what: "patch remove membership user", method: "PATCH", path: "ProjectMembership/{botMembership}", body: `[{"op":"remove","path":"/user"}]`, status: 400, names: "ProjectMembership.user cannot change"},
	{role: "super admin", what: "PUT membership, project without display, no user", method: "PUT", path: "ProjectMembership/{botMembership}", body: edit(func(v map[string]any) {
		v["project"] = map[string]any{"reference": "Project/" + servertest.Field(v, "project", "reference").(string)[len("Project/"):]}
		delete(v, "user")
		v["active"] = true
	}), status: 200, stored: func(t *testing.T, m map[string]any) {
		storedHas("active", true)(t, m)
		if servertest.Field(m, "project", "display") == nil || servertest.Field(m, "user", "reference") == nil {
			t.Errorf("project display or user lost: %v", m)
		}
	}},

	// What the server keeps for itself.
	{role: "project admin", what: "PUT Binary url", method: "PUT", path: "Binary/{binary}", body: edit(func(v map[string]any) { v["url"] = "Binary/elsewhere" }), status: 200,
		stored: func(t *testing.T, m map[string]any) { storedHas("url", "Binary/"+m["id"].(string))(t, m) }},
	{role: "project admin", what: "PUT meta", method: "PUT", path: "Patient/{patient}", body: edit(func(v map[string]any) {
		v["meta"] = map[string]any{"project": "another", "author": map[string]any{"reference": "Practitioner/x"}, "versionId": "v", "account": map[string]any{"reference": "Organization/o"}}
	}), status: 200, stored: func(t *testing.T, m map[string]any) {
		storedLacks("meta.account")(t, m)
		if p := servertest.Field(m, "meta", "project"); p == "another" {
			t.Errorf("meta.project taken from the client")
		}
		if a := servertest.Field(m, "meta", "author", "reference"); a == "Practitioner/x" {
			t.Errorf("meta.author taken from the client")
		}
	}},

	// An access policy's fields: the first entry that matches decides.
	{role: "member with a policy", what: "read", method: "GET", path: "Patient/{patient}", status: 200, hides: []string{"1815-12-10", "birthDate"}},
	{role: "member with a policy", what: "search", method: "GET", path: "Patient?_id={patient}", status: 200, hides: []string{"1815-12-10"}},
	{role: "member with a policy", what: "history", method: "GET", path: "Patient/{patient}/_history", status: 200, hides: []string{"1815-12-10"}},
	{role: "member with a policy", what: "search on the hidden field", method: "GET", path: "Patient?birthdate=1815-12-10", status: 403, hides: []string{"1815-12-10\""}},
	{role: "member with a policy", what: "PUT birthDate", method: "PUT", path: "Patient/{patient}", body: edit(func(v map[string]any) { v["birthDate"] = "2000-01-01" }), status: 403, names: "birthDate", stored: storedHas("birthDate", "1815-12-10")},
	{role: "member with a policy", what: "patch copy birthDate out", method: "PATCH", path: "Patient/{patient}", body: `[{"op":"copy","from":"/birthDate","path":"/language"}]`, status: 400, hides: []string{"1815-12-10"}},
	{role: "member with a policy", what: "patch gender", method: "PATCH", path: "Patient/{patient}", body: `[{"op":"replace","path":"/gender","value":"male"}]`, status: 403, names: "gender", stored: storedHas("gender", "female")},
	{role: "member with a policy", what: "PUT gender", method: "PUT", path: "Patient/{patient}", body: edit(func(v map[string]any) { v["gender"] = "other" }), status: 403, names: "gender", stored: storedHas("gender", "female")},
	{role: "member with a policy", what: "PUT what it sees", method: "PUT", path: "Patient/{patient}", body: edit(func(v map[string]any) { v["active"] = true }), status: 200, stored: storedHas("birthDate", "1815-12-10")},
	{role: "member with a policy", what: "read a vip", method: "GET", path: "Patient/{vip}", status: 200, hides: []string{vipPhone, "telecom"}},
	{role: "member with a policy", what: "patch a vip's gender", method: "PATCH", path: "Patient/{vip}", body: `[{"op":"replace","path":"/gender","value":"female"}]`, status: 200, stored: storedHas("gender", "female")},
}

func (w *world) expand(s string) string {
	return strings.NewReplacer("{project}", w.project, "{bot}", w.botID, "{user}", w.userID, "{client}", w.targets["ClientApplication"],
		"{patient}", w.targets["Patient"], "{vip}", w.vip, "{binary}", w.targets["Binary"], "{botMembership}", w.botMembership).Replace(s)
}

func runFieldCases(t *testing.T, viaHTTP bool) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		w := newWorld(t, s)
		actors := map[string]actor{}
		for _, tc := range fieldCases {
			t.Run(tc.role+"/"+tc.what, func(t *testing.T) {
				act, ok := actors[tc.role]
				if !ok {
					act = w.actorFor(t, tc.role, viaHTTP)
					actors[tc.role] = act
				}
				path := w.expand(tc.path)
				var body any
				switch b := tc.body.(type) {
				case edit:
					st, raw := act.do(t, "GET", path, nil, "")
					var view map[string]any
					if st != 200 || json.Unmarshal(raw, &view) != nil {
						t.Fatalf("view of %s: %d %s", path, st, raw)
					}
					b(view)
					body = view
				case string:
					body = w.expand(b)
				default:
					body = b
				}
				ct := ""
				if tc.method == "PATCH" {
					ct = jsonPatch
				}
				typ, id, _ := strings.Cut(strings.Split(path, "?")[0], "/")
				id, _, _ = strings.Cut(id, "/")
				before := ""
				if id != "" {
					before = w.stored(t, typ, id)
				}
				status, out := act.do(t, tc.method, path, body, ct)
				if status != tc.status {
					t.Errorf("%s %s: %d, want %d: %.300s", tc.method, path, status, tc.status, out)
				}
				if tc.names != "" && !strings.Contains(string(out), tc.names) {
					t.Errorf("the refusal does not name %s: %s", tc.names, out)
				}
				for _, h := range tc.hides {
					if strings.Contains(string(out), h) {
						t.Errorf("the answer shows %s: %.400s", h, out)
					}
				}
				if id == "" {
					return
				}
				after := w.stored(t, typ, id)
				if status >= 400 && after != before {
					t.Errorf("refused, but the stored resource changed:\n%s\nwas\n%s", after, before)
				}
				if tc.stored != nil {
					var m map[string]any
					json.Unmarshal([]byte(after), &m)
					tc.stored(t, m)
				}
			})
		}
	})
}

// TestFieldRulesHTTP and TestFieldRulesService: every field rule in play,
// by every method that could reach it, through the real server and through
// the service without HTTP, on both stores.
func TestFieldRulesHTTP(t *testing.T)    { runFieldCases(t, true) }
func TestFieldRulesService(t *testing.T) { runFieldCases(t, false) }
