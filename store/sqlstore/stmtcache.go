package sqlstore

import (
	"container/list"
	"context"
	"database/sql"
	"database/sql/driver"
	"io"
	"reflect"
	"strings"
	"sync"

	"github.com/lib/pq"
	"modernc.org/sqlite"
)

// The drivers the store opens: modernc's SQLite and lib/pq, each with a
// prepared statement cache per connection (cachingConn).
const (
	sqliteDriverName   = "sandbot-sqlite"
	postgresDriverName = "sandbot-postgres"
)

var registerDrivers sync.Once

func registerCachingDrivers() {
	registerDrivers.Do(func() {
		sql.Register(sqliteDriverName, &cachingDriver{base: &sqlite.Driver{}, rules: cacheRules{prepareNoArgs: true}})
		sql.Register(postgresDriverName, &cachingDriver{base: &pq.Driver{}, rules: cacheRules{skipSearches: true}})
	})
}

// searchMarker begins the text of every query of a search (Store.searchSQL).
// PostgreSQL plans a statement it keeps prepared for its parameters five
// times, then may keep a generic plan, blind to them: right for the store's
// own lookups by key and River's queries (which River itself runs prepared
// through pgx), wrong for a search, whose plan depends on how many rows its
// values match (decision 43's member search). A search's statements are
// therefore not kept on PostgreSQL: each is planned for its parameters, as
// before the cache.
const searchMarker = "/* search */ "

// stmtCacheSize bounds the statements each connection keeps prepared. The
// server's queries are a few hundred distinct texts at most; the search
// builder's vary with their parameters, so the least recently used go.
const stmtCacheSize = 256

// stmtCacheMaxQuery is the longest query text cached: longer ones are
// scripts (migrations) or one-off statements.
const stmtCacheMaxQuery = 16 << 10

// cachingDriver opens connections with a prepared statement cache.
//
// modernc prepares every query given to a connection (Exec, Query) and
// finalizes it afterwards; parsing the SQL was 31% of the CPU of keeping
// HL7 messages (River's job inserts, whose text is built per call) and 7% of
// storing AuditEvents (docs/performance.md).
//
// lib/pq sends a query with parameters as an unnamed statement: one round
// trip to parse and describe it, a second to bind and run it, and the
// server parses it every time. A cached (named) statement runs in one round
// trip. A query without parameters is sent as a simple query (one round
// trip already), and a search is planned for its parameters each time
// (searchMarker): they pass through.
//
// With the cache, a query text seen before on the connection runs its
// prepared statement again.
type cachingDriver struct {
	base  driver.Driver
	rules cacheRules
}

// cacheRules say which queries a driver's connections cache, besides those
// too long to (stmtCacheMaxQuery).
type cacheRules struct {
	// prepareNoArgs: queries without parameters are cached too.
	prepareNoArgs bool
	// skipSearches: the queries of searches (searchMarker) are not cached.
	skipSearches bool
}

func (d *cachingDriver) Open(name string) (driver.Conn, error) {
	c, err := d.base.Open(name)
	if err != nil {
		return nil, err
	}
	return newCachingConn(c, d.rules), nil
}

// driverConn is what database/sql uses of a connection of modernc's or
// lib/pq's, both of which implement it.
type driverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// cachingConn is a connection with its cache. database/sql uses a
// connection from one goroutine at a time, so the cache needs no lock.
type cachingConn struct {
	driverConn
	rules   cacheRules
	byQuery map[string]*list.Element // of *cachedStmt
	lru     *list.List               // most recently used first
}

// checkingConn is a cachingConn whose driver converts arguments itself
// (lib/pq's arrays and unsigned integers): database/sql asks the
// connection, which must still answer.
type checkingConn struct {
	*cachingConn
	driver.NamedValueChecker
}

type cachedStmt struct {
	query string
	st    driver.Stmt
	// busy: rows of the statement are open; a query of the same text then
	// prepares a statement of its own.
	busy bool
	// evicted while busy: closed when its rows close.
	evicted bool
}

func newCachingConn(c driver.Conn, rules cacheRules) driver.Conn {
	dc, ok := c.(driverConn)
	if !ok {
		return c // not a driver this was written for: no cache
	}
	cc := &cachingConn{driverConn: dc, rules: rules, byQuery: map[string]*list.Element{}, lru: list.New()}
	if nc, ok := c.(driver.NamedValueChecker); ok {
		return &checkingConn{cachingConn: cc, NamedValueChecker: nc}
	}
	return cc
}

// stmt returns the cached statement of query, preparing it on a miss, or
// nil when query is not to be cached.
func (c *cachingConn) stmt(ctx context.Context, query string, args int) (*cachedStmt, error) {
	if len(query) > stmtCacheMaxQuery || (args == 0 && !c.rules.prepareNoArgs) ||
		(c.rules.skipSearches && strings.HasPrefix(query, searchMarker)) {
		return nil, nil
	}
	if e, ok := c.byQuery[query]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*cachedStmt), nil
	}
	st, err := c.driverConn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	cs := &cachedStmt{query: query, st: st}
	c.byQuery[query] = c.lru.PushFront(cs)
	for c.lru.Len() > stmtCacheSize {
		old := c.lru.Back()
		c.evict(old)
	}
	return cs, nil
}

func (c *cachingConn) evict(e *list.Element) {
	cs := e.Value.(*cachedStmt)
	c.lru.Remove(e)
	delete(c.byQuery, cs.query)
	if cs.busy {
		cs.evicted = true
		return
	}
	cs.st.Close()
}

// forget drops a statement whose run failed: it is prepared again next
// time rather than reused in whatever state the error left it.
func (c *cachingConn) forget(cs *cachedStmt) {
	if e, ok := c.byQuery[cs.query]; ok && e.Value == cs {
		c.evict(e)
	}
}

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cs, err := c.stmt(ctx, query, len(args))
	if err != nil || cs == nil || cs.busy {
		return c.driverConn.ExecContext(ctx, query, args)
	}
	r, err := cs.st.(driver.StmtExecContext).ExecContext(ctx, args)
	if err != nil {
		c.forget(cs)
	}
	return r, err
}

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cs, err := c.stmt(ctx, query, len(args))
	if err != nil || cs == nil || cs.busy {
		return c.driverConn.QueryContext(ctx, query, args)
	}
	rows, err := cs.st.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		c.forget(cs)
		return nil, err
	}
	cs.busy = true
	return &cachedRows{Rows: rows, release: func() {
		cs.busy = false
		if cs.evicted {
			cs.st.Close()
		}
	}}, nil
}

func (c *cachingConn) Close() error {
	for e := c.lru.Front(); e != nil; e = e.Next() {
		e.Value.(*cachedStmt).st.Close()
	}
	c.lru.Init()
	clear(c.byQuery)
	return c.driverConn.Close()
}

// cachedRows are the rows of a cached statement: closing them makes the
// statement free again. The optional column-type methods pass through.
type cachedRows struct {
	driver.Rows
	release func()
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	if r.release != nil {
		r.release()
		r.release = nil
	}
	return err
}

func (r *cachedRows) HasNextResultSet() bool {
	if n, ok := r.Rows.(driver.RowsNextResultSet); ok {
		return n.HasNextResultSet()
	}
	return false
}

func (r *cachedRows) NextResultSet() error {
	if n, ok := r.Rows.(driver.RowsNextResultSet); ok {
		return n.NextResultSet()
	}
	return io.EOF
}

func (r *cachedRows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *cachedRows) ColumnTypeLength(i int) (int64, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeLength); ok {
		return t.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *cachedRows) ColumnTypeNullable(i int) (bool, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *cachedRows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypePrecisionScale); ok {
		return t.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}

func (r *cachedRows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}
