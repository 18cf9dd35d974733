package examples

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/sdk/hl7"
)

// TestExamplesThroughTheServer deploys every example to a real server, on
// each store, and executes it the way a client would.
func TestExamplesThroughTheServer(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "examples")
		deploy := func(dir, file string) string {
			t.Helper()
			wasm, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				t.Fatal(err)
			}
			id := c.Create(map[string]any{"resourceType": "Bot", "name": dir})["id"].(string)
			if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
				t.Fatalf("deploy %s: %d %s", dir, r.Status, r.Body)
			}
			return id
		}
		exec := func(id, body, ct string) *servertest.Response {
			return c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", body, ct)
		}

		t.Run("hello", func(t *testing.T) {
			r := exec(deploy("hello", "hello.wasm"), `{"name":"Ada"}`, "application/json")
			if r.Status != 200 || string(r.Body) != `{"greeting":"Hello, Ada"}` {
				t.Errorf("%d %s", r.Status, r.Body)
			}
		})
		t.Run("hl7-ack", func(t *testing.T) {
			msg := "MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240102030405||ORU^R01^ORU_R01|CTRL-42|P|2.5.1\rPID|1||123^^^MRN||Doe^Jane\r"
			r := exec(deploy("hl7-ack", "hl7-ack.wasm"), msg, "x-application/hl7-v2+er7")
			if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "x-application/hl7-v2+er7") {
				t.Fatalf("%d %q %s", r.Status, r.Header.Get("Content-Type"), r.Body)
			}
			ack, err := hl7.Parse(r.Body)
			if err != nil {
				t.Fatalf("ACK does not parse: %v\n%q", err, r.Body)
			}
			if ack.Value("MSA-1") != "AA" || ack.Value("MSA-2") != "CTRL-42" || ack.Value("MSH-3") != "EHR" || ack.Value("MSH-5") != "LAB" {
				t.Errorf("ACK = %q", r.Body)
			}
		})
		t.Run("fhir-patient", func(t *testing.T) {
			id := deploy("fhir-patient", "fhir-patient.wasm")
			r := exec(id, `{"resourceType":"Patient","name":[{"family":"Example"}]}`, "application/fhir+json")
			if r.Status != 201 || r.JSON()["resourceType"] != "Patient" {
				t.Fatalf("create: %d %s", r.Status, r.Body)
			}
			pid := r.JSON()["id"].(string)
			if r := exec(id, `{"id":"`+pid+`"}`, "application/json"); r.Status != 200 || r.JSON()["id"] != pid {
				t.Errorf("read: %d %s", r.Status, r.Body)
			}
			if r := c.Do("GET", "fhir/R4/Patient/"+pid, nil, ""); r.Status != 200 {
				t.Errorf("the bot's Patient is in the project: %d", r.Status)
			}
		})
		t.Run("c-echo", func(t *testing.T) {
			if r := exec(deploy("c-echo", "c-echo.wasm"), "ping", "text/plain"); r.Status != 200 || string(r.Body) != "ping" {
				t.Errorf("%d %s", r.Status, r.Body)
			}
		})
		t.Run("wasi-command", func(t *testing.T) {
			if r := exec(deploy("wasi-command", "wasi-command.wasm"), "stressed", "text/plain"); r.Status != 200 || string(r.Body) != "desserts" {
				t.Errorf("%d %s", r.Status, r.Body)
			}
		})
	})
}
