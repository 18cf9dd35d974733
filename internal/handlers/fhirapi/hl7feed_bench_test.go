package fhirapi_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/internal/mllp"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// BenchmarkHL7Feed measures MLLP messages kept (committed with their task)
// and acknowledged per second: one connection with one message in flight,
// ten connections with one each, and one connection pipelined (the sender
// writes without waiting for each ACK). The channel's bot is a trivial
// JavaScript bot, which runs in the background meanwhile (partitioned per
// patient, 50 patients); the feed-only runs stop the job workers first.
// Report: msgs/s.
//
//	go test ./internal/handlers/fhirapi -run XXX -bench BenchmarkHL7Feed -benchtime 3000x
func BenchmarkHL7Feed(b *testing.B) {
	for _, backend := range storetest.Backends(b) {
		project := uuid.NewString()
		s := servertest.Start(b, backend, mllpOptions(project, nil))
		f := newFeedFor(b, s, project, "PID-3.1")
		// A trivial bot: the figure is the feed's.
		deployJSCode(b, f.c, f.bot, "hl7-recorder", "exports.handler = async (medplum, event) => event.input.buildAck();")
		run := func(name string, conns int, pipelined bool) {
			b.Run(backend.Name+"/"+name, func(b *testing.B) {
				per := max(b.N/conns, 1)
				var wg sync.WaitGroup
				start := time.Now()
				for c := range conns {
					wg.Add(1)
					go func() {
						defer wg.Done()
						conn, err := net.Dial("tcp", f.addr)
						if err != nil {
							b.Error(err)
							return
						}
						defer conn.Close()
						r := mllp.NewReader(conn, 1<<20)
						frame := func(i int) []byte {
							return mllp.Frame(adt(fmt.Sprintf("%s-%s-%d-%d", name, uuid.NewString()[:8], c, i), fmt.Sprintf("PAT%d", i%50)))
						}
						if pipelined {
							go func() {
								for i := range per {
									conn.Write(frame(i))
								}
							}()
						}
						for i := range per {
							if !pipelined {
								conn.Write(frame(i))
							}
							ack, err := r.ReadFrame()
							if err != nil || len(ack) < 10 {
								b.Errorf("ack %d: %v", i, err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(per*conns)/time.Since(start).Seconds(), "msgs/s")
			})
		}
		run("1conn", 1, false)
		run("10conns", 10, false)
		run("1conn-pipelined", 1, true)
		// The feed alone: the job workers stopped, so that no bot competes
		// for the cores (the messages' tasks wait in the queue).
		s.StopJobs(context.Background())
		run("feed-only/1conn", 1, false)
		run("feed-only/10conns", 10, false)
		run("feed-only/1conn-pipelined", 1, true)
	}
}
