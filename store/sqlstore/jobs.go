package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandbot/sandbot/store"
)

// The job queue (store.Jobs) is the jobs table of migration 0007. due_at is
// when a waiting job may be claimed and when a claimed job's lease ends, so
// that "claimable" is one range of one index whatever the job's state.

// EnqueueJob implements store.Store.
func (s *Store) EnqueueJob(ctx context.Context, j store.Job) error {
	if j.ID == "" || j.Kind == "" {
		return errors.New("sqlstore: a job needs an id and a kind")
	}
	now := s.now()
	if j.Created.IsZero() {
		j.Created = now
	}
	payload := j.Payload
	if payload == nil {
		payload = []byte{}
	}
	_, err := s.q.ExecContext(ctx, s.rebind(`INSERT INTO jobs (id, project_id, kind, payload, attempts, claim, due_at, created_at)
		VALUES (?, ?, ?, ?, 0, '', ?, ?)`), j.ID, j.Project, j.Kind, payload, now.UnixMilli(), j.Created.UnixMilli())
	if err != nil {
		return fmt.Errorf("enqueue job: %w", err)
	}
	return nil
}

type jobRow struct {
	ID       string `db:"id"`
	Project  string `db:"project_id"`
	Kind     string `db:"kind"`
	Payload  []byte `db:"payload"`
	Attempts int    `db:"attempts"`
	Created  int64  `db:"created_at"`
}

// ClaimJob implements store.Store. On PostgreSQL the job is chosen FOR
// UPDATE SKIP LOCKED, so that runners of other processes claiming at the same
// moment take other jobs instead of waiting for this one; on SQLite the one
// UPDATE runs under the database's write lock, which already serialises
// claims. A read first keeps an idle SQLite runner from taking the write
// lock every time it looks.
func (s *Store) ClaimJob(ctx context.Context, lease time.Duration) (*store.Job, error) {
	now := s.now()
	if s.dialect == SQLite {
		var one int
		err := sqlx.GetContext(ctx, s.q, &one, s.rebind(`SELECT 1 FROM jobs WHERE due_at <= ? LIMIT 1`), now.UnixMilli())
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look for jobs: %w", err)
		}
	}
	pick := `SELECT id FROM jobs WHERE due_at <= ? ORDER BY due_at, id LIMIT 1`
	if s.dialect == Postgres {
		pick += ` FOR UPDATE SKIP LOCKED`
	}
	claim := uuid.NewString()
	var row jobRow
	err := sqlx.GetContext(ctx, s.q, &row, s.rebind(`UPDATE jobs SET claim = ?, attempts = attempts + 1, due_at = ?
		WHERE id = (`+pick+`)
		RETURNING id, project_id, kind, payload, attempts, created_at`), claim, now.Add(lease).UnixMilli(), now.UnixMilli())
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim job: %w", err)
	}
	return &store.Job{ID: row.ID, Project: row.Project, Kind: row.Kind, Payload: row.Payload, Attempts: row.Attempts,
		Claim: claim, Created: time.UnixMilli(row.Created)}, nil
}

// execClaimed runs a statement on the row of a job held by claim:
// store.ErrJobLost when no row is.
func (s *Store) execClaimed(ctx context.Context, what, q string, args ...any) error {
	res, err := s.q.ExecContext(ctx, s.rebind(q), args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n == 0 {
		return store.ErrJobLost
	}
	return nil
}

// RenewJob implements store.Store.
func (s *Store) RenewJob(ctx context.Context, id, claim string, lease time.Duration) error {
	if claim == "" {
		return store.ErrJobLost
	}
	return s.execClaimed(ctx, "renew job", `UPDATE jobs SET due_at = ? WHERE id = ? AND claim = ?`,
		s.now().Add(lease).UnixMilli(), id, claim)
}

// ReleaseJob implements store.Store.
func (s *Store) ReleaseJob(ctx context.Context, id, claim string, delay time.Duration, uncount bool) error {
	if claim == "" {
		return store.ErrJobLost
	}
	dec := 0
	if uncount {
		dec = 1
	}
	return s.execClaimed(ctx, "release job", `UPDATE jobs SET claim = '', due_at = ?, attempts = attempts - ? WHERE id = ? AND claim = ?`,
		s.now().Add(delay).UnixMilli(), dec, id, claim)
}

// FinishJob implements store.Store.
func (s *Store) FinishJob(ctx context.Context, id, claim string) error {
	if claim == "" {
		return store.ErrJobLost
	}
	return s.execClaimed(ctx, "finish job", `DELETE FROM jobs WHERE id = ? AND claim = ?`, id, claim)
}

// CancelJob implements store.Store.
func (s *Store) CancelJob(ctx context.Context, id string) (bool, error) {
	err := s.execClaimed(ctx, "cancel job", `DELETE FROM jobs WHERE id = ?`, id)
	if errors.Is(err, store.ErrJobLost) {
		return false, nil
	}
	return err == nil, err
}

// JobCount implements store.Store.
func (s *Store) JobCount(ctx context.Context, project string) (int, error) {
	var n int
	if err := sqlx.GetContext(ctx, s.q, &n, s.rebind(`SELECT COUNT(*) FROM jobs WHERE project_id = ?`), project); err != nil {
		return 0, fmt.Errorf("count jobs: %w", err)
	}
	return n, nil
}
