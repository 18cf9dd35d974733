package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/sandbot/sandbot/store"
)

// River (riverqueue/river) runs the server's background jobs on the store's
// own database, so that a job and the resources it concerns are written in
// one transaction. Its tables are created by Migrate with the store's own,
// and its driver runs on the store's connection pool: riverdatabasesql over
// lib/pq on PostgreSQL, riversqlite on SQLite. On PostgreSQL a pgx
// connection listens for River's notifications (new jobs, cancellations),
// which database/sql cannot; everything else goes through lib/pq.

// riverState is the River driver of a store, made on first use.
type riverState struct {
	once     sync.Once
	driver   riverdriver.Driver[*sql.Tx]
	listener *pgxpool.Pool
	err      error
}

// RiverDriver is the River driver over the store's pool.
func (s *Store) RiverDriver(ctx context.Context) (riverdriver.Driver[*sql.Tx], error) {
	r := s.river
	r.once.Do(func() {
		if s.dialect == SQLite {
			r.driver = fastInsertSQLite{riversqlite.New(s.db.DB)}
			return
		}
		cfg, err := pgxpool.ParseConfig(s.url)
		if err != nil {
			r.err = fmt.Errorf("river listener: %w", err)
			return
		}
		// River hijacks one connection per client for LISTEN.
		cfg.MinConns, cfg.MaxConns = 0, 1
		if r.listener, r.err = pgxpool.NewWithConfig(ctx, cfg); r.err != nil {
			return
		}
		r.driver = riverdatabasesql.NewWithPgxListener(s.db.DB, r.listener)
	})
	return r.driver, r.err
}

func (r *riverState) close() {
	if r.listener != nil {
		r.listener.Close()
	}
}

// migrateRiver applies River's own migrations, on the connection that holds
// the migration lock.
func (s *Store) migrateRiver(ctx context.Context) error {
	var driver riverdriver.Driver[*sql.Tx]
	if s.dialect == SQLite {
		driver = riversqlite.New(s.db.DB)
	} else {
		driver = riverdatabasesql.New(s.db.DB)
	}
	// River's own lines would repeat those below.
	quiet := slog.New(slog.DiscardHandler)
	m, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: quiet})
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	res, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	for _, v := range res.Versions {
		s.log.Info("applied migration", "dialect", s.dialect, "migration", fmt.Sprintf("river %03d %s", v.Version, v.Name))
	}
	return nil
}

// indexRiver adds the indexes that the job engine's lookups by metadata
// need (a project's backlog, a task's predecessors in its partition), on
// the jobs that have not ended only: without them each lookup scans every
// job of the partition or project, ended ones included (River keeps ended
// jobs for a day), and a worker looks for its task's predecessor every few
// milliseconds while one runs. On PostgreSQL River's GIN index on metadata
// answered them, but it finds every job of the partition and leaves the
// state and the order to a sort: 62% of the database's time under an HL7
// feed (docs/performance.md). The jobs engine's queries repeat these
// indexes' expressions and state lists word for word, so that the planner
// can use them. Created after River's migrations, which make the table,
// under the migration lock; idempotent.
func (s *Store) indexRiver(ctx context.Context) error {
	const active = `state IN ('available', 'pending', 'retryable', 'running', 'scheduled')`
	qs := []string{
		`DROP INDEX IF EXISTS sandbot_river_job_order`,
		`DROP INDEX IF EXISTS sandbot_river_job_partition`,
		`DROP INDEX IF EXISTS sandbot_river_job_project`,
		`CREATE INDEX IF NOT EXISTS sandbot_river_job_partition_active ON river_job (json_extract(metadata, '$.partition'), id) WHERE ` + active,
		`CREATE INDEX IF NOT EXISTS sandbot_river_job_project_active ON river_job (json_extract(metadata, '$.project'), queue) WHERE ` + active,
	}
	if s.dialect == Postgres {
		qs = []string{
			`CREATE INDEX IF NOT EXISTS sandbot_river_job_partition_active ON river_job ((metadata->>'partition'), id) WHERE ` + active,
			`CREATE INDEX IF NOT EXISTS sandbot_river_job_project_active ON river_job ((metadata->>'project'), queue) WHERE ` + active,
		}
	}
	for _, q := range qs {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("river indexes: %w", err)
		}
	}
	return nil
}

// TxOf is the database transaction of a store made by InTx, for River's
// transactional calls (InsertTx, JobCompleteTx, JobCancelTx): false when st
// is not a transaction of a Store.
func TxOf(st store.Store) (*sql.Tx, bool) {
	s, ok := st.(*Store)
	if !ok || s.tx == nil {
		return nil, false
	}
	return s.tx.Tx, true
}
