// Package storetest is the conformance suite of store.Store and the helper
// that gives tests a fresh database on every backend available: SQLite always,
// PostgreSQL when SANDBOT_TEST_DATABASE_URL is set or one answers on
// 127.0.0.1:5432. With CI=true a missing PostgreSQL is a failure, not a skip.
package storetest

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/lib/pq" // PostgreSQL driver for creating test databases
)

// Backend is one database a test runs against.
type Backend struct {
	Name string
	// NewURL creates an empty database and returns its URL (a file path for
	// SQLite); the database is dropped when the test ends.
	NewURL func(t testing.TB) string
}

// DefaultPostgresURL is probed when SANDBOT_TEST_DATABASE_URL is unset.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Backends lists the backends to test on.
func Backends(t testing.TB) []Backend {
	out := []Backend{{Name: "sqlite", NewURL: func(t testing.TB) string {
		return filepath.Join(t.TempDir(), "sandbot.db")
	}}}
	admin := os.Getenv("SANDBOT_TEST_DATABASE_URL")
	explicit := admin != ""
	if !explicit {
		admin = DefaultPostgresURL
	}
	if err := probe(admin); err != nil {
		if explicit || os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL required for tests but unreachable at %s: %v", redact(admin), err)
		}
		t.Logf("PostgreSQL not reachable (%v): testing SQLite only", err)
		return out
	}
	return append(out, Backend{Name: "postgres", NewURL: func(t testing.TB) string { return newPostgresDB(t, admin) }})
}

func probe(dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	host := u.Host
	if !strings.Contains(host, ":") {
		host += ":5432"
	}
	c, err := net.DialTimeout("tcp", host, time.Second)
	if err != nil {
		return err
	}
	c.Close()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

func newPostgresDB(t testing.TB, admin string) string {
	db, err := sql.Open("postgres", admin)
	if err != nil {
		t.Fatal(err)
	}
	name := "sandbot_test_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
	if _, err := db.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		db.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
		db.Close()
	})
	u, _ := url.Parse(admin)
	u.Path = "/" + name
	return u.String()
}

func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(invalid URL)"
	}
	return u.Redacted()
}
