package fhirapi_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/wasmtest"
)

// TestProjectCapsBotTimeout: the project setting maxBotTimeout caps every
// execution's deadline, the Bot's timeout and the server's default alike.
func TestProjectCapsBotTimeout(t *testing.T) {
	loop := wasmtest.Reactor(wasmtest.TightLoopBody)
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "capped")
		if r := c.Do("POST", "admin/projects/"+c.ProjectID+"/settings",
			[]any{map[string]any{"name": "maxBotTimeout", "valueInteger": 1}}, "application/json"); r.Status != 200 {
			t.Fatalf("settings: %d %s", r.Status, r.Body)
		}
		for _, timeout := range []any{30, nil} { // the Bot's own, and the server's default (10 s)
			bot := map[string]any{"resourceType": "Bot", "name": "loop"}
			if timeout != nil {
				bot["timeout"] = timeout
			}
			id := c.Create(bot)["id"].(string)
			if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", loop, "application/wasm"); r.Status != 200 {
				t.Fatalf("deploy: %d %s", r.Status, r.Body)
			}
			start := time.Now()
			r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "x", "text/plain")
			if r.Status != 400 || !strings.Contains(r.Issue(), "timed out after 1000 ms") {
				t.Fatalf("Bot timeout %v under a project cap of 1 s: %d %s after %v", timeout, r.Status, r.Body, time.Since(start))
			}
		}
	})
}
