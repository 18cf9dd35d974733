package examples

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/sdk/hl7"
)

// TestJSExamplesThroughTheServer deploys every JavaScript example to a real
// server, on each store, as `medplum bot deploy` does (JSON {code, filename}
// with the code as text), and executes it. (compat/cli.test.mjs deploys them
// with the official CLI and runs them through @medplum/core.)
func TestJSExamplesThroughTheServer(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "js-examples")
		deploy := func(file string) string {
			t.Helper()
			code, err := os.ReadFile(filepath.Join("js", file))
			if err != nil {
				t.Fatal(err)
			}
			id := c.Create(map[string]any{"resourceType": "Bot", "name": file, "runtimeVersion": "vmcontext"})["id"].(string)
			r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", map[string]any{"code": string(code), "filename": file}, "")
			if r.Status == 400 && strings.Contains(r.Issue(), "make js") && os.Getenv("CI") == "" {
				t.Skip("JavaScript engine not fetched (make js)")
			}
			if r.Status != 200 {
				t.Fatalf("deploy %s: %d %s", file, r.Status, r.Body)
			}
			return id
		}
		exec := func(id, body, ct string) *servertest.Response {
			return c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", body, ct)
		}
		t.Run("hello", func(t *testing.T) {
			r := exec(deploy("hello.js"), `{"name":"Ada"}`, "application/json")
			if r.Status != 200 || string(r.Body) != `{"greeting":"Hello, Ada"}` {
				t.Errorf("%d %s", r.Status, r.Body)
			}
		})
		t.Run("hl7-ack", func(t *testing.T) {
			msg := "MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240102030405||ORU^R01^ORU_R01|CTRL-42|P|2.5.1\rPID|1||123^^^MRN||Doe^Jane\r"
			r := exec(deploy("hl7-ack.js"), msg, "x-application/hl7-v2+er7")
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
		t.Run("patients", func(t *testing.T) {
			id := deploy("patients.js")
			r := exec(id, `{"given":"Ada","family":"Lovelace"}`, "application/json")
			var out struct {
				Created struct{ Reference string }
				Found   []string
			}
			if r.Status != 200 || json.Unmarshal(r.Body, &out) != nil || !strings.HasPrefix(out.Created.Reference, "Patient/") ||
				len(out.Found) != 1 || out.Found[0] != out.Created.Reference {
				t.Fatalf("%d %s", r.Status, r.Body)
			}
			if r := exec(id, `{"given":"Ada"}`, "application/json"); r.Status != 400 || r.Issue() != "family is required" {
				t.Errorf("missing family: %d %s", r.Status, r.Body)
			}
		})
	})
}
