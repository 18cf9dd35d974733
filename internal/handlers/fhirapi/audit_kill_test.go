package fhirapi_test

// An execution's AuditEvent survives a crash right after the answer: the
// sandbot binary (the default audit journal) answers executions of the C
// echo bot from 4 clients and is killed with SIGKILL as soon as the last
// answer arrives; a new process on the same data directory and database
// stores what the dead one had journaled (in the background, as it
// serves). Every answered execution has its AuditEvent, once. (With the
// in-memory queue, the events of the last moments before the kill were
// lost.) Skipped with -short.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

func TestAuditEventsSurviveKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	bin := servertest.BuildBinary(t)
	wasm := readWasm(t, "../../../examples/c-echo/c-echo.wasm")
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dataDir, dbURL := servertest.ProcessStore(t, b)
			p := servertest.StartProcess(t, bin, dataDir, dbURL)
			su := p.SuperAdmin(t)
			bot := deployBot(t, su, wasm, nil)
			const clients, each = 4, 50
			var wg sync.WaitGroup
			answered := make(chan int, clients)
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := 0
					for i := range each {
						if r := su.Do("POST", "fhir/R4/Bot/"+bot+"/$execute", fmt.Sprintf("c%d-%d", c, i), "text/plain"); r.Status == 200 {
							n++
						}
					}
					answered <- n
				}()
			}
			wg.Wait()
			p.Kill()
			close(answered)
			total := 0
			for n := range answered {
				total += n
			}
			if total != clients*each {
				t.Fatalf("%d of %d executions answered 200", total, clients*each)
			}

			// The new process stores them in the background, as it serves.
			p = servertest.StartProcess(t, bin, dataDir, dbURL)
			su = p.SuperAdmin(t)
			var got any
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				r := su.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+bot+"&_total=accurate&_count=0", nil, "")
				if r.Status != 200 {
					t.Fatalf("search: %d %s", r.Status, r.Body)
				}
				if got = r.JSON()["total"]; got == float64(total) || time.Now().After(deadline) {
					break
				}
			}
			if got != float64(total) {
				t.Fatalf("%v AuditEvents 30 s after the kill and restart, want %d (one per answered execution)", got, total)
			}
		})
	}
}
