// Package sqlstore is the one SQL implementation of store.Store, over sqlx,
// for PostgreSQL (lib/pq) and SQLite (modernc.org/sqlite, pure Go). The two
// dialects share every query; they differ in their migrations, in how a
// connection is opened, tuned and locked, and in the read cache that only
// SQLite has (store/RATIONALE.md).
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite" // SQLite driver

	"github.com/sandbot/sandbot/store"
)

// Dialect names a supported database.
type Dialect string

// Supported dialects.
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

// Store is the SQL store. Its zero value is not usable; call Open.
type Store struct {
	db      *sqlx.DB
	dialect Dialect
	// q runs queries: the pool, or the transaction of a store made by InTx.
	q  sqlx.ExtContext
	tx *sqlx.Tx
	// prepared holds statements prepared once on the pool, shared by the
	// copies of the store that transactions make.
	prepared *preparedStmts
	log      *slog.Logger
	now      func() time.Time
	// cache serves repeated reads of SQLite rows (nil for PostgreSQL).
	cache *readCache
	// hot keeps the rows of store.CachedTypes on PostgreSQL (nil for SQLite).
	hot *hotCache
	// touched collects, in a transaction, the resources it updates or
	// deletes: for the change feed before the commit, for the cache after.
	touched *[]store.Change
	// counts collects, in a transaction, its changes to the counts
	// (counts.go), written just before the commit.
	counts *countDeltas
	// feed announces changes to every process on the database (changes.go).
	feed *changeFeed
	// rateSwept is when CountHit last deleted ended windows (unix seconds).
	rateSwept *atomic.Int64
	// stopOptimizer ends the SQLite statistics loop (nil for PostgreSQL).
	stopOptimizer func()
	// url is the database URL Open was given (River's listener connects to
	// it on PostgreSQL).
	url string
	// river is the River driver over the pool (river.go).
	river *riverState
	// metrics time operations and count the database's errors (nil: none).
	metrics *storeMetrics
	// written collects, in a transaction, the resources it writes, for the
	// write hook (hooks) that sees them before the commit.
	written *[]store.Written
	hooks   *writeHooks
}

// writeHooks holds the function that sees every transaction's writes before
// it commits (SetWriteHook).
type writeHooks struct {
	mu      sync.RWMutex
	onWrite []func(ctx context.Context, tx store.Store, writes []store.Written) error
}

// SetWriteHook has fn called in every transaction that wrote resources (by
// Create, Update or Delete; CreateMany's are not seen), just before it
// commits, with the transaction and its writes: what fn writes (a job) is
// committed with them or not at all, and an error of fn rolls everything
// back. Set it before the store serves writes.
func (s *Store) SetWriteHook(fn func(ctx context.Context, tx store.Store, writes []store.Written) error) {
	s.AddWriteHook(fn)
}

// AddWriteHook adds a write hook (SetWriteHook): every hook is called, in
// the order they were added, and the first error rolls the transaction
// back. SetWriteHook is the same call.
func (s *Store) AddWriteHook(fn func(ctx context.Context, tx store.Store, writes []store.Written) error) {
	s.hooks.mu.Lock()
	s.hooks.onWrite = append(s.hooks.onWrite, fn)
	s.hooks.mu.Unlock()
}

// optimizeInterval is how often SQLite refreshes its planner statistics.
const optimizeInterval = 10 * time.Minute

// optimizeLoop keeps SQLite's planner statistics current, as SQLite
// recommends for long-lived connections: without them its planner answers a
// name search over 100,000 Patients by walking every Patient in _lastUpdated
// order (~40 ms) instead of probing the name index (~0.5 ms). PostgreSQL's
// autovacuum does this by itself.
func (s *Store) optimizeLoop(stop <-chan struct{}) {
	tick := time.NewTicker(optimizeInterval)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		// 0x10002: analyze every table that would benefit, within SQLite's
		// default analysis limit (cheap when nothing changed).
		if _, err := s.db.ExecContext(ctx, `PRAGMA optimize=0x10002`); err != nil {
			s.log.Warn("sqlite optimize", "err", err)
		}
		cancel()
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// Options tunes Open.
type Options struct {
	// Logger receives migration and slow-path messages.
	Logger *slog.Logger
	// Migrate runs pending migrations before returning (the server does this
	// at start; `sandbot migrate` too).
	Migrate bool
	// MaxOpenConns caps the pool (0: 20 for PostgreSQL).
	MaxOpenConns int
	// ChangePollInterval is how often the change feed reads the changes
	// table whatever it heard (0: every second on PostgreSQL, where it also
	// listens for notifications; every 250 ms on SQLite without shared
	// counters). It bounds how late a change whose notification was lost
	// is seen.
	ChangePollInterval time.Duration
	// Registerer receives the store's metrics (metrics.go) and the change
	// feed's; nil registers none.
	Registerer prometheus.Registerer
	// SQLiteSynchronous overrides SQLite's synchronous setting ("NORMAL" or
	// "FULL"; empty: DefaultSQLiteSynchronous). Only the benchmark that
	// measures what durability costs sets it.
	SQLiteSynchronous string
}

// DialectOf tells which dialect a database URL selects: a postgres:// or
// postgresql:// URL is PostgreSQL, anything else is a SQLite file path.
func DialectOf(databaseURL string) Dialect {
	if strings.HasPrefix(databaseURL, "postgres://") || strings.HasPrefix(databaseURL, "postgresql://") {
		return Postgres
	}
	return SQLite
}

// Open connects to the database and checks that it answers. For SQLite,
// databaseURL is a file path; its directory is created.
func Open(ctx context.Context, databaseURL string, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dialect := DialectOf(databaseURL)
	var db *sqlx.DB
	var err error
	switch dialect {
	case Postgres:
		registerCachingDrivers()
		sqlDB, err := sql.Open(postgresDriverName, databaseURL)
		if err != nil {
			return nil, fmt.Errorf("open postgres: %w", err)
		}
		db = sqlx.NewDb(sqlDB, "postgres")
		n := opts.MaxOpenConns
		if n == 0 {
			n = 20
		}
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
		db.SetConnMaxIdleTime(5 * time.Minute)
	case SQLite:
		if dir := filepath.Dir(databaseURL); dir != "" {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, fmt.Errorf("create data dir: %w", err)
			}
		}
		// WAL lets readers run beside the writer; immediate transactions take
		// the write lock at BEGIN so that busy_timeout applies instead of a
		// deadlock error when two writers upgrade at once. synchronous is
		// FULL unless a benchmark asks otherwise (DefaultSQLiteSynchronous).
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(10000)")
		q.Add("_pragma", "journal_mode(WAL)")
		syncMode := opts.SQLiteSynchronous
		if syncMode == "" {
			syncMode = DefaultSQLiteSynchronous
		}
		if syncMode != "NORMAL" && syncMode != "FULL" {
			return nil, fmt.Errorf("sqlstore: SQLiteSynchronous %q is neither NORMAL nor FULL", syncMode)
		}
		q.Add("_pragma", "synchronous("+syncMode+")")
		q.Add("_pragma", "foreign_keys(1)")
		// The default page cache (2 MiB) thrashes once the random-UUID keyed
		// indexes outgrow it: seeding 100,000 Patients took 3m17s with it and
		// 31s with 64 MiB per connection (allocated only as pages are used).
		q.Add("_pragma", "cache_size(-65536)")
		// Checkpoint the WAL every 16 MiB rather than 4 MiB: pages that
		// consecutive commits touch (the tails of append-mostly indexes) are
		// then copied to the database once instead of at every checkpoint.
		q.Add("_pragma", "wal_autocheckpoint(4096)")
		q.Set("_txlock", "immediate")
		registerCachingDrivers()
		sqlDB, err := sql.Open(sqliteDriverName, "file:"+databaseURL+"?"+q.Encode())
		if err != nil {
			return nil, fmt.Errorf("open sqlite: %w", err)
		}
		db = sqlx.NewDb(sqlDB, "sqlite")
		// Readers run beside the writer in WAL mode; the pool must hold the
		// server's concurrent requests plus the background writers without
		// making requests queue for a connection (8 did, under 8 clients).
		db.SetMaxOpenConns(16)
		db.SetMaxIdleConns(16)
	}
	s := &Store{db: db, dialect: dialect, q: db, log: log, now: time.Now, prepared: &preparedStmts{}, rateSwept: new(atomic.Int64),
		url: databaseURL, river: &riverState{}, metrics: newStoreMetrics(opts.Registerer, dialect), hooks: &writeHooks{}}
	s.feed = &changeFeed{store: s, url: databaseURL, poll: opts.ChangePollInterval, log: log, metrics: newFeedMetrics(opts.Registerer)}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to %s database: %w", dialect, err)
	}
	if opts.Migrate {
		if err := s.Migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
	}
	if dialect == Postgres {
		s.hot = newHotCache()
	}
	if dialect == SQLite {
		if !strings.HasPrefix(databaseURL, ":") && !strings.Contains(databaseURL, "mode=memory") {
			if s.cache, err = newReadCache(databaseURL + "-versions"); err != nil {
				log.Warn("sqlite read cache off: its version counters cannot be shared", "err", err)
			} else {
				s.feed.counter = s.cache.changeCounter()
			}
		}
		stop := make(chan struct{})
		s.stopOptimizer = sync.OnceFunc(func() { close(stop) })
		go s.optimizeLoop(stop)
	}
	return s, nil
}

type preparedStmts struct {
	once sync.Once
	read *sql.Stmt
	err  error

	mu    sync.Mutex
	bySQL map[string]*sql.Stmt
}

// stmt returns q prepared once on the pool (database/sql then prepares it
// once per connection that runs it), bound to s's transaction if it has
// one. done releases the transaction's copy.
func (s *Store) stmt(ctx context.Context, q string) (st *sql.Stmt, done func(), err error) {
	p := s.prepared
	p.mu.Lock()
	st = p.bySQL[q]
	if st == nil {
		if st, err = s.db.PrepareContext(ctx, q); err != nil {
			p.mu.Unlock()
			return nil, nil, err
		}
		if p.bySQL == nil {
			p.bySQL = map[string]*sql.Stmt{}
		}
		p.bySQL[q] = st
	}
	p.mu.Unlock()
	if s.tx == nil {
		return st, func() {}, nil
	}
	txst := s.tx.StmtContext(ctx, st)
	return txst, func() { txst.Close() }, nil
}

// readStmt is readRowSQL prepared on the pool, on first use (after the
// migrations have made the table).
func (s *Store) readStmt(ctx context.Context) (*sql.Stmt, error) {
	p := s.prepared
	p.once.Do(func() { p.read, p.err = s.db.PrepareContext(ctx, s.rebind(readRowSQL)) })
	return p.read, p.err
}

// Dialect is the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// DB is the connection pool, for the pool metrics collector.
func (s *Store) DB() *sql.DB { return s.db.DB }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// Close closes the pool.
func (s *Store) Close() error {
	s.feed.close()
	s.river.close()
	if s.stopOptimizer != nil {
		s.stopOptimizer()
	}
	if st := s.prepared.read; st != nil {
		st.Close()
	}
	s.prepared.mu.Lock()
	for _, st := range s.prepared.bySQL {
		st.Close()
	}
	s.prepared.bySQL = nil
	s.prepared.mu.Unlock()
	if s.cache != nil {
		s.cache.close()
	}
	return s.db.Close()
}

// InTx runs fn in one transaction. Nested calls join the outer transaction.
func (s *Store) InTx(ctx context.Context, fn func(tx store.Store) error) error {
	if s.tx != nil {
		return fn(s)
	}
	start := time.Now()
	err := s.runTx(ctx, fn)
	s.observe(opTransaction, start, err)
	return err
}

func (s *Store) runTx(ctx context.Context, fn func(tx store.Store) error) error {
	opts := &sql.TxOptions{}
	start := time.Now()
	tx, err := s.db.BeginTxx(ctx, opts)
	if m := s.metrics; m != nil {
		m.duration.WithLabelValues(opBegin).Observe(time.Since(start).Seconds())
	}
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	child := *s
	child.q, child.tx = tx, tx
	child.touched = new([]store.Change)
	child.counts = &countDeltas{}
	child.written = new([]store.Written)
	if err := fn(&child); err != nil {
		tx.Rollback()
		return err
	}
	if writes := *child.written; len(writes) > 0 {
		s.hooks.mu.RLock()
		hooks := s.hooks.onWrite
		s.hooks.mu.RUnlock()
		for _, hook := range hooks {
			if err := hook(ctx, &child, writes); err != nil {
				tx.Rollback()
				return err
			}
		}
	}
	if err := child.counts.apply(ctx, &child); err != nil {
		tx.Rollback()
		return err
	}
	touched := *child.touched
	changes, err := child.recordChanges(ctx, touched)
	if err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if s.cache != nil && len(touched) > 0 {
		ids := make([]string, len(touched))
		for i, c := range touched {
			ids[i] = c.ID
		}
		s.cache.invalidate(ids)
	}
	s.feed.committed(changes)
	return nil
}

// inTx runs fn in the current transaction or a new one.
func (s *Store) inTx(ctx context.Context, fn func(tx *Store) error) error {
	return s.InTx(ctx, func(tx store.Store) error { return fn(tx.(*Store)) })
}

func (s *Store) rebind(q string) string { return s.db.Rebind(q) }

// Lock implements store.Store. PostgreSQL takes a transaction-scoped
// advisory lock; SQLite's immediate transactions already hold the database's
// write lock from BEGIN, which serialises every writer.
func (s *Store) Lock(ctx context.Context, keys ...string) error {
	if s.tx == nil {
		return errors.New("sqlstore: Lock outside a transaction")
	}
	if s.dialect != Postgres || len(keys) == 0 {
		return nil
	}
	// In the subquery's order, so that two transactions taking overlapping
	// keys never wait for each other in a cycle.
	_, err := s.q.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM (SELECT DISTINCT k FROM unnest($1::text[]) AS k ORDER BY k) AS sorted`,
		pq.Array(keys))
	return err
}

// KeyValue implements store.Store.
func (s *Store) KeyValue(ctx context.Context, name string, create func() (string, error)) (string, error) {
	var v string
	err := sqlx.GetContext(ctx, s.q, &v, s.rebind(`SELECT value FROM key_values WHERE name = ?`), name)
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return "", err
	}
	nv, err := create()
	if err != nil {
		return "", err
	}
	// Another replica may insert first; whoever wins, everyone reads the winner.
	if _, err := s.q.ExecContext(ctx, s.rebind(`INSERT INTO key_values (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`), name, nv); err != nil {
		return "", err
	}
	err = sqlx.GetContext(ctx, s.q, &v, s.rebind(`SELECT value FROM key_values WHERE name = ?`), name)
	return v, err
}

// DefaultSQLiteSynchronous is FULL, so that a write the server acknowledged
// survives a power loss or an OS crash, as it does on PostgreSQL with its
// default synchronous_commit: in WAL mode FULL syncs the WAL at every commit,
// where NORMAL syncs it only at checkpoints (the last commits before a power
// loss could then be lost, though never corrupted). It costs one fsync per
// transaction: BenchmarkCreateDurability measured 0.80 ms per Patient
// created with NORMAL and 1.01 ms with FULL from one writer on a quiet
// machine, up to 1.14 and 2.48 ms while other work used the disk
// (store/RATIONALE.md).
const DefaultSQLiteSynchronous = "FULL"
