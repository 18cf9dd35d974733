package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/testtiming"
	"github.com/sandbot/sandbot/internal/wasmtest"
)

// The noisy neighbour (issue 21): one project's hostile executions against
// the real server at its default settings (the execution memory budget a
// quarter of the machine's memory: on a large machine memory stops nothing),
// while another project's client keeps executing an echo bot and /livez is
// polled. CPU is shared between projects: the hostile project holds at most
// its share of the node's executions (the rest wait a moment and get 429),
// and those it holds take turns on the cores with everyone else's, so the
// echo client's latency stays low; every hostile execution ends within its
// deadline; the server's memory stays bounded.
//
// As in TestHostileBots, the tight timing bounds (deadline + 1 s, echo p99
// under 50 ms, /livez under 100 ms) are asserted with SANDBOT_STRICT_TIMING=1
// and logged otherwise; the loose ones always hold.

// noisyRSSBound is the stated bound on the server's resident memory under
// these attacks: the executions a project may hold at once (8 on 2 cores)
// each touching 64 MiB, what an idle server holds, and the Go heap's slack.
const noisyRSSBound = 1536 << 20

func TestNoisyNeighbour(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and runs hostile bots")
	}
	s := startHostileServer(t, "SANDBOT_LOG_LEVEL=warn")
	echoWasm, err := os.ReadFile("../../examples/c-echo/c-echo.wasm")
	if err != nil {
		t.Fatal(err)
	}
	a := s.do("POST", "admin/Project", "application/json", []byte(`{"resourceType":"Project","name":"victim"}`))
	if a.status != 201 {
		t.Fatalf("create project: %d %s", a.status, a.body)
	}
	var project struct{ ID string }
	_ = json.Unmarshal(a.body, &project)
	a = s.do("POST", "admin/projects/"+project.ID+"/bot", "application/json", []byte(`{"name":"echo"}`))
	var echoBot struct{ ID string }
	_ = json.Unmarshal(a.body, &echoBot)
	if a = s.do("POST", "fhir/R4/Bot/"+echoBot.ID+"/$deploy", "application/wasm", echoWasm); a.status != 200 {
		t.Fatalf("deploy echo: %d %s", a.status, a.body)
	}

	// attack runs the victim's echo client and the watch while fn runs,
	// and checks what they saw.
	attack := func(t *testing.T, fn func()) {
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var mu sync.Mutex
		var lat []time.Duration
		var errs []string
		s.mu.Lock()
		s.livez, s.peakRSS = nil, 0
		s.mu.Unlock()
		wg.Add(2)
		go func() { defer wg.Done(); s.watch(ctx) }()
		go func() { defer wg.Done(); s.echoClient(ctx, echoBot.ID, &lat, &errs, &mu) }()
		fn()
		stop()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		p99, livezMax := percentile(lat, .99), percentile(s.livez, 1)
		t.Logf("victim echo: %d executions, p50 %v, p99 %v, max %v; /livez max %v; server peak RSS %d MiB (bound %d MiB)",
			len(lat), percentile(lat, .5), p99, percentile(lat, 1), livezMax, s.peakRSS>>20, noisyRSSBound>>20)
		if len(errs) > 0 {
			t.Errorf("the victim's echo failed %d times: %v", len(errs), errs[:min(3, len(errs))])
		}
		if s.peakRSS > noisyRSSBound {
			t.Errorf("the server's resident memory reached %d MiB, over %d MiB", s.peakRSS>>20, noisyRSSBound>>20)
		}
		if bound := testtiming.Limit(50*time.Millisecond, 2*time.Second); p99 > bound {
			t.Errorf("the victim's echo p99 was %v, over %v", p99, bound)
		}
		if bound := testtiming.Limit(100*time.Millisecond, 2*time.Second); livezMax > bound {
			t.Errorf("/livez took up to %v, over %v", livezMax, bound)
		}
	}
	// ended checks a hostile execution's answer: a 4xx naming want within
	// its deadline and a second, or a 429 with Retry-After.
	ended := func(t *testing.T, a answer, timeout time.Duration, want string) {
		t.Helper()
		switch {
		case a.status == 429 && a.header.Get("Retry-After") != "":
		case a.status == 400 && strings.Contains(outcomeText(a.body), want):
			if bound := testtiming.Bound(timeout, time.Second); a.elapsed > bound {
				t.Errorf("answered after %v, over %v", a.elapsed, bound)
			}
		default:
			t.Errorf("%d after %v: %s", a.status, a.elapsed, a.body)
		}
	}

	t.Run("40 spinning executions, each writing 64 MiB", func(t *testing.T) {
		id, a := s.bot("toucher", 2, wasmtest.MemoryToucher(1024))
		if a.status != 200 {
			t.Fatalf("deploy: %d %s", a.status, a.body)
		}
		attack(t, func() {
			answers := make([]answer, 40)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Add(1)
				go func() { defer wg.Done(); answers[i] = s.execute(id) }()
			}
			wg.Wait()
			count := map[int]int{}
			var slowest time.Duration
			for _, a := range answers {
				count[a.status]++
				ended(t, a, 2*time.Second, "timed out")
				if a.status == 400 {
					slowest = max(slowest, a.elapsed)
				}
			}
			t.Logf("answers: %v; the slowest 400 after %v", count, slowest)
		})
	})

	t.Run("random_get of 60 MiB in a loop", func(t *testing.T) {
		id, a := s.bot("random", 2, wasmtest.RandomGetFlood(60<<20))
		if a.status != 200 {
			t.Fatalf("deploy: %d %s", a.status, a.body)
		}
		attack(t, func() {
			a := s.execute(id)
			t.Logf("%d after %v: %s", a.status, a.elapsed, outcomeText(a.body))
			ended(t, a, 2*time.Second, "timed out")
		})
	})

	for name, wasm := range map[string][]byte{
		"fd_write of a 60 MiB iovec in a loop":         wasmtest.LargeIovecFlood(60 << 20),
		"fd_write of a million empty iovecs in a loop": wasmtest.IovecFlood(),
	} {
		t.Run(name, func(t *testing.T) {
			id, a := s.bot("iovecs", 2, wasm)
			if a.status != 200 {
				t.Fatalf("deploy: %d %s", a.status, a.body)
			}
			attack(t, func() {
				a := s.execute(id)
				t.Logf("%d after %v: %s", a.status, a.elapsed, outcomeText(a.body))
				ended(t, a, 2*time.Second, "bytes of log")
			})
		})
	}

	t.Run("a 31 MiB module of 10,000 dense functions", func(t *testing.T) {
		wasm := wasmtest.ManyDenseFunctions(10_000, 3200)
		attack(t, func() {
			_, a := s.bot("dense", 0, wasm)
			t.Logf("%d-byte module: %d after %v: %s", len(wasm), a.status, a.elapsed, outcomeText(a.body))
			if a.status != 400 || !strings.Contains(outcomeText(a.body), "limit") {
				t.Errorf("deploy: %d %s", a.status, a.body)
			}
			if bound := testtiming.Limit(5*time.Second, 15*time.Second); a.elapsed > bound {
				t.Errorf("deploy answered after %v, over %v", a.elapsed, bound)
			}
		})
	})
}
