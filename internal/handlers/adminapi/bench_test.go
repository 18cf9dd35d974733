package adminapi_test

// Member-search and invite benchmarks on PostgreSQL, through the real server:
//
//	go test -run '^$' -bench . -benchtime 2s ./internal/handlers/adminapi/
//
// One project holds 100,000 memberships (40% Patient, 40% Practitioner, 10%
// RelatedPerson, 5% ClientApplication, 5% Bot) among 10 more projects of 1,000
// memberships each, seeded through the store in batched transactions, the
// projects' batches interleaved in time. The
// memberships reference profile ids without creating the profiles: the member
// queries only read memberships and their index. Latencies are measured at
// the client over loopback (an upper bound of the server-side time) and
// reported as p50-ms / p95-ms; invites as invites/s.

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/admin"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

func postgresBackend(b *testing.B) storetest.Backend {
	for _, be := range storetest.Backends(b) {
		if be.Name == "postgres" {
			return be
		}
	}
	b.Skip("PostgreSQL not available")
	return storetest.Backend{}
}

var profileMix = []struct {
	typ  string
	perc int
}{{"Patient", 40}, {"Practitioner", 40}, {"RelatedPerson", 10}, {"ClientApplication", 5}, {"Bot", 5}}

type seedTarget struct {
	pid, name string
	n         int
}

// seedMembers writes the memberships of every target in batches of 500, the
// projects' batches interleaved in time (as projects grow side by side), with
// two writers.
func seedMembers(b *testing.B, st store.Store, targets []seedTarget) {
	ctx := context.Background()
	const batch = 500
	type job struct {
		t     seedTarget
		start int
	}
	var jobs []job
	for round := 0; ; round++ {
		added := false
		for _, t := range targets {
			// Spread each project's batches evenly over the rounds of the biggest.
			per := max(1, t.n/batch)
			rounds := max(1, targets[len(targets)-1].n/batch)
			every := max(1, rounds/per)
			if round%every == 0 && (round/every)*batch < t.n {
				jobs = append(jobs, job{t, (round / every) * batch})
				added = true
			}
		}
		if !added {
			break
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= len(jobs) {
					return
				}
				j := jobs[k]
				err := st.InTx(ctx, func(tx store.Store) error {
					for i := j.start; i < min(j.start+batch, j.t.n); i++ {
						k, typ := i%100, ""
						for _, m := range profileMix {
							if k < m.perc {
								typ = m.typ
								break
							}
							k -= m.perc
						}
						prof := typ + "/" + uuid.NewString()
						user := "User/" + uuid.NewString()
						if typ == "ClientApplication" || typ == "Bot" {
							user = prof
						}
						m := admin.NewMembership(j.t.pid, j.t.name, user, prof, fmt.Sprintf("Member %d", i), i%50 == 0)
						if _, err := tx.Create(ctx, m, store.Write{Project: j.t.pid, Author: fhir.Reference{Reference: "system"}}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

func BenchmarkMembers(b *testing.B) {
	be := postgresBackend(b)
	s := servertest.Start(b, be, func(c *server.Config) { c.Limits.AuthRequestsPerMinute = -1 })
	big := s.NewProject(b, "Big")
	start := time.Now()
	var targets []seedTarget
	for i := 0; i < 10; i++ {
		o := s.NewProject(b, fmt.Sprintf("Other %d", i))
		targets = append(targets, seedTarget{o.ProjectID, "Other", 1000})
	}
	targets = append(targets, seedTarget{big.ProjectID, "Big", 100000})
	seedMembers(b, s.Store, targets)
	if _, err := s.Store.DB().Exec(`ANALYZE`); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded 110,000 memberships in %v", time.Since(start).Round(time.Second))
	c := as(b, s, big.Token)

	for _, q := range []string{
		"profile-type:not=ClientApplication,Bot&_count=20",
		"profile-type=Patient&_count=20",
		"profile-type=Practitioner&_count=20",
		"profile-type%3Anot=ClientApplication%2CBot&_count=20&_offset=200",
	} {
		b.Run(q, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				r := c.Do("GET", "fhir/R4/ProjectMembership?"+q, nil, "")
				lat = append(lat, time.Since(t0))
				if r.Status != 200 {
					b.Fatalf("%d %s", r.Status, r.Body)
				}
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*95/100].Microseconds())/1000, "p95-ms")
		})
	}

	b.Run("invite", func(b *testing.B) {
		var n atomic.Int64
		b.SetParallelism(4)
		t0 := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := n.Add(1)
				rt := "Practitioner"
				if i%2 == 0 {
					rt = "Patient"
				}
				body := inviteBody(rt, "Bench", fmt.Sprint(i), fmt.Sprintf("bench-%d-%s@example.com", i, uuid.NewString()[:8]))
				r := c.Do("POST", "admin/projects/"+big.ProjectID+"/invite", body, "")
				if r.Status != 200 {
					b.Errorf("invite: %d %s", r.Status, r.Body)
					return
				}
			}
		})
		b.ReportMetric(float64(n.Load())/time.Since(t0).Seconds(), "invites/s")
	})
}
