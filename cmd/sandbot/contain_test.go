package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/testtiming"
	"github.com/sandbot/sandbot/internal/wasmtest"
)

// The hostile bots of issue 11, each against the real server (this test
// binary started again as `sandbot serve`, a process of its own) while a
// second client keeps executing an echo bot: every one ends in a 4xx, at
// deploy or within the bot's timeout and a second; the echo client's p99
// stays under 50 ms, the server's resident memory under a stated bound, and
// the server never dies.
//
// Timing bounds on a shared two-core machine are the only thing here that
// can fail without a fault, so the tight ones (timeout + 1 s, p99 < 50 ms)
// are asserted only with SANDBOT_STRICT_TIMING=1 and otherwise logged; a
// loose bound (timeout + 10 s) always holds. SANDBOT_HOSTILE_BINARY runs
// the same attacks against another build (e.g. one from before the fix;
// then only the attacks that binary survives make sense, selected with
// -run).

const (
	hostileAdminID     = "hostile-admin"
	hostileAdminSecret = "hostile-admin-secret-0123456789"
	// The server's execution memory budget in this test, and the bound its
	// peak resident memory must stay under: the budget, plus what an idle
	// server holds (about 100 MiB), compiled modules, and slack for the Go
	// heap's growth between collections.
	hostileBudget   = 512 << 20
	hostileRSSBound = hostileBudget + 512<<20
)

type hostileServer struct {
	t      *testing.T
	cmd    *exec.Cmd
	api    string // http://host:port/
	ops    string
	token  string
	exited chan struct{}
	stderr *servertest.SyncBuffer

	mu      sync.Mutex
	peakRSS int64
	livez   []time.Duration
}

// startHostileServer starts the server with the execution memory budget of
// this test (hostileBudget), or with env's settings instead.
func startHostileServer(t *testing.T, env ...string) *hostileServer {
	t.Helper()
	if len(env) == 0 {
		env = []string{"SANDBOT_EXECUTION_MEMORY_BYTES=" + strconv.Itoa(hostileBudget),
			// A pathological module's compilation is stopped after 3 s of
			// CPU; its deploy waits up to 30 s for that, so that on a loaded
			// machine (the compiler runs at a lower priority) the CPU
			// ceiling stops it, not the wall clock (a 429: busy).
			"SANDBOT_COMPILE_CPU_SECONDS=3", "SANDBOT_COMPILE_SECONDS=30"}
	}
	settings := env
	api, ops := servertest.FreeAddr(t), servertest.FreeAddr(t)
	bin, env := os.Args[0], []string{"SANDBOT_TEST_SERVE=1"}
	if b := os.Getenv("SANDBOT_HOSTILE_BINARY"); b != "" {
		bin, env = b, nil
	}
	cmd := exec.Command(bin, "serve", "-addr", api, "-metrics-addr", ops, "-base-url", "http://"+api+"/",
		"-data-dir", t.TempDir(), "-log-level", "warn")
	cmd.Env = append(env,
		"PATH="+os.Getenv("PATH"),
		"SANDBOT_ADMIN_CLIENT_ID="+hostileAdminID, "SANDBOT_ADMIN_CLIENT_SECRET="+hostileAdminSecret)
	cmd.Env = append(cmd.Env, settings...)
	s := &hostileServer{t: t, cmd: cmd, api: "http://" + api + "/", ops: "http://" + ops + "/", exited: make(chan struct{}), stderr: &servertest.SyncBuffer{}}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; {
		if resp, err := http.Get(s.ops + "readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("the server exited at start: %s", s.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.token = servertest.ClientToken(t, s.api, hostileAdminID, hostileAdminSecret)
	return s
}

// watch samples the server's resident memory and /livez latency until ctx
// ends.
func (s *hostileServer) watch(ctx context.Context) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if rss := processRSS(s.cmd.Process.Pid); rss > 0 {
			s.mu.Lock()
			s.peakRSS = max(s.peakRSS, rss)
			s.mu.Unlock()
		}
		if n%3 == 0 {
			start := time.Now()
			resp, err := http.Get(s.ops + "livez")
			if err == nil {
				resp.Body.Close()
				s.mu.Lock()
				s.livez = append(s.livez, time.Since(start))
				s.mu.Unlock()
			}
		}
	}
}

// processRSS is a process's resident set size, from /proc (0 elsewhere).
func processRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

type answer struct {
	status  int
	header  http.Header
	body    []byte
	elapsed time.Duration
}

func (s *hostileServer) do(method, path, contentType string, body []byte) answer {
	req, err := http.NewRequest(method, s.api+path, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{status: -1, body: []byte(err.Error()), elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: buf.Bytes(), elapsed: time.Since(start)}
}

// bot creates a Bot with the given timeout (seconds; 0: none) and deploys
// wasm to it; it returns the Bot's id and the deploy's answer.
func (s *hostileServer) bot(name string, timeout int, wasm []byte) (string, answer) {
	s.t.Helper()
	res := map[string]any{"resourceType": "Bot", "name": name}
	if timeout > 0 {
		res["timeout"] = timeout
	}
	b, _ := json.Marshal(res)
	a := s.do("POST", "fhir/R4/Bot", "application/fhir+json", b)
	if a.status != 201 {
		s.t.Fatalf("create Bot: %d %s", a.status, a.body)
	}
	var bot struct{ ID string }
	_ = json.Unmarshal(a.body, &bot)
	return bot.ID, s.do("POST", "fhir/R4/Bot/"+bot.ID+"/$deploy", "application/wasm", wasm)
}

func (s *hostileServer) execute(id string) answer {
	return s.do("POST", "fhir/R4/Bot/"+id+"/$execute", "application/json", []byte(`{"hello":"world"}`))
}

func outcomeText(body []byte) string {
	var oo struct {
		Issue []struct {
			Details struct{ Text string }
		}
	}
	if json.Unmarshal(body, &oo) != nil || len(oo.Issue) == 0 {
		return string(body)
	}
	return oo.Issue[0].Details.Text
}

// echoClient executes the echo bot back to back until ctx ends, and
// records each answer's latency; any answer but 200 is an error.
func (s *hostileServer) echoClient(ctx context.Context, id string, lat *[]time.Duration, errs *[]string, mu *sync.Mutex) {
	for ctx.Err() == nil {
		a := s.execute(id)
		mu.Lock()
		if a.status == 200 {
			*lat = append(*lat, a.elapsed)
		} else if ctx.Err() == nil {
			*errs = append(*errs, fmt.Sprintf("%d %s", a.status, a.body))
		}
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func TestHostileBots(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and runs hostile bots for about a minute")
	}
	strict := testtiming.Strict()
	s := startHostileServer(t)
	var a answer
	echoWasm, err := os.ReadFile("../../examples/c-echo/c-echo.wasm")
	if err != nil {
		t.Fatal(err)
	}
	// The echo bot is another tenant's: a project of its own.
	a = s.do("POST", "admin/Project", "application/json", []byte(`{"resourceType":"Project","name":"echo tenant"}`))
	if a.status != 201 {
		t.Fatalf("create project: %d %s", a.status, a.body)
	}
	var project struct{ ID string }
	_ = json.Unmarshal(a.body, &project)
	a = s.do("POST", "admin/projects/"+project.ID+"/bot", "application/json", []byte(`{"name":"echo"}`))
	if a.status != 201 {
		t.Fatalf("create the echo bot: %d %s", a.status, a.body)
	}
	var echoBot struct{ ID string }
	_ = json.Unmarshal(a.body, &echoBot)
	echo := echoBot.ID
	if a = s.do("POST", "fhir/R4/Bot/"+echo+"/$deploy", "application/wasm", echoWasm); a.status != 200 {
		t.Fatalf("deploy echo: %d %s", a.status, a.body)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var echoLat []time.Duration
	var echoErrs []string
	wg.Add(2)
	go func() { defer wg.Done(); s.watch(ctx) }()
	go func() { defer wg.Done(); s.echoClient(ctx, echo, &echoLat, &echoErrs, &mu) }()

	// Refused at deploy, naming the limit.
	deployCases := []struct {
		name string
		wasm []byte
		want string
	}{
		{"4e9 locals (116 bytes: the process died of OOM)", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2,
			Locals: wasmtest.Locals([2]uint32{0xffffffff, wasmtest.I64}, [2]uint32{0xffffffff, wasmtest.I64}), Code: []byte{0x0b}}}}.Build(),
			"over the limit of 50000 per function"},
		{"1e8 locals", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Locals: wasmtest.Locals([2]uint32{100_000_000, wasmtest.I32}), Code: []byte{0x0b}}}}.Build(),
			"over the limit of 50000 per function"},
		{"br_table of 1e6 targets", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Code: wasmtest.BrTable(1_000_000)}}}.Build(),
			"over the limit of 65520"},
		{"31 MiB of dense code", wasmtest.DenseCode(31 << 20), "bytes per function"},
		{"8 tables of 1e8 funcref", wasmtest.HugeTables(8, 100_000_000), "tables declare 800000000 elements"},
		{"nesting", wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Code: wasmtest.Nested(10_001)}}}.Build(), "nests blocks deeper than the limit of 10000"},
		{"100,000 functions", func() []byte {
			var m wasmtest.Module
			for range 100_000 {
				m.Funcs = append(m.Funcs, wasmtest.Func{Type: 2, Code: []byte{0x0b}})
			}
			return m.Build()
		}(), "over the limit of 100000"},
		{"compilation past the CPU ceiling", wasmtest.ExpensiveToCompile(), "too expensive to compile"},
	}
	for _, c := range deployCases {
		t.Run("deploy/"+c.name, func(t *testing.T) {
			_, a := s.bot("hostile", 0, c.wasm)
			t.Logf("%d-byte module: %d after %v: %s", len(c.wasm), a.status, a.elapsed, outcomeText(a.body))
			if a.status != 400 || !strings.Contains(outcomeText(a.body), c.want) {
				t.Fatalf("want 400 naming %q, got %d %s", c.want, a.status, a.body)
			}
		})
	}

	// Deployed, then stopped at their deadline (or earlier).
	runCases := []struct {
		name    string
		timeout int
		wasm    []byte
		want    string
	}{
		{"a 2^32-call tree with a 1 s deadline (answered 200 after 13.6 s)", 1, wasmtest.CallTree(32).Build(), "timed out after 1000 ms"},
		{"the same tree in the wasm start function", 1, func() []byte {
			m := wasmtest.CallTree(32)
			start := uint32(2)
			m.Start = &start
			return m.Build()
		}(), "timed out after 1000 ms"},
		{"empty lines through sandbot.log, 10 s deadline", 10, wasmtest.LogFlood(), "bytes of log"},
		{"fd_write of 10^6 empty iovecs, 10 s deadline", 10, wasmtest.IovecFlood(), "bytes of log"},
		{"recursion without end", 10, wasmtest.Module{
			Handle: []byte{0x10, 2, 0x42, 0x00, 0x0b},
			Funcs:  []wasmtest.Func{{Type: 2, Code: []byte{0x10, 2, 0x0b}}},
		}.Build(), "call stack limit"},
	}
	for _, c := range runCases {
		t.Run("execute/"+c.name, func(t *testing.T) {
			id, a := s.bot("hostile", c.timeout, c.wasm)
			if a.status != 200 {
				t.Fatalf("deploy: %d %s", a.status, a.body)
			}
			a = s.execute(id)
			t.Logf("%d after %v: %s", a.status, a.elapsed, outcomeText(a.body))
			if a.status != 400 || !strings.Contains(outcomeText(a.body), c.want) {
				t.Fatalf("want 400 saying %q, got %d %s", c.want, a.status, a.body)
			}
			bound := testtiming.Bound(time.Duration(c.timeout)*time.Second, time.Second)
			if a.elapsed > bound {
				t.Fatalf("answered after %v, over %v", a.elapsed, bound)
			}
		})
	}

	t.Run("execute/40 at once, each touching 64 MiB", func(t *testing.T) {
		id, a := s.bot("toucher", 2, wasmtest.MemoryToucher(1024))
		if a.status != 200 {
			t.Fatalf("deploy: %d %s", a.status, a.body)
		}
		answers := make([]answer, 40)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Add(1)
			go func() { defer wg.Done(); answers[i] = s.execute(id) }()
		}
		wg.Wait()
		count := map[int]int{}
		for _, a := range answers {
			count[a.status]++
			switch a.status {
			case 429:
				if a.header.Get("Retry-After") == "" {
					t.Errorf("429 without Retry-After: %s", a.body)
				}
			case 400:
				if !strings.Contains(outcomeText(a.body), "timed out") {
					t.Errorf("400: %s", a.body)
				}
			default:
				t.Errorf("%d %s", a.status, a.body)
			}
		}
		t.Logf("answers: %v (each admitted one holds about 90 MiB of the %d MiB budget)", count, hostileBudget>>20)
		if count[429] == 0 {
			t.Fatal("all 40 were admitted")
		}
	})

	t.Run("execute/a 30 MiB data segment", func(t *testing.T) {
		id, a := s.bot("data", 0, wasmtest.DataSegment(30<<20))
		if a.status != 200 {
			t.Fatalf("deploy: %d %s", a.status, a.body)
		}
		var times []time.Duration
		for range 5 {
			a := s.execute(id)
			if a.status != 200 {
				t.Fatalf("%d %s", a.status, a.body)
			}
			times = append(times, a.elapsed)
		}
		t.Logf("five executions: %v", times)
	})

	stop()
	wg.Wait()
	select {
	case <-s.exited:
		t.Fatalf("the server died: %s", s.stderr.String())
	default:
	}
	if resp, err := http.Get(s.ops + "livez"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/livez after the attacks: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("echo client: %d executions, p50 %v, p99 %v, max %v; /livez p99 %v, max %v; server peak RSS %d MiB (bound %d MiB)",
		len(echoLat), percentile(echoLat, .5), percentile(echoLat, .99), percentile(echoLat, 1),
		percentile(s.livez, .99), percentile(s.livez, 1), s.peakRSS>>20, hostileRSSBound>>20)
	if len(echoErrs) > 0 {
		t.Errorf("the echo client failed %d times: %v", len(echoErrs), echoErrs[:min(3, len(echoErrs))])
	}
	if s.peakRSS > hostileRSSBound {
		t.Errorf("the server's resident memory reached %d MiB, over %d MiB", s.peakRSS>>20, hostileRSSBound>>20)
	}
	if p99 := percentile(echoLat, .99); strict && p99 > 50*time.Millisecond {
		t.Errorf("the echo client's p99 was %v", p99)
	}
}
