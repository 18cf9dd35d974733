package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// TestBackupWhileWriting copies a SQLite store while four writers keep
// creating resources, then opens the copy as a store of its own: every
// creation that returned before the copy began is in it, and the copy is
// a database the store migrates and writes to.
func TestBackupWhileWriting(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, filepath.Join(dir, "sandbot.db"))
	ctx := context.Background()

	var mu sync.Mutex
	var acked []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				rec, err := s.Create(ctx, fhir.Resource{"resourceType": "Patient", "active": true}, store.Write{Project: "p1"})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked = append(acked, rec.ID)
				mu.Unlock()
			}
		}()
	}
	// Let the writers get going, so that the copy starts amid their commits.
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 200 || t.Failed() {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	before := append([]string(nil), acked...)
	mu.Unlock()
	dest := filepath.Join(dir, "backup", "copy.db")
	if err := os.Mkdir(filepath.Dir(dest), 0o700); err != nil {
		t.Fatal(err)
	}
	size, err := sqlstore.Backup(ctx, filepath.Join(dir, "sandbot.db"), dest)
	mu.Lock()
	during := len(acked) - len(before)
	mu.Unlock()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("backup of %d bytes; %d creations acknowledged before it began, %d while it ran", size, len(before), during)
	if leftovers, _ := filepath.Glob(filepath.Join(dir, "backup", ".*partial*")); len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}

	restored := openStore(t, dest)
	for _, id := range before {
		if _, err := restored.Read(ctx, store.AllProjects, "Patient", id); err != nil {
			t.Fatalf("Patient/%s, acknowledged before the backup began, is not in it: %v", id, err)
		}
	}
	if _, err := restored.Create(ctx, fhir.Resource{"resourceType": "Patient"}, store.Write{Project: "p1"}); err != nil {
		t.Fatalf("write to the restored copy: %v", err)
	}

	if _, err := sqlstore.Backup(ctx, filepath.Join(dir, "sandbot.db"), dest); !errors.Is(err, sqlstore.ErrBackupExists) {
		t.Errorf("backup over an existing file: %v, want ErrBackupExists", err)
	}
	if _, err := sqlstore.Backup(ctx, filepath.Join(dir, "missing.db"), filepath.Join(dir, "x.db")); err == nil {
		t.Error("backup of a missing database succeeded")
	} else if _, statErr := os.Stat(filepath.Join(dir, "missing.db")); statErr == nil {
		t.Error("backup of a missing database created it")
	}
	if _, err := sqlstore.Backup(ctx, "postgres://localhost/sandbot", filepath.Join(dir, "pg.db")); err == nil {
		t.Error("backup of a PostgreSQL URL succeeded")
	}
}

// TestSQLiteSynchronousFull checks that every connection of the pool syncs
// the WAL at each commit (synchronous=FULL, 2): an acknowledged write
// survives a power loss (store/RATIONALE.md).
func TestSQLiteSynchronousFull(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "sandbot.db"))
	ctx := context.Background()
	// Hold several connections at once so that more than one is checked.
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 3 {
		c, err := s.DB().Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var mode int
		if err := c.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if mode != 2 {
			t.Fatalf("PRAGMA synchronous = %d, want 2 (FULL)", mode)
		}
	}
}
