package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/sandbot/sandbot/store/storetest"
)

func openCachingDB(t *testing.T) (*sql.DB, *sql.Conn) {
	t.Helper()
	registerCachingDrivers()
	db, err := sql.Open(sqliteDriverName, "file:"+filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(ctx, `CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := conn.ExecContext(ctx, `INSERT INTO t (x) VALUES (?)`, i); err != nil {
			t.Fatal(err)
		}
	}
	return db, conn
}

// cacheOf is the statement cache of conn's driver connection.
func cacheOf(t *testing.T, conn *sql.Conn) *cachingConn {
	var c *cachingConn
	if err := conn.Raw(func(dc any) error {
		var ok bool
		c, ok = dc.(*cachingConn)
		if !ok {
			return fmt.Errorf("driver connection is %T", dc)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStmtCacheReusesStatements(t *testing.T) {
	_, conn := openCachingDB(t)
	ctx := context.Background()
	c := cacheOf(t, conn)
	before := c.lru.Len()
	for range 3 {
		var n int
		if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM t WHERE x >= ?`, 2).Scan(&n); err != nil || n != 3 {
			t.Fatalf("count = %d, %v; want 3", n, err)
		}
	}
	if got := c.lru.Len() - before; got != 1 {
		t.Fatalf("three runs of one query added %d cached statements, want 1", got)
	}
	// The INSERT of the setup ran five times as one statement.
	if _, ok := c.byQuery[`INSERT INTO t (x) VALUES (?)`]; !ok {
		t.Fatal("the INSERT is not cached")
	}
}

// A query whose statement has rows open runs on a statement of its own:
// the open rows go on where they were.
func TestStmtCacheSameQueryWhileRowsOpen(t *testing.T) {
	_, conn := openCachingDB(t)
	ctx := context.Background()
	const q = `SELECT x FROM t ORDER BY x`
	outer, err := conn.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for outer.Next() {
		var x int
		if err := outer.Scan(&x); err != nil {
			t.Fatal(err)
		}
		got = append(got, x)
		if x == 1 {
			// database/sql runs this on another connection (the first is
			// busy): run it on the same driver connection through Raw.
			if err := conn.Raw(func(dc any) error {
				rows, err := dc.(*cachingConn).QueryContext(ctx, q, nil)
				if err != nil {
					return err
				}
				return rows.Close()
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := outer.Close(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Fatalf("outer rows = %v, want [0 1 2 3 4]", got)
	}
}

// Statements evicted while their rows are open are closed when the rows
// close, and the cache stays within its bound.
func TestStmtCacheBound(t *testing.T) {
	_, conn := openCachingDB(t)
	ctx := context.Background()
	c := cacheOf(t, conn)
	rows, err := conn.QueryContext(ctx, `SELECT x FROM t ORDER BY x`)
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	if err := conn.Raw(func(dc any) error {
		for i := range stmtCacheSize + 10 {
			var n int
			r, err := dc.(*cachingConn).QueryContext(ctx, fmt.Sprintf(`SELECT %d`, i), nil)
			if err != nil {
				return err
			}
			r.Close()
			_ = n
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c.lru.Len() > stmtCacheSize {
		t.Fatalf("%d statements cached, bound %d", c.lru.Len(), stmtCacheSize)
	}
	var rest []int
	for rows.Next() {
		var x int
		rows.Scan(&x)
		rest = append(rest, x)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rest) != "[1 2 3 4]" {
		t.Fatalf("rows of an evicted statement = %v, want [1 2 3 4]", rest)
	}
}

// On PostgreSQL a query with parameters is prepared once per connection
// (a named statement, run in one round trip), one without parameters is
// not, nor is a search's, and the driver's own conversion of arguments (a
// []string to an array) still applies.
func TestStmtCachePostgres(t *testing.T) {
	var url string
	for _, b := range storetest.Backends(t) {
		if b.Name == "postgres" {
			url = b.NewURL(t)
		}
	}
	if url == "" {
		t.Skip("no PostgreSQL")
	}
	ctx := context.Background()
	s, err := Open(ctx, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, c := range []struct {
		query string
		arg   any
	}{
		// A []string is lib/pq's to convert (an array).
		{`SELECT cardinality($1::text[]) /* stmtcache-marker */`, []string{"a", "b"}},
		// A search's query (Store.searchSQL) is planned for its
		// parameters each time: not kept.
		{s.searchSQL(`SELECT ? + 1 /* stmtcache-search */`), 1},
	} {
		for range 3 {
			var n int
			if err := conn.QueryRowContext(ctx, c.query, c.arg).Scan(&n); err != nil || n != 2 {
				t.Fatalf("%s = %d, %v", c.query, n, err)
			}
		}
	}
	if _, err := conn.ExecContext(ctx, `SELECT 1 /* stmtcache-noargs */`); err != nil {
		t.Fatal(err)
	}
	prepared := func(marker string) (n int) {
		// No parameters: a simple query, which is not prepared itself.
		if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%stmtcache-' || '`+marker+`%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := prepared("marker"); n != 1 {
		t.Fatalf("three runs of a query left %d prepared statements, want 1", n)
	}
	if n := prepared("noargs"); n != 0 {
		t.Fatalf("a query without parameters left %d prepared statements, want 0", n)
	}
	if n := prepared("search"); n != 0 {
		t.Fatalf("a search left %d prepared statements, want 0", n)
	}
}
