package fhirapi_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
// Report: msgs/s, and the messages a keeping transaction committed on
// average (msgs/commit). In the same run, the peer: @medplum/hl7's Hl7Server
// (compat/hl7-peer.mjs, the reference's own listener) answering AA from
// memory, driven by the same client (skipped without node or compat's
// packages).
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
				defer reportBatch(b, s)()
				driveMLLP(b, f.addr, name, conns, pipelined)
			})
		}
		// With the bot running: also how fast the messages were run, from
		// the first sent to the last run (run-msgs/s). The runs are read
		// from the metrics every 50 ms: a gather queries the database (the
		// jobs' queue depth), so looking more often slows the runs.
		runAll := func(name string, conns int, pipelined bool) {
			b.Run(backend.Name+"/"+name, func(b *testing.B) {
				defer reportBatch(b, s)()
				before := botRuns(b, s)
				start := time.Now()
				driveMLLP(b, f.addr, name, conns, pipelined)
				want := before + float64(max(b.N/conns, 1)*conns)
				for deadline := time.Now().Add(5 * time.Minute); botRuns(b, s) < want; time.Sleep(50 * time.Millisecond) {
					if time.Now().After(deadline) {
						b.Fatalf("%v of %v messages run after 5 minutes", botRuns(b, s)-before, want-before)
					}
				}
				b.ReportMetric((want-before)/time.Since(start).Seconds(), "run-msgs/s")
			})
		}
		runAll("1conn", 1, false)
		runAll("10conns", 10, false)
		runAll("1conn-pipelined", 1, true)
		// The feed alone: the job workers stopped, so that no bot competes
		// for the cores (the messages' tasks wait in the queue).
		s.StopJobs(context.Background())
		run("feed-only/1conn", 1, false)
		run("feed-only/10conns", 10, false)
		run("feed-only/1conn-pipelined", 1, true)
	}
	peer := startHl7ServerPeer(b)
	if peer == "" {
		return
	}
	for _, c := range []struct {
		name      string
		conns     int
		pipelined bool
	}{{"1conn", 1, false}, {"10conns", 10, false}, {"1conn-pipelined", 1, true}} {
		b.Run("peer-Hl7Server/"+c.name, func(b *testing.B) { driveMLLP(b, peer, c.name, c.conns, c.pipelined) })
	}
}

// startHl7ServerPeer starts compat/hl7-peer.mjs on a free port and returns
// its address, or "" (the peer skipped) without node or compat's packages.
func startHl7ServerPeer(b *testing.B) string {
	if _, err := exec.LookPath("node"); err != nil {
		b.Log("no node: the Hl7Server peer is skipped")
		return ""
	}
	if _, err := os.Stat("../../../compat/node_modules/@medplum/hl7"); err != nil {
		b.Log("compat's packages are not installed (make test installs them): the Hl7Server peer is skipped")
		return ""
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command("node", "../../../compat/hl7-peer.mjs", port)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "listening" {
		b.Fatalf("hl7-peer.mjs: %q %v", line, err)
	}
	return "127.0.0.1:" + port
}

// driveMLLP sends b.N ADT^A01 messages to addr over conns connections, each
// waiting for every ACK (or, pipelined, writing without waiting), and
// reports msgs/s.
func driveMLLP(b *testing.B, addr, name string, conns int, pipelined bool) {
	per := max(b.N/conns, 1)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", addr)
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
}

// reportBatch reports, when the function it answers is called, how many
// messages the keeping transactions committed at once since it was called,
// on average (msgs/commit).
func reportBatch(b *testing.B, s *servertest.Server) func() {
	sum, n := commitBatches(b, s)
	return func() {
		sum2, n2 := commitBatches(b, s)
		if n2 > n {
			b.ReportMetric((sum2-sum)/float64(n2-n), "msgs/commit")
		}
	}
}

func commitBatches(b *testing.B, s *servertest.Server) (sum float64, n uint64) {
	for _, m := range gatherMetric(b, s, "sandbot_mllp_commit_batch_size") {
		sum, n = sum+m.GetHistogram().GetSampleSum(), n+m.GetHistogram().GetSampleCount()
	}
	return sum, n
}

// botRuns is how many messages s's HL7 feed has run through the bot (or
// given up on).
func botRuns(b *testing.B, s *servertest.Server) float64 {
	n := 0.0
	for _, m := range gatherMetric(b, s, "sandbot_mllp_bot_runs_total") {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" && l.GetValue() != "retried" { // ok or given up: ended
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
