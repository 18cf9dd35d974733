package adminapi_test

import (
	"os"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// A member's access policy decides which bots it may execute and deploy.
func TestAccessPolicyOnBots(t *testing.T) {
	echo, err := os.ReadFile("../../../examples/c-echo/c-echo.wasm")
	if err != nil {
		t.Fatal(err)
	}
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "bot-policy")
		ca := as(t, s, a.Token)
		allowed := expect(t, ca.Do("POST", "fhir/R4/Bot", map[string]any{"resourceType": "Bot", "name": "allowed"}, ""), 201, "bot")
		other := expect(t, ca.Do("POST", "fhir/R4/Bot", map[string]any{"resourceType": "Bot", "name": "other"}, ""), 201, "bot")
		for _, b := range []map[string]any{allowed, other} {
			expect(t, ca.Do("POST", "fhir/R4/Bot/"+id(b)+"/$deploy", echo, "application/wasm"), 200, "deploy")
		}
		pol := expect(t, ca.Do("POST", "fhir/R4/AccessPolicy", map[string]any{"resourceType": "AccessPolicy", "name": "One bot",
			"resource": []any{map[string]any{"resourceType": "Bot", "readonly": true, "criteria": "Bot?name=allowed"}}}, ""), 201, "policy")
		inv := inviteBody("Practitioner", "Bot", "Runner", "runner@example.com")
		inv["password"] = "bot-runner-pw"
		inv["membership"] = map[string]any{"accessPolicy": map[string]any{"reference": "AccessPolicy/" + id(pol)}}
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/invite", inv, ""), 200, "invite")
		mc := as(t, s, userToken(t, s, "runner@example.com", "bot-runner-pw", a.ProjectID))

		if r := mc.Do("POST", "fhir/R4/Bot/"+id(allowed)+"/$execute", "hi", "text/plain"); r.Status != 200 || string(r.Body) != "hi" {
			t.Errorf("allowed bot: %d %s", r.Status, r.Body)
		}
		expect(t, mc.Do("POST", "fhir/R4/Bot/"+id(other)+"/$execute", "hi", "text/plain"), 404, "bot outside the policy")
		if r := mc.Do("POST", "fhir/R4/Bot/"+id(allowed)+"/$deploy", echo, "application/wasm"); r.Status != 403 {
			t.Errorf("deploy under a readonly policy: %d %s", r.Status, r.Body)
		}
	})
}

// A project setting changed through the admin API applies to the very next
// execution (the bots' project cache is dropped in this process).
func TestBotsSettingAppliesAtOnce(t *testing.T) {
	echo, err := os.ReadFile("../../../examples/c-echo/c-echo.wasm")
	if err != nil {
		t.Fatal(err)
	}
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "bots-setting")
		ca := as(t, s, a.Token)
		bot := expect(t, ca.Do("POST", "fhir/R4/Bot", map[string]any{"resourceType": "Bot", "name": "echo"}, ""), 201, "bot")
		expect(t, ca.Do("POST", "fhir/R4/Bot/"+id(bot)+"/$deploy", echo, "application/wasm"), 200, "deploy")
		expect(t, ca.Do("POST", "fhir/R4/Bot/"+id(bot)+"/$execute", "on", "text/plain"), 200, "bots on")
		off := []any{map[string]any{"name": "bots", "valueBoolean": false}}
		expect(t, ca.Do("POST", "admin/projects/"+a.ProjectID+"/settings", off, "application/json"), 200, "settings")
		if r := ca.Do("POST", "fhir/R4/Bot/"+id(bot)+"/$execute", "off", "text/plain"); r.Status != 400 || r.Issue() != "Bots not enabled" {
			t.Errorf("after bots=false: %d %s", r.Status, r.Body)
		}
	})
}
