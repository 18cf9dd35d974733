package fhirapi_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// BenchmarkExecuteCEcho is one $execute of the C echo example through the
// real HTTP server (auth, bot lookup, event, sandbox, answer), per backend,
// with an AuditEvent written for every execution (the default) and only for
// failures (auditEventTrigger on-error).
func BenchmarkExecuteCEcho(b *testing.B) {
	wasm := readWasm(b, "../../../examples/c-echo/c-echo.wasm")
	for _, be := range storetest.Backends(b) {
		for _, trigger := range []string{"always", "on-error"} {
			b.Run(be.Name+"/audit-"+trigger, func(b *testing.B) { benchExecute(b, be, wasm, trigger) })
		}
	}
}

func benchExecute(b *testing.B, be storetest.Backend, wasm []byte, trigger string) {
	{
		{
			s := servertest.Start(b, be)
			c := s.NewProject(b, "bench-bots")
			bot := map[string]any{"resourceType": "Bot", "name": "echo", "auditEventTrigger": trigger}
			id := c.Create(bot)["id"].(string)
			if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
				b.Fatalf("deploy: %d %s", r.Status, r.Body)
			}
			url := s.URL + "fhir/R4/Bot/" + id + "/$execute"
			body := []byte(`{"name":"bench"}`)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer "+c.Token)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
			})
		}
	}
}
