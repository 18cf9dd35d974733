package fhirapi_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// botMemberships are the memberships whose user is Bot/id, as the project's
// admin c finds them.
func botMemberships(t *testing.T, c *servertest.Client, id string) []map[string]any {
	t.Helper()
	r := c.Do("GET", "fhir/R4/ProjectMembership?user=Bot/"+id, nil, "")
	if r.Status != 200 {
		t.Fatalf("membership search: %d %s", r.Status, r.Body)
	}
	var out []map[string]any
	for _, e := range entries(t, r) {
		res, _ := e["resource"].(map[string]any)
		out = append(out, res)
	}
	return out
}

// wantBotMembership checks that Bot/id has exactly one membership, its own
// (user and profile the Bot), in project pid, not admin, written for author.
func wantBotMembership(t *testing.T, what string, c *servertest.Client, id, pid, author string) map[string]any {
	t.Helper()
	ms := botMemberships(t, c, id)
	if len(ms) != 1 {
		t.Errorf("%s: Bot/%s has %d memberships, want 1: %v", what, id, len(ms), ms)
		return nil
	}
	m := ms[0]
	if str(m, "user", "reference") != "Bot/"+id || str(m, "profile", "reference") != "Bot/"+id ||
		str(m, "project", "reference") != "Project/"+pid || m["admin"] == true {
		t.Errorf("%s: membership %v", what, m)
	}
	if author != "" && str(m, "meta", "author", "reference") != author {
		t.Errorf("%s: membership author %q, want %q", what, str(m, "meta", "author", "reference"), author)
	}
	return m
}

// A Bot created as the README creates it (POST /fhir/R4/Bot) can use the FHIR
// API: it has its membership, made with it (medplum/medplum#8685: on the
// reference such a bot has none and its every FHIR call fails).
func TestFHIRCreatedBotCallsFHIR(t *testing.T) {
	wasm := readWasm(t, "../../../examples/fhir-patient/fhir-patient.wasm")
	patientsJS, err := os.ReadFile("../../../examples/js/patients.js")
	if err != nil {
		t.Fatal(err)
	}
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "fhir-created-bot")

		// A WebAssembly bot: the sandbot.fhir import.
		id := c.Create(map[string]any{"resourceType": "Bot", "name": "fhir-patient"})["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
			t.Fatalf("deploy: %d %s", r.Status, r.Body)
		}
		r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"resourceType":"Patient","name":[{"family":"Wasm"}]}`, "application/fhir+json")
		if r.Status != 201 || r.JSON()["resourceType"] != "Patient" {
			t.Errorf("wasm bot's FHIR create: %d %s", r.Status, r.Body)
		}
		wantBotMembership(t, "wasm bot", c, id, c.ProjectID, c.Profile)

		// A JavaScript bot: its MedplumClient, deployed as the README does.
		id = c.Create(map[string]any{"resourceType": "Bot", "name": "patients", "runtimeVersion": "vmcontext"})["id"].(string)
		r = c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", patientsJS, "application/javascript")
		if r.Status == 400 && strings.Contains(r.Issue(), "make js") && os.Getenv("CI") == "" {
			t.Skip("JavaScript engine not fetched (make js)")
		}
		if r.Status != 200 {
			t.Fatalf("deploy patients.js: %d %s", r.Status, r.Body)
		}
		r = c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"given":"Ada","family":"Lovelace"}`, "application/json")
		var out struct {
			Created struct{ Reference string }
			Found   []string
		}
		if r.Status != 200 || json.Unmarshal(r.Body, &out) != nil || !strings.HasPrefix(out.Created.Reference, "Patient/") ||
			len(out.Found) != 1 || out.Found[0] != out.Created.Reference {
			t.Errorf("patients.js: %d %s", r.Status, r.Body)
		}
		wantBotMembership(t, "js bot", c, id, c.ProjectID, c.Profile)
	})
}

// Every path that creates a Bot gives it its membership in the same
// transaction: a conditional create, a batch and a transaction entry, a
// bot's own FHIR call; a transaction that fails leaves neither.
func TestBotMembershipOnEveryPath(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "bot-paths")

		// Conditional create: the first creates (and its membership), the
		// second finds it and creates nothing.
		cond := map[string]any{"resourceType": "Bot", "name": "conditional", "identifier": []any{map[string]any{"system": "urn:test", "value": "cond"}}}
		r := c.DoWith("POST", "fhir/R4/Bot", cond, "", map[string]string{"If-None-Exist": "identifier=urn:test|cond"})
		if r.Status != 201 {
			t.Fatalf("conditional create: %d %s", r.Status, r.Body)
		}
		condID := r.JSON()["id"].(string)
		wantBotMembership(t, "conditional create", c, condID, c.ProjectID, c.Profile)
		if r := c.DoWith("POST", "fhir/R4/Bot", cond, "", map[string]string{"If-None-Exist": "identifier=urn:test|cond"}); r.Status != 200 {
			t.Fatalf("conditional create, found: %d %s", r.Status, r.Body)
		}
		wantBotMembership(t, "conditional create, found", c, condID, c.ProjectID, c.Profile)

		// Batch and transaction entries.
		for _, typ := range []string{"batch", "transaction"} {
			b := map[string]any{"resourceType": "Bundle", "type": typ, "entry": []any{map[string]any{
				"request":  map[string]any{"method": "POST", "url": "Bot"},
				"resource": map[string]any{"resourceType": "Bot", "name": typ}}}}
			r := c.Do("POST", "fhir/R4", b, "")
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", typ, r.Status, r.Body)
			}
			loc := str(entries(t, r)[0], "response", "location")
			id := strings.Split(strings.TrimPrefix(loc[strings.Index(loc, "Bot/"):], "Bot/"), "/")[0]
			wantBotMembership(t, typ, c, id, c.ProjectID, c.Profile)
		}

		// A transaction whose second entry fails keeps neither the Bot nor
		// its membership.
		before := len(entries(t, c.Do("GET", "fhir/R4/ProjectMembership?profile-type=Bot&_count=100", nil, "")))
		failing := map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"request": map[string]any{"method": "POST", "url": "Bot"},
				"resource": map[string]any{"resourceType": "Bot", "name": "rolled back"}},
			map[string]any{"request": map[string]any{"method": "PUT", "url": "Patient/does-not-exist"},
				"resource": map[string]any{"resourceType": "Patient", "id": "other-id"}},
		}}
		if r := c.Do("POST", "fhir/R4", failing, ""); r.Status != 400 || !strings.HasPrefix(r.Issue(), "Bundle.entry[1]") {
			t.Fatalf("failing transaction: want its second entry's 400: %d %s", r.Status, r.Body)
		}
		if bots := entries(t, c.Do("GET", "fhir/R4/Bot?name:exact=rolled%20back", nil, "")); len(bots) != 0 {
			t.Errorf("the failed transaction's Bot was kept: %v", bots)
		}
		if after := len(entries(t, c.Do("GET", "fhir/R4/ProjectMembership?profile-type=Bot&_count=100", nil, ""))); after != before {
			t.Errorf("the failed transaction left a membership: %d Bot memberships before, %d after", before, after)
		}

		// Deleting the Bot deletes its membership (docs/decisions.md 23).
		if r := c.Do("DELETE", "fhir/R4/Bot/"+condID, nil, ""); r.Status != 200 {
			t.Fatalf("delete: %d %s", r.Status, r.Body)
		}
		if ms := botMemberships(t, c, condID); len(ms) != 0 {
			t.Errorf("a deleted Bot's membership stays: %v", ms)
		}

		// A bot's own FHIR call creating a Bot: the new Bot has its membership,
		// written for the creating bot.
		parent := deployJS(t, c, "parent", `exports.handler = async (medplum) => {
  const bot = await medplum.createResource({ resourceType: 'Bot', name: 'child' });
  return { id: bot.id };
};`, nil)
		r = c.Do("POST", "fhir/R4/Bot/"+parent+"/$execute", `{}`, "application/json")
		child, _ := r.JSON()["id"].(string)
		if r.Status != 200 || child == "" {
			t.Fatalf("bot creating a Bot: %d %s", r.Status, r.Body)
		}
		wantBotMembership(t, "created by a bot", c, child, c.ProjectID, "Bot/"+parent)
	})
}

// A Bot made by a caller under an access policy gets that policy, so that
// deploying code to a Bot of one's own never gives more rights than one has;
// a caller without one (an admin here) gives the project's default rights.
func TestBotMembershipKeepsCreatorsPolicy(t *testing.T) {
	wasm := readWasm(t, "../../../examples/fhir-patient/fhir-patient.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "bot-policy-inherit")
		pol := c.Create(map[string]any{"resourceType": "AccessPolicy", "name": "Bots and Observations",
			"resource": []any{map[string]any{"resourceType": "Bot"}, map[string]any{"resourceType": "Binary"},
				map[string]any{"resourceType": "Observation"}}})
		pref := "AccessPolicy/" + pol["id"].(string)
		m := s.NewMember(t, c.ProjectID, "restricted", false)
		mid := entries(t, c.Do("GET", "fhir/R4/ProjectMembership?profile="+m.Profile, nil, ""))[0]["resource"].(map[string]any)["id"].(string)
		if r := c.Do("PATCH", "admin/projects/"+c.ProjectID+"/members/"+mid, []any{map[string]any{"op": "add", "path": "/accessPolicy",
			"value": map[string]any{"reference": pref}}}, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("set policy: %d %s", r.Status, r.Body)
		}

		id := m.Create(map[string]any{"resourceType": "Bot", "name": "member's"})["id"].(string)
		got := wantBotMembership(t, "member under a policy", c, id, c.ProjectID, m.Profile)
		if str(got, "accessPolicy", "reference") != pref {
			t.Errorf("the member's Bot's membership has policy %v, want %s", got["accessPolicy"], pref)
		}
		// The member deploys a bot that creates Patients, which its policy
		// does not let it: neither does the bot's.
		if r := m.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
			t.Fatalf("member's deploy: %d %s", r.Status, r.Body)
		}
		patient := `{"resourceType":"Patient","name":[{"family":"Escalated"}]}`
		if r := m.Do("POST", "fhir/R4/Bot/"+id+"/$execute", patient, "application/fhir+json"); r.Status == 201 || !strings.Contains(string(r.Body), "403") {
			t.Errorf("the member's bot created a Patient its creator may not: %d %s", r.Status, r.Body)
		}
		id = c.Create(map[string]any{"resourceType": "Bot", "name": "admin's"})["id"].(string)
		if got := wantBotMembership(t, "admin", c, id, c.ProjectID, c.Profile); got["accessPolicy"] != nil || got["access"] != nil {
			t.Errorf("the admin's Bot's membership has a policy: %v", got)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
			t.Fatalf("admin's deploy: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", patient, "application/fhir+json"); r.Status != 201 {
			t.Errorf("the admin's bot, with the project's default rights: %d %s", r.Status, r.Body)
		}
		// The admin API's bot route names the policy; the Bot still has one
		// membership, the FHIR service's.
		r := c.Do("POST", "admin/projects/"+c.ProjectID+"/bot", map[string]any{"name": "routed",
			"accessPolicy": map[string]any{"reference": pref}}, "application/json")
		if r.Status != 201 {
			t.Fatalf("admin bot route: %d %s", r.Status, r.Body)
		}
		got = wantBotMembership(t, "admin bot route", c, r.JSON()["id"].(string), c.ProjectID, c.Profile)
		if str(got, "accessPolicy", "reference") != pref {
			t.Errorf("the admin route's policy: %v", got)
		}
		if r := c.Do("POST", "admin/projects/"+c.ProjectID+"/bot", map[string]any{"name": "bad policy",
			"accessPolicy": map[string]any{"reference": "AccessPolicy/nope"}}, "application/json"); r.Status != 400 {
			t.Errorf("an unknown policy: %d %s", r.Status, r.Body)
		}
		if bots := entries(t, c.Do("GET", "fhir/R4/Bot?name:exact=bad%20policy", nil, "")); len(bots) != 0 {
			t.Errorf("a refused bot route kept its Bot: %v", bots)
		}
	})
}
