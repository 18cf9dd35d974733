package fhirapi_test

// Benchmarks of the platform through the real HTTP handler (servertest: a
// real listener, the same assembly as cmd/sandbot), on every backend.
// Read and search run over a project of 100,000 Patients seeded directly
// through the store. Benchmarks only run with -bench, e.g.
//
//	go test ./internal/handlers/fhirapi -run '^$' -bench . -benchtime 2000x
//
// Each reports ops/s (wall-clock throughput) and p50/p99 latency in ms.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

const (
	benchFamilies = 10_000 // each family name is shared by benchPatients/benchFamilies patients
	seedBatch     = 1_000
)

// benchPatients is 100,000, or SANDBOT_BENCH_PATIENTS for quicker runs.
var benchPatients = func() int {
	if n, err := strconv.Atoi(os.Getenv("SANDBOT_BENCH_PATIENTS")); err == nil && n >= benchFamilies {
		return n
	}
	return 100_000
}()

// fixture is a seeded server shared by the benchmarks of one backend: the
// seeding is done once per backend per `go test` run.
type fixture struct {
	s      *servertest.Server
	client *servertest.Client
	ids    []string
	// seedTime is how long seeding took.
	seedTime time.Duration
}

var (
	fixturesMu sync.Mutex
	fixtures   = map[string]*fixture{}
	// cleanups of the shared fixtures, run by TestMain after every benchmark.
	cleanups []func()
)

func TestMain(m *testing.M) {
	runtime.RunCompilerChild() // bots are compiled in a child process: this test binary
	code := m.Run()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	os.Exit(code)
}

// longTB outlives the benchmark that created it: its cleanups run at the end
// of the process, and a fatal error panics (it may be called from any
// benchmark's goroutine).
type longTB struct {
	testing.TB
}

func (longTB) Helper()                      {}
func (longTB) Cleanup(f func())             { cleanups = append(cleanups, f) }
func (longTB) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (longTB) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (longTB) Errorf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (longTB) Logf(string, ...any)          {}
func (longTB) Log(...any)                   {}
func (longTB) Name() string                 { return "bench-fixture" }
func (longTB) Failed() bool                 { return false }
func (longTB) Skipf(f string, args ...any)  { panic(fmt.Sprintf(f, args...)) }
func (t longTB) TempDir() string {
	d, err := os.MkdirTemp("", "sandbot-bench-")
	if err != nil {
		panic(err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(d) })
	return d
}

func benchPatient(i int) fhir.Resource {
	return fhir.Resource{
		"resourceType": "Patient",
		"active":       true,
		"gender":       []string{"female", "male"}[i%2],
		"birthDate":    fmt.Sprintf("%04d-%02d-%02d", 1940+i%70, 1+i%12, 1+i%28),
		"identifier":   []any{map[string]any{"system": "urn:bench:mrn", "value": fmt.Sprintf("MRN%07d", i)}},
		"name": []any{map[string]any{
			"family": benchFamily(i % benchFamilies),
			"given":  []any{fmt.Sprintf("Given%06d", i)},
		}},
	}
}

func benchFamily(n int) string { return fmt.Sprintf("Fam%05d", n) }

// seededFixture returns the server of backend b with benchPatients Patients in
// one project, seeding it on first use.
func seededFixture(b *testing.B, be storetest.Backend) *fixture {
	return sharedFixture(b, fixtures, be, "bench", seedPatients)
}

// sharedFixture returns cache's fixture for backend be, making it on first
// use: a server of its own, one project named project, seeded by seed.
func sharedFixture(b *testing.B, cache map[string]*fixture, be storetest.Backend, project string, seed func(*testing.B, *fixture)) *fixture {
	fixturesMu.Lock()
	defer fixturesMu.Unlock()
	if f := cache[be.Name]; f != nil {
		return f
	}
	tb := longTB{TB: b}
	s := servertest.Start(tb, be)
	f := &fixture{s: s, client: s.NewProject(tb, project)}
	seed(b, f)
	cache[be.Name] = f
	return f
}

// seedPatients creates benchPatients Patients in f's project, then refreshes
// the planner statistics.
func seedPatients(b *testing.B, f *fixture) {
	s, c := f.s, f.client
	ctx := context.Background()
	start := time.Now()
	author := fhir.Reference{Reference: c.Profile}
	// PostgreSQL takes batches on several connections at once; SQLite has a
	// single writer, so more workers would only queue on its lock.
	workers := 1
	if s.Backend == "postgres" {
		workers = 4
	}
	batches := make(chan int)
	errs := make(chan error, workers)
	var idsMu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := range batches {
				var ids []string
				err := s.Store.InTx(ctx, func(tx store.Store) error {
					for i := lo; i < lo+seedBatch && i < benchPatients; i++ {
						rec, err := tx.Create(ctx, benchPatient(i), store.Write{Project: c.ProjectID, Author: author})
						if err != nil {
							return err
						}
						ids = append(ids, rec.ID)
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				idsMu.Lock()
				f.ids = append(f.ids, ids...)
				idsMu.Unlock()
			}
		}()
	}
	go func() {
		defer close(batches)
		for lo := 0; lo < benchPatients; lo += seedBatch {
			select {
			case batches <- lo:
			case err := <-errs:
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatalf("seed: %v", err)
	default:
	}
	f.seedTime = time.Since(start)
	// Freshly loaded tables have no planner statistics yet (see
	// refreshStats). Without them SQLite's planner walks every Patient in
	// _lastUpdated order for a name search (~40 ms instead of ~0.5 ms).
	refreshStats(b, s)
	b.Logf("%s: seeded %d patients in %v", s.Backend, benchPatients, f.seedTime)
	fmt.Fprintf(os.Stderr, "seed %s: %d patients in %v (%.0f/s)\n", s.Backend, benchPatients, f.seedTime, float64(benchPatients)/f.seedTime.Seconds())
}

// refreshStats does after a bulk load what the server would do shortly:
// PostgreSQL's autovacuum, sqlstore's PRAGMA optimize loop on SQLite. On
// PostgreSQL it VACUUMs as well as ANALYZEs: an index-only scan (a count, a
// bounded count) reads the table for every row of a page not yet marked
// all-visible, and after a bulk load no page is until autovacuum gets to
// it, which a measurement should not depend on (with ANALYZE alone, the
// bounded count of gender=male read 2,000 table rows besides its entries).
func refreshStats(b *testing.B, s *servertest.Server) {
	stats := `VACUUM ANALYZE`
	if s.Backend == "sqlite" {
		stats = `PRAGMA optimize=0x10002`
	}
	if _, err := s.Store.DB().ExecContext(context.Background(), stats); err != nil {
		b.Fatalf("%s: %v", stats, err)
	}
}

// httpClient keeps enough idle connections for RunParallel.
var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}}

// do sends one request and drains the answer; it returns the status.
func do(b *testing.B, method, url, token, body string) int {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		b.Error(err)
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/fhir+json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		b.Error(err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// latencies collects per-request durations from parallel goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

func (l *latencies) report(b *testing.B, elapsed time.Duration) {
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	if len(l.d) == 0 {
		return
	}
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	pct := func(p float64) float64 {
		return float64(l.d[int(p*float64(len(l.d)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// runParallel runs op b.N times over several goroutines (so that both the
// client and the server side use the machine), timing each call.
func runParallel(b *testing.B, op func(r *rand.Rand) int, want int) {
	var lat latencies
	var failMu sync.Mutex
	failures := 0
	b.SetParallelism(4)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		for pb.Next() {
			t0 := time.Now()
			status := op(r)
			lat.add(time.Since(t0))
			if status != want {
				failMu.Lock()
				failures++
				failMu.Unlock()
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if failures > 0 {
		b.Fatalf("%d of %d requests did not answer %d", failures, b.N, want)
	}
	lat.report(b, elapsed)
}

// runSerial runs op b.N times on one goroutine: the latency of one request
// on an otherwise idle server.
func runSerial(b *testing.B, op func(r *rand.Rand) int, want int) {
	var lat latencies
	r := rand.New(rand.NewPCG(1, 2))
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		t0 := time.Now()
		if status := op(r); status != want {
			b.Fatalf("status %d, want %d", status, want)
		}
		lat.add(time.Since(t0))
	}
	elapsed := time.Since(start)
	b.StopTimer()
	lat.report(b, elapsed)
}

func BenchmarkCreatePatient(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			s := servertest.Start(b, be)
			c := s.NewProject(b, "bench-create")
			body := `{"resourceType":"Patient","active":true,"gender":"female","birthDate":"1970-01-01",` +
				`"identifier":[{"system":"urn:bench:mrn","value":"MRN1"}],"name":[{"family":"Create","given":["Bench"]}]}`
			url := s.URL + "fhir/R4/Patient"
			runParallel(b, func(*rand.Rand) int { return do(b, "POST", url, c.Token, body) }, 201)
		})
	}
}

func BenchmarkReadPatient(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			f := seededFixture(b, be)
			base := f.s.URL + "fhir/R4/Patient/"
			runParallel(b, func(r *rand.Rand) int {
				return do(b, "GET", base+f.ids[r.IntN(len(f.ids))], f.client.Token, "")
			}, 200)
		})
	}
}

// BenchmarkSearchPatientName searches a family name shared by 10 of the
// 100,000 patients (prefix match, as the name parameter is a string).
func BenchmarkSearchPatientName(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			f := seededFixture(b, be)
			base := f.s.URL + "fhir/R4/Patient?name="
			op := func(r *rand.Rand) int {
				return do(b, "GET", base+benchFamily(r.IntN(benchFamilies)), f.client.Token, "")
			}
			// Check once that the search finds what was seeded.
			resp := f.client.Do("GET", "fhir/R4/Patient?name="+benchFamily(7)+"&_total=accurate", nil, "")
			if resp.Status != 200 || resp.JSON()["total"] != float64(benchPatients/benchFamilies) {
				b.Fatalf("search: %d %.300s", resp.Status, resp.Body)
			}
			b.Run("serial", func(b *testing.B) { runSerial(b, op, 200) })
			b.Run("parallel", func(b *testing.B) { runParallel(b, op, 200) })
		})
	}
}

// BenchmarkCreatePatientWithSubscriptions is BenchmarkCreatePatient in a
// project with 10 active Subscriptions that do not match the Patients
// created: what matching costs a write. Compare with BenchmarkCreatePatient
// in the same run:
//
//	go test ./internal/handlers/fhirapi -run '^$' -bench 'CreatePatient' -benchtime 2000x
func BenchmarkCreatePatientWithSubscriptions(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			s := servertest.Start(b, be)
			c := s.NewProject(b, "bench-subscriptions")
			r := c.Do("POST", "admin/projects/"+c.ProjectID+"/bot", map[string]any{"name": "watcher"}, "application/json")
			if r.Status != 201 {
				b.Fatalf("bot: %d %s", r.Status, r.Body)
			}
			bot := r.JSON()["id"].(string)
			for i := range 10 {
				criteria := "Patient?gender=male"
				if i%2 == 0 {
					criteria = "Observation?code=http://loinc.org|8302-2"
				}
				sub := map[string]any{"resourceType": "Subscription", "status": "active", "reason": "bench", "criteria": criteria,
					"channel": map[string]any{"type": "rest-hook", "endpoint": "Bot/" + bot}}
				if r := c.Do("POST", "fhir/R4/Subscription", sub, "application/fhir+json"); r.Status != 201 {
					b.Fatalf("subscription: %d %s", r.Status, r.Body)
				}
			}
			body := `{"resourceType":"Patient","active":true,"gender":"female","birthDate":"1970-01-01",` +
				`"identifier":[{"system":"urn:bench:mrn","value":"MRN1"}],"name":[{"family":"Create","given":["Bench"]}]}`
			url := s.URL + "fhir/R4/Patient"
			runParallel(b, func(*rand.Rand) int { return do(b, "POST", url, c.Token, body) }, 201)
		})
	}
}
