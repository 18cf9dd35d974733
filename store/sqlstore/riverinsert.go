package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"time"

	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riversqlite"
)

// fastInsertSQLite is River's SQLite driver with one change: the jobs a
// transaction inserts without reading them back (InsertManyFastTx, the way
// jobs.EnqueueMany inserts an HL7 feed's tasks) are inserted with bound
// values, not through River's statement, which passes the jobs as one JSON
// array and reads it with json_each: that statement renders each job's JSON
// again for each of its twelve json_extract calls, and was 45% of the CPU of
// keeping HL7 messages. The rows are the same (the columns' values are
// converted by the same SQLite functions); a batch with a unique job, or in
// a schema of its own, takes River's statement, whose upsert this does not
// repeat.
type fastInsertSQLite struct {
	*riversqlite.Driver
}

func (d fastInsertSQLite) UnwrapExecutor(tx *sql.Tx) riverdriver.ExecutorTx {
	return fastInsertExecutor{ExecutorTx: d.Driver.UnwrapExecutor(tx), tx: tx}
}

type fastInsertExecutor struct {
	riverdriver.ExecutorTx
	tx *sql.Tx
}

// fastInsertRows is how many jobs one INSERT statement carries at most:
// the statements of 1 to fastInsertRows rows stay prepared in the
// connection's cache (stmtcache.go).
const fastInsertRows = 16

// fastInsertSQL is the INSERT statement of n jobs, at index n.
var fastInsertSQL = func() (out [fastInsertRows + 1]string) {
	const row = `(jsonb(?), coalesce(?, datetime('now', 'subsec')), ?, ?, jsonb(?), ?, ?,
	coalesce(?, datetime('now', 'subsec')), ?, jsonb(?))`
	for n := 1; n <= fastInsertRows; n++ {
		out[n] = `INSERT INTO river_job(args, created_at, kind, max_attempts, metadata, priority, queue,
	scheduled_at, state, tags) VALUES ` + strings.Repeat(row+", ", n-1) + row
	}
	return out
}()

func (e fastInsertExecutor) JobInsertFastManyNoReturning(ctx context.Context, params *riverdriver.JobInsertFastManyParams) (int, error) {
	if params.Schema != "" {
		return e.ExecutorTx.JobInsertFastManyNoReturning(ctx, params)
	}
	for _, j := range params.Jobs {
		if len(j.UniqueKey) > 0 || j.ID != nil {
			return e.ExecutorTx.JobInsertFastManyNoReturning(ctx, params)
		}
	}
	inserted := 0
	for jobs := params.Jobs; len(jobs) > 0; {
		n := min(len(jobs), fastInsertRows)
		values := make([]any, 0, 10*n)
		for _, j := range jobs[:n] {
			metadata := j.Metadata
			if len(metadata) == 0 {
				metadata = []byte("{}")
			}
			var tags any
			if j.Tags != nil {
				b, err := json.Marshal(j.Tags)
				if err != nil {
					return inserted, err
				}
				tags = string(b)
			}
			values = append(values, string(j.EncodedArgs), riverTime(j.CreatedAt), j.Kind, int64(j.MaxAttempts),
				string(metadata), int64(j.Priority), j.Queue, riverTime(j.ScheduledAt), string(j.State), tags)
		}
		res, err := e.tx.ExecContext(ctx, fastInsertSQL[n], values...)
		if err != nil {
			return inserted, err
		}
		rows, err := res.RowsAffected()
		if err != nil {
			return inserted, err
		}
		inserted += int(rows)
		jobs = jobs[n:]
	}
	return inserted, nil
}

// riverTime is a time as River's SQLite driver writes it (its timeString):
// SQLite compares times as text, so the format must be exactly this one.
func riverTime(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UTC().Round(time.Millisecond).Format("2006-01-02 15:04:05.000")
}
