package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sandbot/sandbot/fhir"
)

// The version of the index rows (fhir.SearchIndexVersion) is kept in
// key_values; while a rebuild runs, its progress (version and last id) too,
// so that a rebuild stopped halfway resumes where it was.
const (
	indexVersionKey  = "search-index-version"
	indexProgressKey = "search-index-progress"
	reindexBatch     = 500
)

// reindexAll rebuilds the search index of every live resource when it was
// written under another version of the parameter table or of the
// extraction (after migration 0004, or a refresh of the definitions). It
// runs in batches of reindexBatch resources, each in its own transaction,
// in id order; running it again, or after an interruption, is safe.
func (s *Store) reindexAll(ctx context.Context, q sqlx.ExtContext) error {
	want := fhir.SearchIndexVersion()
	cur, err := s.keyValue(ctx, q, indexVersionKey)
	if err != nil || cur == want {
		return err
	}
	after := ""
	if p, err := s.keyValue(ctx, q, indexProgressKey); err != nil {
		return err
	} else if v, id, ok := strings.Cut(p, ":"); ok && v == want {
		after = id
	}
	start, n := time.Now(), 0
	for {
		var rows []row
		if err := sqlx.SelectContext(ctx, q, &rows, s.rebind(`SELECT `+rowColumns+` FROM resources WHERE id > ? AND deleted = ? ORDER BY id LIMIT ?`), after, false, reindexBatch); err != nil {
			return fmt.Errorf("reindex: %w", err)
		}
		if len(rows) == 0 {
			break
		}
		err := s.inTx(ctx, func(tx *Store) error {
			ids := make([]any, len(rows))
			var idx indexRows
			for i, r := range rows {
				ids[i] = r.ID
				res, err := fhir.ParseResource([]byte(r.Content))
				if err != nil {
					// A row the current code cannot read keeps no index
					// rather than stopping the server.
					s.log.Warn("reindex: stored resource does not parse", "type", r.ResourceType, "id", r.ID, "err", err)
					continue
				}
				idx.add(res, r.ID, r.ProjectID, r.LastUpdated)
			}
			for _, t := range indexTables {
				if _, err := tx.q.ExecContext(ctx, tx.rebind(`DELETE FROM `+t+` WHERE resource_id IN (`+placeholders(len(ids))+`)`), ids...); err != nil {
					return err
				}
			}
			if err := idx.insert(ctx, tx); err != nil {
				return err
			}
			return tx.setKeyValue(ctx, tx.q, indexProgressKey, want+":"+rows[len(rows)-1].ID)
		})
		if err != nil {
			return fmt.Errorf("reindex: %w", err)
		}
		after = rows[len(rows)-1].ID
		n += len(rows)
		if n%(20*reindexBatch) == 0 {
			s.log.Info("reindexing search", "resources", n)
		}
	}
	if err := s.rebuildCounts(ctx); err != nil {
		return err
	}
	if err := s.setKeyValue(ctx, q, indexVersionKey, want); err != nil {
		return err
	}
	if _, err := q.ExecContext(ctx, s.rebind(`DELETE FROM key_values WHERE name = ?`), indexProgressKey); err != nil {
		return err
	}
	if n > 0 || cur != "" {
		s.log.Info("search index rebuilt", "resources", n, "version", want, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// keyValue reads a key_values row; "" when there is none.
func (s *Store) keyValue(ctx context.Context, q sqlx.ExtContext, name string) (string, error) {
	var v string
	err := sqlx.GetContext(ctx, q, &v, s.rebind(`SELECT value FROM key_values WHERE name = ?`), name)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

func (s *Store) setKeyValue(ctx context.Context, q sqlx.ExtContext, name, value string) error {
	_, err := q.ExecContext(ctx, s.rebind(`INSERT INTO key_values (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value`), name, value)
	return err
}
