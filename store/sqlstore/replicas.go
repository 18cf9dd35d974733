package sqlstore

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// ReplicaAlive implements store.Replicas.
func (s *Store) ReplicaAlive(ctx context.Context, replica string, at, forgetBefore time.Time) error {
	return s.inTx(ctx, func(tx *Store) error {
		if _, err := tx.q.ExecContext(ctx, tx.rebind(`INSERT INTO replicas (id, seen_at) VALUES (?, ?)
			ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at`), replica, at.UnixMilli()); err != nil {
			return err
		}
		cut := forgetBefore.UnixMilli()
		if _, err := tx.q.ExecContext(ctx, tx.rebind(`DELETE FROM replica_modules WHERE replica_id IN (SELECT id FROM replicas WHERE seen_at < ?)`), cut); err != nil {
			return err
		}
		_, err := tx.q.ExecContext(ctx, tx.rebind(`DELETE FROM replicas WHERE seen_at < ?`), cut)
		return err
	})
}

// ReplicaGone implements store.Replicas.
func (s *Store) ReplicaGone(ctx context.Context, replica string) error {
	return s.inTx(ctx, func(tx *Store) error {
		if _, err := tx.q.ExecContext(ctx, tx.rebind(`DELETE FROM replica_modules WHERE replica_id = ?`), replica); err != nil {
			return err
		}
		_, err := tx.q.ExecContext(ctx, tx.rebind(`DELETE FROM replicas WHERE id = ?`), replica)
		return err
	})
}

// LiveReplicas implements store.Replicas.
func (s *Store) LiveReplicas(ctx context.Context, since time.Time) ([]string, error) {
	var ids []string
	err := sqlx.SelectContext(ctx, s.q, &ids, s.rebind(`SELECT id FROM replicas WHERE seen_at >= ? ORDER BY id`), since.UnixMilli())
	return ids, err
}

// ModuleReady implements store.Replicas.
func (s *Store) ModuleReady(ctx context.Context, replica, moduleHash string, at time.Time) error {
	_, err := s.q.ExecContext(ctx, s.rebind(`INSERT INTO replica_modules (module_hash, replica_id, ready_at) VALUES (?, ?, ?)
		ON CONFLICT (module_hash, replica_id) DO UPDATE SET ready_at = excluded.ready_at`), moduleHash, replica, at.UnixMilli())
	return err
}

// ModuleReadyOn implements store.Replicas.
func (s *Store) ModuleReadyOn(ctx context.Context, moduleHash string) ([]string, error) {
	var ids []string
	err := sqlx.SelectContext(ctx, s.q, &ids, s.rebind(`SELECT replica_id FROM replica_modules WHERE module_hash = ? ORDER BY replica_id`), moduleHash)
	return ids, err
}

// ReplicaSawChanges implements store.Replicas.
func (s *Store) ReplicaSawChanges(ctx context.Context, replica string, seq int64) error {
	_, err := s.q.ExecContext(ctx, s.rebind(`UPDATE replicas SET seen_seq = ? WHERE id = ? AND seen_seq < ?`), seq, replica, seq)
	return err
}

// ReplicasBehind implements store.Replicas.
func (s *Store) ReplicasBehind(ctx context.Context, except string, seq int64, since time.Time) ([]string, error) {
	var ids []string
	err := sqlx.SelectContext(ctx, s.q, &ids, s.rebind(`SELECT id FROM replicas WHERE seen_at >= ? AND id <> ? AND seen_seq < ? ORDER BY id`),
		since.UnixMilli(), except, seq)
	return ids, err
}
