package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

// eventually polls cond until it holds, failing the test after limit. The
// limit is far below the caches' safety-net TTLs (10 s), so a change that
// only the TTL would carry fails the test; the latency itself is measured
// by the process-level test (deploy/local).
func eventually(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

// TestReplicasShareOneTruth runs two servers on one database, as two
// replicas behind a balancer (one public base URL, separate bot runtimes):
// what changes through one is honoured by the other at once, the auth rate
// limit is one budget, and a deploy on one compiles the module on the other.
func TestReplicasShareOneTruth(t *testing.T) {
	wasm, err := os.ReadFile(filepath.Join("..", "handlers", "fhirapi", "testdata", "event.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	proxies, _ := httpx.ParseTrustedProxies("127.0.0.1/32")
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			dbURL := b.NewURL(t)
			limit := func(c *server.Config) { c.Limits.AuthRequestsPerMinute = 30; c.TrustedProxies = proxies }
			one := servertest.StartURL(t, b.Name, dbURL, limit)
			rtTwo, err := runtime.New(ctx, runtime.Config{CacheDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rtTwo.Close(ctx) })
			two := servertest.StartURL(t, b.Name, dbURL, limit, func(c *server.Config) { c.BaseURL = one.URL; c.Runtime = rtTwo })

			owner := one.NewProject(t, "replicas")
			on := func(s *servertest.Server, token string) *servertest.Client {
				return servertest.NewClient(t, s.URL, token)
			}

			// Demotion: an admin's token is honoured as an admin's on
			// replica two (and cached there) until replica one demotes it.
			adm := one.NewMember(t, owner.ProjectID, "deputy", true)
			if r := on(two, adm.Token).Do("GET", "admin/projects/"+owner.ProjectID, nil, ""); r.Status != 200 {
				t.Fatalf("admin on replica two: %d %s", r.Status, r.Body)
			}
			mid := membershipOf(t, one, adm.Profile)
			if _, err := one.Store.Update(ctx, store.AllProjects, "ProjectMembership", mid, store.Write{}, func(m fhir.Resource) (fhir.Resource, error) {
				m["admin"] = false
				return m, nil
			}); err != nil {
				t.Fatal(err)
			}
			d := eventually(t, "demotion honoured on replica two", 3*time.Second, func() bool {
				return on(two, adm.Token).Do("GET", "admin/projects/"+owner.ProjectID, nil, "").Status == 403
			})
			t.Logf("demotion honoured on replica two after %v", d)

			// Revocation of a login.
			if r := on(two, owner.Token).Do("GET", "fhir/R4/Patient", nil, ""); r.Status != 200 {
				t.Fatalf("owner on replica two: %d", r.Status)
			}
			revokeLogin(t, one, owner.Token)
			d = eventually(t, "revocation honoured on replica two", 3*time.Second, func() bool {
				return on(two, owner.Token).Do("GET", "fhir/R4/Patient", nil, "").Status == 401
			})
			t.Logf("revocation honoured on replica two after %v", d)
			owner.Token = one.Token(t, owner.ClientID, owner.Secret)

			// A deleted client's tokens die on every replica, the deleting
			// one included.
			doomed := one.NewMember(t, owner.ProjectID, "doomed", false)
			for _, s := range []*servertest.Server{one, two} {
				if r := on(s, doomed.Token).Do("GET", "fhir/R4/Patient", nil, ""); r.Status != 200 {
					t.Fatalf("client before its deletion: %d", r.Status)
				}
			}
			if err := one.Store.Delete(ctx, store.AllProjects, "ClientApplication", doomed.ClientID, store.Write{}); err != nil {
				t.Fatal(err)
			}
			for i, s := range []*servertest.Server{one, two} {
				eventually(t, fmt.Sprintf("deleted client refused on replica %d", i+1), 3*time.Second, func() bool {
					return on(s, doomed.Token).Do("GET", "fhir/R4/Patient", nil, "").Status == 401
				})
			}

			// A project secret changed through replica one reaches
			// executions on replica two; the deploy on replica one has
			// compiled the module on replica two in the background.
			botID := owner.Create(map[string]any{"resourceType": "Bot", "name": "inspector"})["id"].(string)
			if r := owner.Do("POST", "fhir/R4/Bot/"+botID+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
				t.Fatalf("deploy: %d %s", r.Status, r.Body)
			}
			eventually(t, "module compiled on replica two", 60*time.Second, func() bool {
				_, ok := rtTwo.Lookup(runtime.HashBytes(wasm))
				return ok
			})
			secretSeen := func(want string) bool {
				r := on(two, owner.Token).Do("POST", "fhir/R4/Bot/"+botID+"/$execute", `{}`, "application/json")
				var ev struct {
					Secrets map[string]map[string]any `json:"secrets"`
				}
				json.Unmarshal(r.Body, &ev)
				return r.Status == 200 && ev.Secrets["API_KEY"]["valueString"] == want
			}
			for i, v := range []string{"first", "second"} {
				if r := owner.Do("POST", "admin/projects/"+owner.ProjectID+"/secrets", []any{map[string]any{"name": "API_KEY", "valueString": v}}, "application/json"); r.Status != 200 {
					t.Fatalf("set secret: %d %s", r.Status, r.Body)
				}
				d := eventually(t, fmt.Sprintf("secret %d seen on replica two", i+1), 3*time.Second, func() bool { return secretSeen(v) })
				t.Logf("secret %d seen by an execution on replica two after %v", i+1, d)
			}

			// One auth budget for both replicas, per forwarded client
			// address (the peer, 127.0.0.1, is a trusted proxy).
			tokenStatus := func(s *servertest.Server, client string) int {
				return servertest.NewClient(t, s.URL, "").DoWith("POST", "oauth2/token", "grant_type=none", "application/x-www-form-urlencoded",
					map[string]string{"X-Forwarded-For": client}).Status
			}
			for i := 0; i < 30; i++ {
				if st := tokenStatus([]*servertest.Server{one, two}[i%2], "198.51.100.7"); st == 429 {
					t.Fatalf("request %d of 30 refused", i+1)
				}
			}
			for _, s := range []*servertest.Server{one, two} {
				if st := tokenStatus(s, "198.51.100.7"); st != 429 {
					t.Errorf("the 31st request answered %d, want 429", st)
				}
			}
			if st := tokenStatus(two, "198.51.100.8"); st == 429 {
				t.Error("another client behind the same proxy shares the budget")
			}
			// Once refused, an address is refused by that replica without
			// a store write until its window ends: 30 allowed and one
			// refused per replica were counted, the 10 below are not.
			for i := 0; i < 10; i++ {
				if st := tokenStatus(one, "198.51.100.7"); st != 429 {
					t.Fatalf("refused address answered %d", st)
				}
			}
			if n, _, err := one.Store.CountHit(ctx, "auth 198.51.100.7", time.Minute); err != nil || n != 33 {
				t.Errorf("hits counted in the store: %d (%v), want 33: refused requests kept writing", n, err)
			}
		})
	}
}

func membershipOf(t *testing.T, s *servertest.Server, profile string) string {
	t.Helper()
	found, err := store.SearchResources(context.Background(), s.Store, store.AllProjects, "ProjectMembership", "profile="+profile)
	if err != nil || len(found) != 1 {
		t.Fatalf("membership of %s: %v %v", profile, found, err)
	}
	return found[0].ID()
}

// revokeLogin marks the Login of token revoked, through s's store.
func revokeLogin(t *testing.T, s *servertest.Server, token string) {
	t.Helper()
	claims, err := s.Auth.Tokens().Verify(token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.Update(context.Background(), store.AllProjects, "Login", claims.LoginID, store.Write{}, func(l fhir.Resource) (fhir.Resource, error) {
		l["revoked"] = true
		return l, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCachedWriteWaitsForReplicas: a write of a Project (its secrets)
// answers only once every other live replica has recorded seeing it
// (decision 58), so that none serves its cached copy afterwards. A replica
// that stands for one behind (recorded live, seeing nothing) holds the
// write until it records the change; one not seen for long is not waited
// for.
func TestCachedWriteWaitsForReplicas(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := servertest.Start(t, b)
			owner := s.NewProject(t, "cached")
			setSecret := func(v string) {
				t.Helper()
				if r := owner.Do("POST", "admin/projects/"+owner.ProjectID+"/secrets", []any{map[string]any{"name": "K", "valueString": v}}, "application/json"); r.Status != 200 {
					t.Fatalf("set secret: %d %s", r.Status, r.Body)
				}
			}
			now := time.Now()
			if err := s.Store.ReplicaAlive(ctx, "gone", now.Add(-time.Minute), now.Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
			setSecret("first") // only a long-gone other replica: not waited for
			if err := s.Store.ReplicaAlive(ctx, "behind", time.Now(), now.Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
			var acked atomic.Bool
			go func() {
				time.Sleep(300 * time.Millisecond)
				acked.Store(true)
				if err := s.Store.ReplicaSawChanges(ctx, "behind", 1<<40); err != nil {
					t.Error(err)
				}
			}()
			setSecret("second")
			if !acked.Load() {
				t.Fatal("the write answered before the other live replica had seen it")
			}
		})
	}
}
