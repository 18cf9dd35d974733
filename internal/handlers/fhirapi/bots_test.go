package fhirapi_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

func readWasm(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const adtA01 = "MSH|^~\\&|SENDER|FAC|RECV|FAC2|20240101120000||ADT^A01^ADT_A01|MSG00001|P|2.5.1\rPID|1||12345^^^MRN||Doe^John\r"

func TestBotDeployAndExecute(t *testing.T) {
	echo := readWasm(t, "../../../examples/c-echo/c-echo.wasm")
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "bots")
		bot := c.Create(map[string]any{"resourceType": "Bot", "name": "echo",
			"identifier": []any{map[string]any{"system": "https://example.com/bots", "value": "echo"}}})
		id := bot["id"].(string)

		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "x", "text/plain"); r.Status != 400 {
			t.Errorf("execute before deploy: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", echo, "application/wasm"); r.Status != 200 {
			t.Fatalf("raw deploy: %d %s", r.Status, r.Body)
		}
		dep := map[string]any{"code": base64.StdEncoding.EncodeToString(echo), "filename": "echo.wasm.b64"}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", dep, ""); r.Status != 200 {
			t.Fatalf("JSON deploy: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", []byte("not wasm"), "application/wasm"); r.Status != 400 || !strings.Contains(r.Issue(), "Invalid bot module") {
			t.Errorf("bad module deploy: %d %s", r.Status, r.Body)
		}

		cases := []struct {
			name, method, path, body, ct string
			status                       int
			wantCT, wantBody             string
		}{
			{"text", "POST", "Bot/" + id + "/$execute", "hello", "text/plain", 200, "text/plain; charset=utf-8", "hello"},
			{"json", "POST", "Bot/" + id + "/$execute", `{"a":1}`, "application/json", 200, "application/json; charset=utf-8", `{"a":1}`},
			{"fhir", "POST", "Bot/" + id + "/$execute", `{"resourceType":"Patient","id":"p"}`, "application/fhir+json", 200, "application/json; charset=utf-8", `{"resourceType":"Patient","id":"p"}`},
			{"form", "POST", "Bot/" + id + "/%24execute", "a=1&b=2&b=3", "application/x-www-form-urlencoded", 200, "application/json; charset=utf-8", `{"a":"1","b":["2","3"]}`},
			{"hl7", "POST", "Bot/" + id + "/$execute", adtA01, "x-application/hl7-v2+er7", 200, "x-application/hl7-v2+er7; charset=utf-8", adtA01},
			{"get", "GET", "Bot/" + id + "/$execute?x=1", "", "", 200, "application/json; charset=utf-8", `{"x":"1"}`},
			{"trailing path", "POST", "Bot/" + id + "/$execute/extra/path", "t", "text/plain", 200, "text/plain; charset=utf-8", "t"},
			{"by identifier", "GET", "Bot/$execute?identifier=https://example.com/bots|echo&y=2", "", "", 200, "application/json; charset=utf-8", `{"y":"2"}`},
			{"identifier post", "POST", "Bot/%24execute?identifier=https%3A%2F%2Fexample.com%2Fbots%7Cecho", "z", "text/plain", 200, "text/plain; charset=utf-8", "z"},
			{"unknown identifier", "GET", "Bot/$execute?identifier=nope|nope", "", "", 404, "", ""},
			{"no id", "POST", "Bot/$execute", "x", "text/plain", 400, "", ""},
			{"bad hl7", "POST", "Bot/" + id + "/$execute", "PID|1\r", "x-application/hl7-v2+er7", 400, "", ""},
			{"bad json", "POST", "Bot/" + id + "/$execute", "{", "application/json", 400, "", ""},
			{"fhir without resourceType", "POST", "Bot/" + id + "/$execute", `{"a":1}`, "application/fhir+json", 400, "", ""},
			{"unsupported type", "POST", "Bot/" + id + "/$execute", "x", "image/png", 415, "", ""},
		}
		for _, tc := range cases {
			var body any
			if tc.body != "" {
				body = tc.body
			}
			r := c.Do(tc.method, "fhir/R4/"+tc.path, body, tc.ct)
			if r.Status != tc.status {
				t.Errorf("%s: status %d, want %d: %s", tc.name, r.Status, tc.status, r.Body)
				continue
			}
			if tc.wantCT != "" && r.Header.Get("Content-Type") != tc.wantCT {
				t.Errorf("%s: content type %q, want %q", tc.name, r.Header.Get("Content-Type"), tc.wantCT)
			}
			if tc.wantBody != "" && string(r.Body) != tc.wantBody {
				t.Errorf("%s: body %q, want %q", tc.name, r.Body, tc.wantBody)
			}
		}
		// A bad HL7 body names the position.
		r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "MSH|^~\\&|A\rPID|1\rgarbage here\r", "x-application/hl7-v2+er7")
		if r.Status != 400 || !strings.Contains(r.Issue(), "byte") {
			t.Logf("bad HL7 answer: %d %s", r.Status, r.Body)
		}
		// Another project cannot run it.
		other := s.NewProject(t, "other")
		if r := other.Do("POST", "fhir/R4/Bot/"+id+"/$execute", "x", "text/plain"); r.Status != 404 {
			t.Errorf("cross-project execute: %d %s", r.Status, r.Body)
		}
		var deployed map[string]any
		json.Unmarshal(c.Do("GET", "fhir/R4/Bot/"+id, nil, "").Body, &deployed)
		code, _ := deployed["executableCode"].(map[string]any)
		if code["contentType"] != "application/wasm" || !strings.HasPrefix(code["url"].(string), "Binary/") {
			t.Errorf("executableCode = %v", code)
		}
	})
}
