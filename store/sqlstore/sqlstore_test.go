package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// openStore opens (and migrates) the database at url until the test ends.
func openStore(t testing.TB, url string) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), url, sqlstore.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) store.Store { return openStore(t, b.NewURL(t)) })
		})
	}
}

func TestMigrateTwiceIsNoop(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			url := b.NewURL(t)
			for i := 0; i < 2; i++ {
				s, err := sqlstore.Open(context.Background(), url, sqlstore.Options{Migrate: true})
				if err != nil {
					t.Fatalf("open %d: %v", i, err)
				}
				s.Close()
			}
		})
	}
}

// TestTwoStoresOneDatabase: two stores over one database (two processes,
// or replicas) see each other's updates and deletions at the next read,
// although each keeps its own cache of rows it has read.
func TestTwoStoresOneDatabase(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.NewURL(t)
			a, c := openStore(t, url), openStore(t, url)
			w := store.Write{Project: "p1"}
			rec, err := a.Create(ctx, fhir.Resource{"resourceType": "Bot", "name": "v1"}, w)
			if err != nil {
				t.Fatal(err)
			}
			name := func(s *sqlstore.Store) string { return botName(t, s.Read, rec.ID) }
			for i := 0; i < 3; i++ { // read repeatedly, so that a cache holds it
				if got := name(c); got != "v1" {
					t.Fatalf("read %d on the second store: %q", i, got)
				}
			}
			for i := 2; i <= 4; i++ {
				want := fmt.Sprintf("v%d", i)
				renameBot(t, a, rec.ID, want)
				if got := name(c); got != want {
					t.Fatalf("after update %d, the second store reads %q", i, got)
				}
				if got := name(a); got != want {
					t.Fatalf("after update %d, the first store reads %q", i, got)
				}
			}
			// A scope without the project hides the row, cached or not.
			if _, err := c.Read(ctx, store.ProjectScope("p2"), "Bot", rec.ID); !errors.Is(err, fhir.ErrNotFound) {
				t.Fatalf("read in another project's scope: %v, want not found", err)
			}
			if err := c.Delete(ctx, store.AllProjects, "Bot", rec.ID, w); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Read(ctx, store.AllProjects, "Bot", rec.ID); !errors.Is(err, fhir.ErrGone) {
				t.Fatalf("read on the first store after a delete on the second: %v, want gone", err)
			}
			if _, err := c.Read(ctx, store.AllProjects, "Bot", rec.ID); !errors.Is(err, fhir.ErrGone) {
				t.Fatalf("read on the second store after its delete: %v, want gone", err)
			}
		})
	}
}

// TestReadCachedSeesChanges: ReadCached serves a Bot from the process's
// copy on PostgreSQL; the writing store reads its own change at once, the
// other store within the change feed's delay; a cached row still obeys the
// scope.
func TestReadCachedSeesChanges(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.NewURL(t)
			a, c := openStore(t, url), openStore(t, url)
			// The cache is used while the change feed runs, which the
			// first subscription starts.
			defer a.Subscribe(func([]store.Change) {})()
			defer c.Subscribe(func([]store.Change) {})()
			w := store.Write{Project: "p1"}
			rec, err := a.Create(ctx, fhir.Resource{"resourceType": "Bot", "name": "v1"}, w)
			if err != nil {
				t.Fatal(err)
			}
			name := func(s *sqlstore.Store) string { return botName(t, s.ReadCached, rec.ID) }
			for _, s := range []*sqlstore.Store{a, c, a, c} {
				if got := name(s); got != "v1" {
					t.Fatalf("read: %q, want v1", got)
				}
			}
			// PostgreSQL's stores hold it now; SQLite has no such cache
			// (its read cache, exact, serves every read).
			if held := sqlstore.HotHolds(c, "Bot", rec.ID); held != (b.Name == "postgres") {
				t.Fatalf("the hot cache holds the Bot: %v on %s", held, b.Name)
			}
			if _, err := c.ReadCached(ctx, store.ProjectScope("p2"), "Bot", rec.ID); !errors.Is(err, fhir.ErrNotFound) {
				t.Fatalf("cached read in another project's scope: %v, want not found", err)
			}
			renameBot(t, a, rec.ID, "v2")
			if sqlstore.HotHolds(a, "Bot", rec.ID) {
				t.Fatal("the writing store still holds the Bot after its update returned")
			}
			if got := name(a); got != "v2" {
				t.Fatalf("the writing store reads %q after its update, want v2", got)
			}
			deadline := time.Now().Add(5 * time.Second)
			for name(c) != "v2" {
				if time.Now().After(deadline) {
					t.Fatal("the other store still reads v1 5 s after the update")
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// botName is the name of the Bot id as read reads it.
func botName(t *testing.T, read func(ctx context.Context, scope store.Scope, typ, id string) (*store.Record, error), id string) string {
	t.Helper()
	r, err := read(context.Background(), store.AllProjects, "Bot", id)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	res, err := r.Resource()
	if err != nil {
		t.Fatal(err)
	}
	return res["name"].(string)
}

// renameBot updates the name of the Bot id (of project p1) through s.
func renameBot(t *testing.T, s *sqlstore.Store, id, name string) {
	t.Helper()
	if _, err := s.Update(context.Background(), store.AllProjects, "Bot", id, store.Write{Project: "p1"}, func(r fhir.Resource) (fhir.Resource, error) {
		r["name"] = name
		return r, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestReadCacheNeverGoesBack: while one store updates a resource 200 times,
// readers on it and on a second store over the same database never read a
// version older than the last update that had returned before their read
// began.
func TestReadCacheNeverGoesBack(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.NewURL(t)
			writer, other := openStore(t, url), openStore(t, url)
			w := store.Write{Project: "p1"}
			rec, err := writer.Create(ctx, fhir.Resource{"resourceType": "Bot", "name": "0"}, w)
			if err != nil {
				t.Fatal(err)
			}
			var committed atomic.Int64
			done := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for _, s := range []*sqlstore.Store{writer, other, writer, other} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-done:
							return
						default:
						}
						floor := committed.Load()
						r, err := s.Read(ctx, store.AllProjects, "Bot", rec.ID)
						if err != nil {
							errs <- err
							return
						}
						res, _ := r.Resource()
						n, _ := strconv.ParseInt(res["name"].(string), 10, 64)
						if n < floor {
							errs <- fmt.Errorf("read version %d after update %d had returned", n, floor)
							return
						}
					}
				}()
			}
			for i := int64(1); i <= 200; i++ {
				if _, err := writer.Update(ctx, store.AllProjects, "Bot", rec.ID, w, func(r fhir.Resource) (fhir.Resource, error) {
					r["name"] = strconv.FormatInt(i, 10)
					return r, nil
				}); err != nil {
					t.Fatal(err)
				}
				committed.Store(i)
			}
			close(done)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// waitChange waits until ch delivers a change of typ/id and returns how long
// it took.
func waitChange(t *testing.T, ch <-chan store.Change, typ, id string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-ch:
			if c.ResourceType == typ && c.ID == id {
				return time.Since(start)
			}
		case <-deadline:
			t.Fatalf("no change of %s/%s reached the other store", typ, id)
		}
	}
}

func subscribeChan(s *sqlstore.Store) <-chan store.Change {
	ch := make(chan store.Change, 1000)
	s.Subscribe(func(cs []store.Change) {
		for _, c := range cs {
			ch <- c
		}
	})
	return ch
}

// TestChangesReachOtherStores: an update or deletion committed through one
// store reaches the subscribers of another store over the same database
// (another replica): by notification on PostgreSQL, through the shared
// counter on SQLite.
func TestChangesReachOtherStores(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.NewURL(t)
			a, c := openStore(t, url), openStore(t, url)
			ch := subscribeChan(c)
			w := store.Write{Project: "p1"}
			rec, err := a.Create(ctx, fhir.Resource{"resourceType": "ProjectMembership", "active": true}, w)
			if err != nil {
				t.Fatal(err)
			}
			var worst time.Duration
			for i := 0; i < 5; i++ {
				if _, err := a.Update(ctx, store.AllProjects, "ProjectMembership", rec.ID, w, func(r fhir.Resource) (fhir.Resource, error) {
					r["active"] = i%2 == 0
					return r, nil
				}); err != nil {
					t.Fatal(err)
				}
				worst = max(worst, waitChange(t, ch, "ProjectMembership", rec.ID))
			}
			if err := a.Delete(ctx, store.AllProjects, "ProjectMembership", rec.ID, w); err != nil {
				t.Fatal(err)
			}
			worst = max(worst, waitChange(t, ch, "ProjectMembership", rec.ID))
			t.Logf("slowest change seen by the other store after %v", worst)
		})
	}
}

// TestChangeFeedPollsWhatWasNotNotified: a change row whose notification
// never came (written here without one, as when the listening connection
// was down at the time) is read by the poll; a gap in the numbers (rows
// pruned while a process was away) is delivered as "anything may have
// changed".
func TestChangeFeedPollsWhatWasNotNotified(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			url := b.NewURL(t)
			s, err := sqlstore.Open(context.Background(), url, sqlstore.Options{Migrate: true, ChangePollInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			ch := subscribeChan(s)
			// Written behind the feed's back: no notification, no counter.
			for _, q := range []string{`UPDATE change_seq SET seq = seq + 3`,
				`INSERT INTO changes (seq, resource_type, resource_id, project_id, committed_at) SELECT seq, 'Login', 'silent', 'p1', 0 FROM change_seq`} {
				if _, err := s.DB().Exec(q); err != nil {
					t.Fatal(err)
				}
			}
			// The gap before the silent row (seq+1, seq+2 never written)
			// comes first, as a change of everything.
			got := false
			deadline := time.After(10 * time.Second)
		wait:
			for {
				select {
				case c := <-ch:
					if c.ResourceType == "" {
						got = true
					}
					if c.ID == "silent" {
						break wait
					}
				case <-deadline:
					t.Fatal("the silent change was never read")
				}
			}
			if !got {
				t.Error("a gap in the sequence was not delivered as a change of everything")
			}
		})
	}
}

// TestReindexAtStart: index rows written under another version of the
// parameter table are rebuilt when the store is next opened with Migrate,
// resuming where an interrupted rebuild stopped, and a second open does
// nothing.
func TestReindexAtStart(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.NewURL(t)
			s := openStore(t, url)
			var ids []string
			for i := 0; i < 3; i++ {
				rec, err := s.Create(ctx, fhir.Resource{"resourceType": "Patient", "name": []any{map[string]any{"family": "Reindex"}}}, store.Write{Project: "p1"})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, rec.ID)
			}
			found := func(s *sqlstore.Store) int {
				req, _ := fhir.ParseSearch("Patient", "name=reindex")
				res, err := s.Search(ctx, store.AllProjects, req)
				if err != nil {
					t.Fatal(err)
				}
				return len(res.Records)
			}
			if n := found(s); n != 3 {
				t.Fatalf("found %d before", n)
			}
			// An older index: no rows, another version; a rebuild that
			// stopped after the second resource (ids are in creation order).
			exec := func(q string) {
				if _, err := s.DB().ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			exec(`DELETE FROM search_string`)
			exec(`UPDATE key_values SET value = 'old' WHERE name = 'search-index-version'`)
			exec(`INSERT INTO key_values (name, value) VALUES ('search-index-progress', '` + fhir.SearchIndexVersion() + `:` + ids[1] + `')`)
			s.Close()
			s2 := openStore(t, url)
			if n := found(s2); n != 1 {
				t.Errorf("after a resumed rebuild: found %d, want only the one after the progress mark", n)
			}
			var v string
			if err := s2.DB().QueryRowContext(ctx, `SELECT value FROM key_values WHERE name = 'search-index-version'`).Scan(&v); err != nil || v != fhir.SearchIndexVersion() {
				t.Errorf("version %q %v", v, err)
			}
			// A full rebuild from another version.
			if _, err := s2.DB().ExecContext(ctx, `UPDATE key_values SET value = 'old' WHERE name = 'search-index-version'`); err != nil {
				t.Fatal(err)
			}
			s2.Close()
			s3 := openStore(t, url)
			if n := found(s3); n != 3 {
				t.Errorf("after a rebuild: found %d", n)
			}
			var rows int
			s3.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM search_string`).Scan(&rows)
			s3.Close()
			s4 := openStore(t, url) // nothing to do: the rows stay as they are
			var again int
			s4.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM search_string`).Scan(&again)
			if again != rows || found(s4) != 3 {
				t.Errorf("second open changed the index: %d -> %d rows", rows, again)
			}
		})
	}
}

// TestCompositeRowsOfExistingData: resources stored before composite
// parameters existed (no composite rows, an index of an older version) are
// found by a composite search once the store has opened again: the rebuild
// at start writes their rows (decision 50).
func TestCompositeRowsOfExistingData(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.NewURL(t)
			s := openStore(t, url)
			obs, err := fhir.ParseResource([]byte(`{"resourceType":"Observation","status":"final","code":{"text":"bp"},"component":[
				{"code":{"coding":[{"system":"http://loinc.org","code":"8480-6"}]},"valueQuantity":{"value":150}}]}`))
			if err != nil {
				t.Fatal(err)
			}
			rec, err := s.Create(ctx, obs, store.Write{Project: "p1"})
			if err != nil {
				t.Fatal(err)
			}
			found := func(s *sqlstore.Store) int {
				req, _ := fhir.ParseSearch("Observation", "component-code-value-quantity=http://loinc.org|8480-6$gt100")
				res, err := s.Search(ctx, store.AllProjects, req)
				if err != nil {
					t.Fatal(err)
				}
				return len(res.Records)
			}
			for _, q := range []string{`DELETE FROM search_token WHERE code LIKE '%$%'`, `DELETE FROM search_number WHERE code LIKE '%$%'`,
				`UPDATE key_values SET value = 'before-composites' WHERE name = 'search-index-version'`} {
				if _, err := s.DB().ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if n := found(s); n != 0 {
				t.Fatalf("found %d without composite rows", n)
			}
			s.Close()
			s2 := openStore(t, url)
			if n := found(s2); n != 1 {
				t.Errorf("after the rebuild at start: found %d, want %s", n, rec.ID)
			}
		})
	}
}

// TestDeadlockIsUnavailable: PostgreSQL breaks a deadlock (two transactions
// taking the same two locks in opposite orders, as two transaction Bundles
// with conditional entries on two types can) by aborting one; that
// transaction wrote nothing and may be sent again, so the error is
// store.IsUnavailable (a 503 with Retry-After), not a 500.
func TestDeadlockIsUnavailable(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		if b.Name != "postgres" {
			continue
		}
		s := openStore(t, b.NewURL(t))
		ctx := context.Background()
		var both sync.WaitGroup
		both.Add(2)
		errs := make([]error, 2)
		done := make(chan struct{}, 2)
		for i, keys := range [][2]string{{"a", "b"}, {"b", "a"}} {
			go func() {
				errs[i] = s.InTx(ctx, func(tx store.Store) error {
					if err := tx.Lock(ctx, keys[0]); err != nil {
						return err
					}
					both.Done()
					both.Wait() // each holds its first lock
					return tx.Lock(ctx, keys[1])
				})
				done <- struct{}{}
			}()
		}
		for range 2 {
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the deadlock was not broken")
			}
		}
		failed := 0
		for _, err := range errs {
			if err != nil {
				failed++
				if !store.IsUnavailable(err) {
					t.Errorf("a deadlock's error is not IsUnavailable: %v", err)
				}
			}
		}
		if failed != 1 {
			t.Fatalf("want one transaction aborted, got %v", errs)
		}
	}
}
