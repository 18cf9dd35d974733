package sqlstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"

	"github.com/jmoiron/sqlx"

	"github.com/sandbot/sandbot/fhir"
)

// The counts of migration 0006: live resources per type and project
// (resource_counts), and resources per value of a Counted parameter
// (value_counts), both changed by every write in its transaction. They
// answer _total=accurate without counting rows (count, in search.go).

// countShards spreads a count over rows, so that concurrent writers rarely
// update the same one.
const countShards = 16

// countKey is one value of a Counted parameter of a type in a project.
type countKey struct{ typ, project, code, value string }

// countDeltas accumulates the changes of a transaction to the counts. They
// are written once, just before the commit, in a fixed order and to one
// shard chosen per transaction: two transactions then never hold rows of
// the counts in opposite orders (deadlocks, on PostgreSQL, when each create
// of a long transaction took its own shard as it went).
type countDeltas struct {
	live   map[[2]string]int // (type, project)
	values map[countKey]int
}

func (d *countDeltas) addLive(typ, project string, n int) {
	if d.live == nil {
		d.live = map[[2]string]int{}
	}
	d.live[[2]string{typ, project}] += n
}

func (d *countDeltas) addValue(k countKey, n int) {
	if d.values == nil {
		d.values = map[countKey]int{}
	}
	d.values[k] += n
}

// apply writes the non-zero changes, in a fixed order, to a shard chosen at
// random, and forgets them.
func (d *countDeltas) apply(ctx context.Context, s *Store) error {
	if len(d.live) == 0 && len(d.values) == 0 {
		return nil
	}
	shard := rand.IntN(countShards)
	defer func() { d.live, d.values = nil, nil }()
	lives := make([][2]string, 0, len(d.live))
	for k, n := range d.live {
		if n != 0 {
			lives = append(lives, k)
		}
	}
	sort.Slice(lives, func(i, j int) bool { return lives[i][0]+" "+lives[i][1] < lives[j][0]+" "+lives[j][1] })
	for _, k := range lives {
		if _, err := s.q.ExecContext(ctx, s.rebind(`INSERT INTO resource_counts (resource_type, project_id, shard, live) VALUES (?, ?, ?, ?)
			ON CONFLICT (resource_type, project_id, shard) DO UPDATE SET live = resource_counts.live + excluded.live`), k[0], k[1], shard, d.live[k]); err != nil {
			return fmt.Errorf("count %s: %w", k[0], err)
		}
	}
	keys := make([]countKey, 0, len(d.values))
	for k, n := range d.values {
		if n != 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return a.typ+" "+a.project+" "+a.code+" "+a.value < b.typ+" "+b.project+" "+b.code+" "+b.value
	})
	for _, k := range keys {
		if _, err := s.q.ExecContext(ctx, s.rebind(`INSERT INTO value_counts (resource_type, project_id, code, value, shard, n) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (resource_type, project_id, code, value, shard) DO UPDATE SET n = value_counts.n + excluded.n`), k.typ, k.project, k.code, k.value, shard, d.values[k]); err != nil {
			return fmt.Errorf("count %s %s: %w", k.typ, k.code, err)
		}
	}
	return nil
}

// countedValues are the current values of a resource's Counted parameters,
// read from its index (before the index is replaced or cleared).
func (s *Store) countedValues(ctx context.Context, typ, id string) ([]countKey, error) {
	if !fhir.HasCountedParams(typ) {
		return nil, nil
	}
	var rows []struct {
		Project string `db:"project_id"`
		Code    string `db:"code"`
		Value   string `db:"value"`
	}
	if err := sqlx.SelectContext(ctx, s.q, &rows, s.rebind(`SELECT project_id, code, value FROM search_token WHERE resource_id = ?`), id); err != nil {
		return nil, fmt.Errorf("counted values: %w", err)
	}
	var out []countKey
	for _, r := range rows {
		if p := fhir.LookupParam(typ, r.Code); p != nil && p.Counted {
			out = append(out, countKey{typ, r.Project, r.Code, r.Value})
		}
	}
	return out, nil
}

// rebuildCounts recomputes every count from the resources and the index
// (after a rebuild of the index), in one transaction.
func (s *Store) rebuildCounts(ctx context.Context) error {
	return s.inTx(ctx, func(tx *Store) error {
		for _, q := range []string{
			`DELETE FROM resource_counts`,
			`INSERT INTO resource_counts (resource_type, project_id, shard, live)
				SELECT resource_type, project_id, 0, COUNT(*) FROM resources WHERE deleted = FALSE GROUP BY resource_type, project_id`,
			`DELETE FROM value_counts`,
		} {
			if _, err := tx.q.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("rebuild counts: %w", err)
			}
		}
		for _, typ := range fhir.KnownTypeNames() {
			var codes []any
			for _, p := range fhir.IndexedParams(typ) {
				if p.Counted {
					codes = append(codes, p.Code)
				}
			}
			if len(codes) == 0 {
				continue
			}
			if _, err := tx.q.ExecContext(ctx, tx.rebind(`INSERT INTO value_counts (resource_type, project_id, code, value, shard, n)
				SELECT resource_type, project_id, code, value, 0, COUNT(*) FROM search_token WHERE resource_type = ? AND code IN (`+placeholders(len(codes))+`)
				GROUP BY resource_type, project_id, code, value`), append([]any{typ}, codes...)...); err != nil {
				return fmt.Errorf("rebuild counts of %s: %w", typ, err)
			}
		}
		return nil
	})
}
