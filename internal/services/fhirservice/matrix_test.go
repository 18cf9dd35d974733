package fhirservice_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/store"
)

// The authorization matrix: for each role, each resource type in play and
// each interaction, the outcome, and on a refusal, that the stored resource
// (or, for a create, the count of the type) is unchanged. The same table
// runs through the real server over HTTP (TestMatrixHTTP) and through the
// FHIR service's dispatcher without HTTP (TestMatrixService).

// Search outcomes: the target is in the Bundle, or the Bundle lacks it.
const (
	seen   = 200
	unseen = 1200
)

// cell is the expected status of each interaction class on one type: read
// (read, vread, history), search, create, update (PUT and every patch op),
// delete.
type cell struct{ read, search, create, update, delete int }

var (
	all       = cell{200, seen, 201, 200, 200}
	readOnly  = cell{200, seen, 403, 403, 403}
	nothing   = cell{403, 403, 403, 403, 403}
	invisible = cell{404, unseen, 201, 404, 404}
)

// matrixTypes are the types in play, in the order their cells run (each
// cell ends with its delete: Project and the acting bot's own Bot last).
var matrixTypes = []string{"Patient", "Binary", "ClientApplication", "AccessPolicy", "User", "ProjectMembership", "Project", "Bot"}

// matrix is the table: role, then type.
var matrix = map[string]map[string]cell{
	"super admin": {
		"Patient": all, "Binary": all, "ClientApplication": all, "AccessPolicy": all,
		"User": all, "ProjectMembership": all, "Project": all, "Bot": all,
	},
	"project admin": {
		"Patient": all, "Binary": all, "ClientApplication": all, "AccessPolicy": all,
		"User": readOnly, "ProjectMembership": readOnly, "Project": {200, seen, 403, 200, 403}, "Bot": all,
	},
	"member": {
		"Patient": all, "Binary": all, "ClientApplication": all, "AccessPolicy": nothing,
		"User": nothing, "ProjectMembership": nothing, "Project": nothing, "Bot": all,
	},
	// Its policy: Patient (birthDate hidden, gender read-only), Binary read
	// only, Bot only "Bot?name=nobody".
	"member with a policy": {
		"Patient": all, "Binary": readOnly, "ClientApplication": nothing, "AccessPolicy": nothing,
		"User": nothing, "ProjectMembership": nothing, "Project": nothing, "Bot": {404, unseen, 403, 404, 404},
	},
	// The project's bot, acting through its own membership on its own Bot
	// and its own membership.
	"bot": {
		"Patient": all, "Binary": all, "ClientApplication": all, "AccessPolicy": nothing,
		"User": nothing, "ProjectMembership": nothing, "Project": nothing, "Bot": all,
	},
	"another project's admin": {
		"Patient": invisible, "Binary": invisible, "ClientApplication": invisible, "AccessPolicy": invisible,
		"User": {404, unseen, 403, 403, 403}, "ProjectMembership": {404, unseen, 403, 403, 403},
		"Project": {404, unseen, 403, 404, 403}, "Bot": invisible,
	},
}

// actor performs FHIR requests as one principal; URLs are relative to the
// FHIR base.
type actor interface {
	do(t *testing.T, method, url string, body any, contentType string) (int, []byte)
}

// httpActor is a client of the real server.
type httpActor struct{ c *servertest.Client }

func (a httpActor) do(t *testing.T, method, url string, body any, ct string) (int, []byte) {
	t.Helper()
	r := a.c.DoWith(method, "fhir/R4/"+url, body, ct, map[string]string{"Accept": "application/fhir+json"})
	return r.Status, r.Body
}

// serviceActor calls the FHIR service's dispatcher directly.
type serviceActor struct {
	svc *fhirservice.Service
	p   *principal.Principal
}

func (a serviceActor) do(t *testing.T, method, url string, body any, ct string) (int, []byte) {
	t.Helper()
	req := &fhirservice.Request{Method: method, URL: url, Accept: "application/fhir+json"}
	if body != nil {
		req.Body = bodyBytes(t, body)
		req.ContentType = ct
		if ct == "" {
			req.ContentType = "application/fhir+json"
		}
	}
	resp := a.svc.Do(context.Background(), a.p, req)
	return resp.Status, resp.Body
}

// botActor asks the world's JavaScript relay bot to make the request
// through its in-process FHIR access: the bot's own principal, over HTTP.
type botActor struct {
	c     *servertest.Client
	botID string
}

func (a botActor) do(t *testing.T, method, url string, body any, ct string) (int, []byte) {
	t.Helper()
	in := map[string]any{"method": method, "url": url}
	if body != nil {
		var v any
		if err := json.Unmarshal(bodyBytes(t, body), &v); err != nil {
			t.Fatalf("relay body: %v", err)
		}
		in["body"] = v
	}
	r := a.c.Do("POST", "fhir/R4/Bot/"+a.botID+"/$execute", in, "application/json")
	var out struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}
	if r.Status != 200 || json.Unmarshal(r.Body, &out) != nil || out.Status == 0 {
		t.Fatalf("relay %s %s: %d %s", method, url, r.Status, r.Body)
	}
	return out.Status, []byte(out.Body)
}

// relayJS makes each execution one FHIR request given as its input.
const relayJS = `exports.handler = async (medplum, event) => {
  const { method, url, body } = event.input;
  const init = { method };
  if (body !== undefined) init.body = JSON.stringify(body);
  const res = await fetch(medplum.getBaseUrl() + 'fhir/R4/' + url, init);
  return { status: res.status, body: await res.text() };
};`

func bodyBytes(t *testing.T, body any) []byte {
	switch b := body.(type) {
	case string:
		return []byte(b)
	case []byte:
		return b
	}
	js, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// world is one project A with every kind of principal and a target of each
// type, plus another project B with its admin. Each role acts in a world of
// its own, since its deletes remove the targets.
type world struct {
	s             *servertest.Server
	super, admin  *servertest.Client
	member        *servertest.Client
	policyMember  *servertest.Client
	other         *servertest.Client
	project       string
	policy        string
	botID         string
	botMembership string
	userID        string
	practitioner  string
	relay         bool // the bot runs the relay (JavaScript engine available)
	targets       map[string]string
	vip           string // a Patient the policy's first entry (criteria name=vip) covers
}

func ok(t *testing.T, what string, r *servertest.Response, status int) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: %d %s", what, r.Status, r.Body)
	}
	return r.JSON()
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }

func membershipOf(t *testing.T, c *servertest.Client, user string) string {
	t.Helper()
	r := ok(t, "membership of "+user, c.Do("GET", "fhir/R4/ProjectMembership?user="+user, nil, ""), 200)
	entries, _ := r["entry"].([]any)
	if len(entries) != 1 {
		t.Fatalf("memberships of %s: %v", user, r)
	}
	return servertest.Field(entries[0], "resource", "id").(string)
}

func newWorld(t *testing.T, s *servertest.Server) *world {
	t.Helper()
	w := &world{s: s, super: s.SuperAdmin(t), targets: map[string]string{}}
	w.admin = s.NewProject(t, "A")
	w.project = w.admin.ProjectID
	w.member = s.NewMember(t, w.project, "member", false)
	w.policyMember = s.NewMember(t, w.project, "policy member", false)
	w.other = s.NewProject(t, "B")
	a := w.admin
	jp := "application/json-patch+json"

	w.policy = str(ok(t, "policy", a.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "limited", "language": "fr",
		"resource": []any{
			map[string]any{"resourceType": "Patient", "criteria": "Patient?name=vip", "hiddenFields": []any{"telecom"}},
			map[string]any{"resourceType": "Patient", "hiddenFields": []any{"birthDate"}, "readonlyFields": []any{"gender"}},
			map[string]any{"resourceType": "Binary", "readonly": true},
			map[string]any{"resourceType": "Bot", "criteria": "Bot?name=nobody"},
		}}, ""), 201), "id")
	pmid := membershipOf(t, a, "ClientApplication/"+w.policyMember.ClientID)
	ok(t, "attach policy", a.Do("PATCH", "admin/projects/"+w.project+"/members/"+pmid,
		`[{"op":"add","path":"/accessPolicy","value":{"reference":"AccessPolicy/`+w.policy+`"}}]`, jp), 200)

	w.botID = str(ok(t, "bot", a.Do("POST", "admin/projects/"+w.project+"/bot", map[string]any{"name": "x", "runtimeVersion": "vmcontext"}, "application/json"), 201), "id")
	w.botMembership = membershipOf(t, a, "Bot/"+w.botID)
	dep := a.Do("POST", "fhir/R4/Bot/"+w.botID+"/$deploy", map[string]any{"code": relayJS, "filename": "relay.js"}, "application/json")
	switch {
	case dep.Status == 200:
		w.relay = true
	case os.Getenv("CI") != "":
		t.Fatalf("deploy relay bot: %d %s", dep.Status, dep.Body)
	}

	inv := ok(t, "invite", a.Do("POST", "admin/projects/"+w.project+"/invite", map[string]any{"resourceType": "Practitioner",
		"firstName": "Ada", "lastName": "L", "email": fmt.Sprintf("ada-%s@example.com", w.project[:8]), "sendEmail": false, "scope": "project"}, "application/json"), 200)
	_, w.userID, _ = fhir.SplitReference(servertest.Field(inv, "user", "reference").(string))
	w.practitioner = servertest.Field(inv, "profile", "reference").(string)

	client := ok(t, "client", a.Do("POST", "admin/projects/"+w.project+"/client", map[string]any{"name": "cl"}, "application/json"), 201)
	patient := ok(t, "patient", a.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "language": "fr", "gender": "female", "birthDate": "1815-12-10"}, ""), 201)
	binary := ok(t, "binary", a.Do("POST", "fhir/R4/Binary", map[string]any{"resourceType": "Binary", "language": "fr", "contentType": "text/plain", "data": "aGk="}, ""), 201)
	w.targets = map[string]string{
		"Patient": str(patient, "id"), "Binary": str(binary, "id"), "ClientApplication": str(client, "id"),
		"AccessPolicy": w.policy, "User": w.userID, "ProjectMembership": w.botMembership, "Project": w.project, "Bot": w.botID,
	}
	// Every target starts with language "fr", which the interactions change.
	for _, typ := range []string{"ClientApplication", "User", "ProjectMembership", "Project", "Bot"} {
		ok(t, "language of "+typ, w.super.Do("PATCH", "fhir/R4/"+typ+"/"+w.targets[typ], `[{"op":"add","path":"/language","value":"fr"}]`, jp), 200)
	}

	// What only super admins set, and what nobody reads.
	ok(t, "super admin's project fields", w.super.Do("PATCH", "fhir/R4/Project/"+w.project, `[
		{"op":"add","path":"/systemSecret","value":[{"name":"k","valueString":"`+systemSecretValue+`"}]},
		{"op":"add","path":"/features","value":["bots"]},
		{"op":"add","path":"/systemSetting","value":[{"name":"s","valueString":"v"}]}]`, jp), 200)
	ok(t, "bot timeout", w.super.Do("PATCH", "fhir/R4/Bot/"+w.botID, `[{"op":"add","path":"/timeout","value":10}]`, jp), 200)
	if _, err := s.Store.Update(context.Background(), store.AllProjects, "User", w.userID, store.Write{Author: fhir.Reference{Reference: "system"}},
		func(u fhir.Resource) (fhir.Resource, error) { u["passwordHash"] = passwordHashValue; return u, nil }); err != nil {
		t.Fatal(err)
	}
	w.vip = str(ok(t, "vip patient", a.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "vip"}},
		"gender": "male", "birthDate": "1900-01-01", "telecom": []any{map[string]any{"system": "phone", "value": vipPhone}}}, ""), 201), "id")
	return w
}

// Values the field tests look for in answers that must not show them.
const (
	systemSecretValue = "system-secret-value-42"
	passwordHashValue = "$2a$10$not-a-real-hash-but-secret"
	vipPhone          = "555-0199-vip"
)

// actorFor is the actor of a role in w, over HTTP or through the service.
func (w *world) actorFor(t *testing.T, role string, viaHTTP bool) actor {
	t.Helper()
	clients := map[string]*servertest.Client{"super admin": w.super, "project admin": w.admin, "member": w.member,
		"member with a policy": w.policyMember, "another project's admin": w.other}
	if viaHTTP {
		if role == "bot" {
			if !w.relay {
				t.Skip("JavaScript engine not fetched (make js): the bot's HTTP rows need the relay bot")
			}
			return botActor{c: w.admin, botID: w.botID}
		}
		return httpActor{clients[role]}
	}
	ctx := context.Background()
	var p *principal.Principal
	var err error
	if role == "bot" {
		p, err = principal.ForUser(ctx, w.s.Store, "Bot/"+w.botID)
	} else {
		c := clients[role]
		p, err = principal.ForUser(ctx, w.s.Store, "ClientApplication/"+c.ClientID)
	}
	if err != nil || p == nil {
		t.Fatalf("principal of %s: %v", role, err)
	}
	return serviceActor{svc: w.s.Service, p: p}
}

// stored is the stored JSON of typ/id ("" when gone).
func (w *world) stored(t *testing.T, typ, id string) string {
	t.Helper()
	rec, err := w.s.Store.Read(context.Background(), store.AllProjects, typ, id)
	if fhir.IsCode(err, fhir.EGone) || fhir.IsCode(err, fhir.ENotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(rec.JSON)
}

// count is how many resources of typ exist, in every project.
func (w *world) count(t *testing.T, typ string) int {
	t.Helper()
	req, err := fhir.ParseSearch(typ, "_count=0&_total=accurate")
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.s.Store.Search(context.Background(), store.AllProjects, req)
	if err != nil {
		t.Fatal(err)
	}
	return *res.Total
}

// createBody is a new resource of typ that its role may write in full.
func (w *world) createBody(typ string) map[string]any {
	b := map[string]any{"resourceType": typ, "language": "fr"}
	switch typ {
	case "Binary":
		b["contentType"], b["data"] = "text/plain", "aGk="
	case "ClientApplication", "Bot", "AccessPolicy", "Project":
		b["name"] = "new " + typ
	case "User":
		b["firstName"], b["lastName"] = "New", "User"
	case "ProjectMembership":
		b["project"] = map[string]any{"reference": "Project/" + w.project}
		b["user"] = map[string]any{"reference": "User/" + w.userID}
		b["profile"] = map[string]any{"reference": w.practitioner}
	}
	return b
}

func runMatrix(t *testing.T, viaHTTP bool) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		for _, role := range []string{"super admin", "project admin", "member", "member with a policy", "bot", "another project's admin"} {
			t.Run(role, func(t *testing.T) {
				w := newWorld(t, s)
				act := w.actorFor(t, role, viaHTTP)
				for _, typ := range matrixTypes {
					runCell(t, w, act, role, typ, matrix[role][typ])
				}
			})
		}
	})
}

func TestMatrixHTTP(t *testing.T)    { runMatrix(t, true) }
func TestMatrixService(t *testing.T) { runMatrix(t, false) }

func runCell(t *testing.T, w *world, act actor, role, typ string, want cell) {
	id := w.targets[typ]
	path := typ + "/" + id
	var cur map[string]any
	if err := json.Unmarshal([]byte(w.stored(t, typ, id)), &cur); err != nil {
		t.Fatalf("%s: stored %s: %v", role, path, err)
	}
	vid := servertest.Field(cur, "meta", "versionId").(string)
	check := func(what string, status, want int, body []byte, before string) {
		t.Helper()
		if status != want {
			t.Errorf("%s %s %s: %d, want %d: %.300s", role, what, path, status, want, body)
		}
		if status >= 400 && before != "" {
			if after := w.stored(t, typ, id); after != before {
				t.Errorf("%s %s %s was refused (%d) but changed the stored resource:\n%s\nwas\n%s", role, what, path, status, after, before)
			}
		}
	}

	for _, op := range []struct{ what, url string }{{"read", path}, {"vread", path + "/_history/" + vid}, {"history", path + "/_history"}} {
		status, body := act.do(t, "GET", op.url, nil, "")
		check(op.what, status, want.read, body, "")
	}
	status, body := act.do(t, "GET", typ+"?_id="+id, nil, "")
	if status == 200 {
		if strings.Contains(string(body), `"id":"`+id+`"`) {
			status = seen
		} else {
			status = unseen
		}
	}
	check("search", status, want.search, body, "")

	// PUT: the resource as the actor sees it (or as stored when it cannot
	// read it), with one plain field changed.
	view := cur
	if st, b := act.do(t, "GET", path, nil, ""); st == 200 {
		view = nil
		if err := json.Unmarshal(b, &view); err != nil {
			t.Fatalf("%s read %s: %v", role, path, err)
		}
	}
	view["language"] = "de"
	before := w.stored(t, typ, id)
	status, body = act.do(t, "PUT", path, view, "")
	check("update", status, want.update, body, before)
	if status == 200 && !strings.Contains(w.stored(t, typ, id), `"language":"de"`) {
		t.Errorf("%s update %s: answered 200, stored %s", role, path, w.stored(t, typ, id))
	}
	for _, patch := range []string{
		`[{"op":"add","path":"/language","value":"es"}]`,
		`[{"op":"replace","path":"/language","value":"it"}]`,
		`[{"op":"test","path":"/language","value":"it"}]`,
		`[{"op":"copy","from":"/language","path":"/implicitRules"}]`,
		`[{"op":"move","from":"/implicitRules","path":"/language"}]`,
		`[{"op":"remove","path":"/language"}]`,
	} {
		before := w.stored(t, typ, id)
		status, body := act.do(t, "PATCH", path, patch, "application/json-patch+json")
		check("patch "+patch, status, want.update, body, before)
	}

	n := w.count(t, typ)
	status, body = act.do(t, "POST", typ, w.createBody(typ), "")
	check("create", status, want.create, body, "")
	if status >= 400 && w.count(t, typ) != n {
		t.Errorf("%s create %s was refused (%d) but a resource was created", role, typ, status)
	}

	before = w.stored(t, typ, id)
	status, body = act.do(t, "DELETE", path, nil, "")
	check("delete", status, want.delete, body, before)
	if status == 200 && w.stored(t, typ, id) != "" {
		t.Errorf("%s delete %s: answered 200, still stored", role, path)
	}
}
