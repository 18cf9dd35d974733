package fhirapi_test

// Search benchmarks over HTTP (serial: one request at a time on an idle
// server, p50 and p99 at the client over loopback), on every backend:
//
//	go test ./internal/handlers/fhirapi -run '^$' -bench 'SearchMembers|SearchPatientParams' -benchtime 200x
//
// (make bench-search). BenchmarkSearchMembers runs the member searches of
// the reference's web app over 100,000 memberships in one project, a fifth
// each Patient, Practitioner, RelatedPerson, ClientApplication and Bot;
// BenchmarkSearchPatientParams searches the 100,000 Patients of the shared
// fixture by parameters of every kind.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/services/admin"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

const benchMembers = 100_000

var memberFixtures = map[string]*fixture{}

// memberFixture seeds benchMembers memberships into one project, once per
// backend and process.
func memberFixture(b *testing.B, be storetest.Backend) *fixture {
	return sharedFixture(b, memberFixtures, be, "members", seedMembers)
}

// seedMembers creates benchMembers memberships in f's project.
func seedMembers(b *testing.B, f *fixture) {
	s, c := f.s, f.client
	ctx := context.Background()
	start := time.Now()
	profiles := []string{"Patient", "Practitioner", "RelatedPerson", "ClientApplication", "Bot"}
	for lo := 0; lo < benchMembers; lo += seedBatch {
		list := make([]fhir.Resource, 0, seedBatch)
		for i := lo; i < lo+seedBatch && i < benchMembers; i++ {
			typ := profiles[i%len(profiles)]
			if os.Getenv("SANDBOT_BENCH_MEMBERS_IN_BLOCKS") != "" {
				// One type after the other, as an import might load them:
				// a walk in _lastUpdated order that a negation or an
				// offset sends through whole blocks is slow (issue 22).
				typ = profiles[i*len(profiles)/benchMembers]
			}
			prof := typ + "/" + uuid.NewString()
			user := "User/" + uuid.NewString()
			if typ == "ClientApplication" || typ == "Bot" {
				user = prof
			}
			list = append(list, admin.NewMembership(c.ProjectID, "members", user, prof, fmt.Sprintf("Member %d", i), i%50 == 0))
		}
		if err := s.Store.CreateMany(ctx, list, store.Write{Project: c.ProjectID, Author: fhir.Reference{Reference: "system"}}); err != nil {
			b.Fatalf("seed: %v", err)
		}
	}
	f.seedTime = time.Since(start)
	// No VACUUM or ANALYZE: measured as a user's database is right after
	// loading (the queries must not depend on the planner's statistics).
	fmt.Fprintf(os.Stderr, "seed %s: %d memberships in %v\n", s.Backend, benchMembers, f.seedTime.Round(time.Millisecond))
}

// searchCase is one benchmarked query and the total it must find.
type benchQuery struct {
	query string
	total int // -1: not checked
}

func runSearchBench(b *testing.B, f *fixture, typ string, queries []benchQuery) {
	for _, q := range queries {
		b.Run(strings.NewReplacer("/", "|", " ", "_").Replace(q.query), func(b *testing.B) {
			if q.total >= 0 {
				r := f.client.Do("GET", "fhir/R4/"+typ+"?"+q.query+"&_total=accurate&_count=0", nil, "")
				if r.Status != 200 || r.JSON()["total"] != float64(q.total) {
					b.Fatalf("%s?%s: %d, total %v, want %d: %.300s", typ, q.query, r.Status, r.JSON()["total"], q.total, r.Body)
				}
			}
			u := f.s.URL + "fhir/R4/" + typ + "?" + q.query
			runSerial(b, func(*rand.Rand) int { return do(b, "GET", u, f.client.Token, "") }, 200)
		})
	}
}

func BenchmarkSearchMembers(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			f := memberFixture(b, be)
			humans := benchMembers*3/5 + 1 // the project's admin client is a ClientApplication member
			queries := []benchQuery{
				{"profile-type:not=ClientApplication,Bot", humans - 1},
				{"profile-type:not=ClientApplication,Bot&_total=accurate", -1},
				{"profile-type=Patient", benchMembers / 5},
				{"profile-type=Patient&_total=accurate", -1},
				{"profile-type=Practitioner&_count=20&_offset=200", -1},
				{"profile-type:not=ClientApplication,Bot&_sort=-_lastUpdated", -1},
				{"admin=true", benchMembers/50 + 1}, // and the admin client
				{"user-name=nobody", 0},
			}
			runSearchBench(b, f, "ProjectMembership", queries)
			// The same searches by the super admin, over every project (the
			// bootstrap project's few memberships besides): the shape of
			// issue 22's 110 ms profile-type=Patient on PostgreSQL.
			b.Run("super-admin", func(b *testing.B) {
				sf := *f
				sf.client = f.s.SuperAdmin(b)
				var all []benchQuery
				for _, q := range queries {
					all = append(all, benchQuery{q.query, -1})
				}
				runSearchBench(b, &sf, "ProjectMembership", all)
			})
		})
	}
}

func BenchmarkSearchPatientParams(b *testing.B) {
	for _, be := range storetest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			f := seededFixture(b, be)
			n := benchPatients
			runSearchBench(b, f, "Patient", []benchQuery{
				{"gender=female", n / 2},
				{"gender=female&_total=accurate", -1},
				{"active=true&_total=accurate", n},
				{"identifier=urn:bench:mrn|MRN0012345", 1},
				{"name=" + benchFamily(42), n / benchFamilies},
				{"name=" + benchFamily(42) + "&_total=accurate", -1},
				{"family:exact=" + benchFamily(42) + "&gender=female", -1},
				{"given=Given00123", -1},
				{"birthdate=1975-04-05", -1},
				{"birthdate=ge1980-01-01", -1},
				{"birthdate=ge1980-01-01&_total=accurate", -1},
				{"gender=male&birthdate=lt1950", -1},
				{"_filter=" + url.QueryEscape("gender eq female and name sw "+benchFamily(7)), -1},
				{"name=" + benchFamily(42) + "&_sort=-birthdate", -1},
				{"gender=female&_sort=birthdate", -1}, // a sort over 50,000 candidates
				{"_sort=-_lastUpdated&_total=accurate", n},
			})
		})
	}
}
