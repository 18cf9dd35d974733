package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivertype"
)

// TestFastInsertSQLiteRows inserts the same jobs through River's statement
// and through fastInsertSQLite's, and compares every column of the rows.
func TestFastInsertSQLiteRows(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "sandbot.db"), Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The store's River driver is the one that inserts this way.
	if d, err := s.RiverDriver(ctx); err != nil {
		t.Fatal(err)
	} else if _, ok := d.(fastInsertSQLite); !ok {
		t.Fatalf("the store's River driver is %T", d)
	}
	created := time.Date(2026, 11, 28, 10, 11, 12, 345678900, time.FixedZone("X", 3600))
	scheduled := created.Add(time.Minute)
	// 20 jobs: more than one statement's worth (fastInsertRows).
	jobs := func() []*riverdriver.JobInsertFastParams {
		var out []*riverdriver.JobInsertFastParams
		for i := range 20 {
			j := &riverdriver.JobInsertFastParams{
				EncodedArgs: fmt.Appendf(nil, `{"kind":"k","payload":{"message":"MSH|^~\\&|\r\"é\" %d"}}`, i),
				CreatedAt:   &created, Kind: "k", MaxAttempts: 4, Priority: 1 + i%4, Queue: "hl7",
				Metadata: []byte(`{"project":"p1","partition":"PAT1"}`), State: rivertype.JobStateAvailable,
				Tags: []string{}}
			switch i % 4 {
			case 1:
				j.Metadata = nil
			case 2:
				j.ScheduledAt, j.State, j.Tags = &scheduled, rivertype.JobStateScheduled, []string{"a", "b"}
			}
			out = append(out, j)
		}
		return out
	}
	insert := func(exec func(*sql.Tx) riverdriver.ExecutorTx) {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		n, err := exec(tx).JobInsertFastManyNoReturning(ctx, &riverdriver.JobInsertFastManyParams{Jobs: jobs()})
		if err != nil || n != 20 {
			t.Fatalf("inserted %d: %v", n, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	river := riversqlite.New(s.db.DB)
	insert(river.UnwrapExecutor)
	insert(fastInsertSQLite{river}.UnwrapExecutor)

	rows, err := s.db.QueryContext(ctx, `SELECT json(args), created_at, kind, max_attempts, json(metadata), priority,
		queue, scheduled_at, state, json(tags), unique_key, unique_states, attempt, attempted_at, attempted_by,
		errors, finalized_at FROM river_job ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got [][]any
	for rows.Next() {
		row := make([]any, 17)
		ptrs := make([]any, len(row))
		for i := range row {
			ptrs[i] = &row[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		got = append(got, row)
	}
	if len(got) != 40 {
		t.Fatalf("%d rows", len(got))
	}
	// The JSON columns are compared as values: River's statement has Go
	// escape the args' & < > (as \u0026...), which read back the same.
	// A job with no ScheduledAt is scheduled when it was inserted.
	for _, row := range got {
		for _, c := range []int{0, 4, 9} {
			var v any
			if err := json.Unmarshal([]byte(row[c].(string)), &v); err != nil {
				t.Fatal(err)
			}
			row[c] = v
		}
		if row[8] == "available" {
			at, ok := row[7].(time.Time)
			if !ok || time.Since(at).Abs() > time.Minute {
				t.Errorf("scheduled at %v", row[7])
			}
			row[7] = nil
		}
	}
	for i := range 20 {
		if !reflect.DeepEqual(got[i], got[20+i]) {
			a, _ := json.Marshal(got[i])
			b, _ := json.Marshal(got[20+i])
			t.Errorf("job %d:\nriver: %s\nfast:  %s", i, a, b)
		}
	}
}
