package fhirapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

// BenchmarkSubscriptionDelivery measures Subscriptions that run the C echo
// bot, on each store, in one run:
//
//   - lag-idle: writes 25 ms apart, each delivered while nothing else runs:
//     the time from the write (the resource's meta.lastUpdated, taken before
//     its commit) to the start of its execution (its AuditEvent's
//     period.start), p50 and p99, in ms (both have ms precision);
//   - sync-exec/s: synchronous $execute of the same bot from 8 connections;
//   - write/s: 8 connections create resources that no Subscription
//     matches: the ceiling of the next figure, since each delivery needs
//     its write;
//   - triggered-exec/s: 8 connections create resources that the
//     Subscription matches, until every delivery has run: deliveries per
//     second from the first write to the last delivery's end, and its ratio
//     to sync-exec/s (the goal: at least 0.5); lag-load is the lag
//     under that load.
//
// BENCH_JOB_WORKERS sets SANDBOT_JOB_WORKERS (default 4) for the run.
//
// One iteration is the whole run:
//
//	go test ./internal/handlers/fhirapi -run '^$' -bench SubscriptionDelivery -benchtime 1x
func BenchmarkSubscriptionDelivery(b *testing.B) {
	wasm := readWasm(b, "../../../examples/c-echo/c-echo.wasm")
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			for range b.N {
				benchDelivery(b, be, wasm)
			}
		})
	}
}

func benchDelivery(b *testing.B, be storetest.Backend, wasm []byte) {
	const idle, n, conns = 200, 2000, 8
	s := servertest.Start(b, be, func(c *server.Config) {
		if w := os.Getenv("BENCH_JOB_WORKERS"); w != "" {
			c.Limits.JobWorkers, _ = strconv.ParseInt(w, 10, 64)
		}
	})
	c := s.NewProject(b, "bench-deliveries")
	id := c.Create(map[string]any{"resourceType": "Bot", "name": "echo"})["id"].(string)
	if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
		b.Fatalf("deploy: %d %s", r.Status, r.Body)
	}
	subFor := func(criteria string) string {
		r := c.Do("POST", "fhir/R4/Subscription", subscription(id, criteria), "application/fhir+json")
		if r.Status != 201 {
			b.Fatalf("subscription: %d %s", r.Status, r.Body)
		}
		return r.JSON()["id"].(string)
	}
	idleSub, loadSub := subFor("Basic?code=idle"), subFor("Basic?code=load")
	post := func(url, contentType string, body []byte, want int) {
		req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+c.Token)
		resp, err := httpClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("%s: status %d", url, resp.StatusCode)
		}
	}
	parallel := func(count int, fn func()) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(count) {
					fn()
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	delivered := func() int { return int(deliveriesDelivered(b, s)) }
	basic := func(code string) []byte {
		return []byte(`{"resourceType":"Basic","code":{"coding":[{"code":"` + code + `"}]}}`)
	}

	b.ResetTimer()
	// Idle lag.
	for range idle {
		post(s.URL+"fhir/R4/Basic", "application/fhir+json", basic("idle"), 201)
		time.Sleep(25 * time.Millisecond)
	}
	awaitDelivered(b, delivered, idle)
	// Synchronous executions.
	body := []byte(`{"name":"bench"}`)
	syncTook := parallel(n, func() { post(s.URL+"fhir/R4/Bot/"+id+"/$execute", "application/json", body, 200) })
	// The same writes, matched by no Subscription: the ceiling of the
	// triggered rate (each delivery needs its write).
	writeTook := parallel(n, func() { post(s.URL+"fhir/R4/Basic", "application/fhir+json", basic("none"), 201) })
	// Triggered executions.
	before := delivered()
	start := time.Now()
	parallel(n, func() { post(s.URL+"fhir/R4/Basic", "application/fhir+json", basic("load"), 201) })
	awaitDelivered(b, delivered, before+n)
	triggeredTook := time.Since(start)
	b.StopTimer()

	syncRate := float64(n) / syncTook.Seconds()
	triggeredRate := float64(n) / triggeredTook.Seconds()
	b.ReportMetric(syncRate, "sync-exec/s")
	b.ReportMetric(triggeredRate, "triggered-exec/s")
	b.ReportMetric(triggeredRate/syncRate, "triggered/sync")
	b.ReportMetric(float64(n)/writeTook.Seconds(), "write/s")
	for name, sub := range map[string]string{"idle": idleSub, "load": loadSub} {
		lags := deliveryLags(b, s, c.ProjectID, sub)
		b.ReportMetric(percentile(lags, 50), "lag-"+name+"-p50-ms")
		b.ReportMetric(percentile(lags, 99), "lag-"+name+"-p99-ms")
	}
	b.ReportMetric(0, "ns/op")
}

// deliveriesDelivered is the server's count of deliveries that ran to
// their end.
func deliveriesDelivered(b *testing.B, s *servertest.Server) float64 {
	for _, m := range gatherMetric(b, s, "sandbot_subscription_deliveries_total") {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" && l.GetValue() == "delivered" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func awaitDelivered(b *testing.B, delivered func() int, want int) {
	deadline := time.Now().Add(5 * time.Minute)
	for delivered() < want {
		if time.Now().After(deadline) {
			b.Fatalf("%d deliveries of %d after 5 minutes", delivered(), want)
		}
		// Each look gathers every metric, some from the database.
		time.Sleep(20 * time.Millisecond)
	}
}

// deliveryLags are, for each delivery of sub, the milliseconds from its
// resource's lastUpdated to its execution's start.
func deliveryLags(b *testing.B, s *servertest.Server, project, sub string) []float64 {
	ctx := context.Background()
	events, err := store.SearchResources(ctx, s.Store, store.ProjectScope(project), "AuditEvent", "entity=Subscription/"+sub+"&_count=5000")
	if err != nil {
		b.Fatal(err)
	}
	var lags []float64
	for _, ev := range events {
		start, _ := time.Parse(fhir.TimeFormat, servertest.Field(map[string]any(ev), "period", "start").(string))
		for _, e := range ev["entity"].([]any) {
			ref, _ := servertest.Field(e, "what", "reference").(string)
			if !strings.HasPrefix(ref, "Basic/") {
				continue
			}
			parts := strings.Split(ref, "/")
			rec, err := s.Store.Read(ctx, store.ProjectScope(project), "Basic", parts[1])
			if err != nil {
				b.Fatal(err)
			}
			lags = append(lags, float64(start.Sub(rec.LastUpdated).Microseconds())/1000)
		}
	}
	if len(lags) == 0 {
		b.Fatal(fmt.Sprintf("no deliveries of Subscription/%s", sub))
	}
	return lags
}

func percentile(v []float64, p int) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[min(len(v)-1, len(v)*p/100)]
}
