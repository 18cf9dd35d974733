package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// newID returns a time-ordered UUID (version 7) for ids and version ids:
// consecutive inserts then land beside each other in every index instead of
// on random pages, which keeps write-heavy batches (execution audit events)
// to few dirty pages per commit, on both databases.
func newID() string { return uuid.Must(uuid.NewV7()).String() }

type row struct {
	ID           string `db:"id"`
	ResourceType string `db:"resource_type"`
	ProjectID    string `db:"project_id"`
	VersionID    string `db:"version_id"`
	LastUpdated  int64  `db:"last_updated"`
	Deleted      bool   `db:"deleted"`
	Content      string `db:"content"`
}

const rowColumns = `id, resource_type, project_id, version_id, last_updated, deleted, content`

// readRowSQL reads the current row of a resource.
const readRowSQL = `SELECT ` + rowColumns + ` FROM resources WHERE id = ? AND resource_type = ?`

func (r *row) record() store.Record {
	rec := store.Record{
		ResourceType: r.ResourceType,
		ID:           r.ID,
		VersionID:    r.VersionID,
		LastUpdated:  time.UnixMicro(r.LastUpdated).UTC(),
		Project:      r.ProjectID,
		Deleted:      r.Deleted,
	}
	if !r.Deleted {
		rec.JSON = []byte(r.Content)
	}
	return rec
}

// Create implements store.Store.
func (s *Store) Create(ctx context.Context, res fhir.Resource, w store.Write) (*store.Record, error) {
	if w.Project == "" {
		return nil, fmt.Errorf("sqlstore: create %s without a project", res.Type())
	}
	id := w.ID
	if id == "" {
		id = newID()
	} else if !fhir.ValidID(id) {
		return nil, fhir.Invalid("Invalid id", "id")
	}
	var out *store.Record
	err := s.inTx(ctx, func(tx *Store) error {
		if w.CheckReferences {
			if err := tx.checkReferences(ctx, res, w.Project); err != nil {
				return err
			}
		}
		rec, values, err := tx.write(ctx, res, id, w.Project, w.Author, true)
		out = rec
		if err == nil {
			tx.wrote(store.Written{Interaction: "create", Record: *rec, Resource: res, Values: values})
		}
		return err
	})
	return out, err
}

// wrote records a write of the transaction for the write hook.
func (s *Store) wrote(w store.Written) {
	if s.written != nil {
		*s.written = append(*s.written, w)
	}
}

// write stores a new version of res (which it modifies: id and meta) and
// rebuilds its index rows, whose values it answers.
func (s *Store) write(ctx context.Context, res fhir.Resource, id, project string, author fhir.Reference, isNew bool) (*store.Record, []fhir.IndexValue, error) {
	now := s.now().UTC().Truncate(time.Microsecond)
	res["id"] = id
	meta := fhir.Meta{VersionID: newID(), LastUpdated: now, Project: project, Author: author}
	res.SetMeta(meta)
	body, err := res.Marshal()
	if err != nil {
		return nil, nil, err
	}
	r := row{ID: id, ResourceType: res.Type(), ProjectID: project, VersionID: meta.VersionID, LastUpdated: now.UnixMicro(), Content: string(body)}
	if isNew {
		_, err = s.q.ExecContext(ctx, s.rebind(`INSERT INTO resources (`+rowColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`),
			r.ID, r.ResourceType, r.ProjectID, r.VersionID, r.LastUpdated, false, r.Content)
		if isUniqueViolation(err) {
			return nil, nil, fhir.Errorf(fhir.EConflict, "Resource %s/%s already exists", r.ResourceType, r.ID)
		}
	} else {
		if err = s.archiveCurrent(ctx, res.Type(), id, project); err != nil {
			return nil, nil, err
		}
		_, err = s.q.ExecContext(ctx, s.rebind(`UPDATE resources SET version_id = ?, last_updated = ?, deleted = ?, content = ? WHERE id = ?`),
			r.VersionID, r.LastUpdated, false, r.Content, r.ID)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("write %s/%s: %w", r.ResourceType, r.ID, err)
	}
	values, err := s.reindex(ctx, res, id, project, r.LastUpdated, isNew)
	if err != nil {
		return nil, nil, err
	}
	rec := r.record()
	return &rec, values, nil
}

// archiveCurrent copies the current version of a resource into history
// before it is replaced. The current version lives only in resources, so a
// create writes its JSON once; history holds the versions since superseded,
// and reads of history take the union of both tables (historyRowsSQL).
func (s *Store) archiveCurrent(ctx context.Context, resourceType, id, project string) error {
	if s.touched != nil { // always, in a transaction; the cache and the change feed hear of it at commit
		*s.touched = append(*s.touched, store.Change{ResourceType: resourceType, ID: id, Project: project})
	}
	_, err := s.q.ExecContext(ctx, s.rebind(`INSERT INTO resource_history (`+rowColumns+`) SELECT `+rowColumns+` FROM resources WHERE id = ?`), id)
	if err != nil {
		return fmt.Errorf("history of %s: %w", id, err)
	}
	return nil
}

// historyRowsSQL selects every version of one resource: the superseded
// ones and the current one. Its arguments are (id, type) twice.
const historyRowsSQL = `SELECT ` + rowColumns + ` FROM resource_history WHERE id = ? AND resource_type = ?
	UNION ALL SELECT ` + rowColumns + ` FROM resources WHERE id = ? AND resource_type = ?`

var indexTables = []string{"search_token", "search_string", "search_date", "search_number"}

func (s *Store) clearIndex(ctx context.Context, id string) error {
	for _, t := range indexTables {
		if _, err := s.q.ExecContext(ctx, s.rebind(`DELETE FROM `+t+` WHERE resource_id = ?`), id); err != nil {
			return fmt.Errorf("clear index: %w", err)
		}
	}
	return nil
}

// reindex replaces the index rows of a resource with those fhir.Extract gives.
// A new resource has no rows yet (its id was just inserted), so nothing is cleared.
// The counts (counts.go) change with it: a new resource is one more live
// one; the values of its Counted parameters move from the old to the new.
func (s *Store) reindex(ctx context.Context, res fhir.Resource, id, project string, lastUpdated int64, isNew bool) ([]fhir.IndexValue, error) {
	d := s.counts // always set: writes run in a transaction
	if isNew {
		d.addLive(res.Type(), project, 1)
	} else {
		old, err := s.countedValues(ctx, res.Type(), id)
		if err != nil {
			return nil, err
		}
		for _, k := range old {
			d.addValue(k, -1)
		}
		if err := s.clearIndex(ctx, id); err != nil {
			return nil, err
		}
	}
	var idx indexRows
	values := idx.add(res, id, project, lastUpdated)
	for _, k := range idx.counted {
		d.addValue(k, 1)
	}
	return values, idx.insert(ctx, s)
}

// indexRows accumulates the search index rows of one or more resources, so
// that each index table is written with multi-row INSERTs. Every row carries
// the resource's last_updated (see migration 0004).
type indexRows struct {
	tokens, strs, dates, nums []any
	// counted are the values of Counted parameters among the tokens.
	counted []countKey
}

func (x *indexRows) add(res fhir.Resource, id, project string, lastUpdated int64) []fhir.IndexValue {
	typ := res.Type()
	counted := fhir.HasCountedParams(typ)
	values := fhir.Extract(res)
	for _, v := range values {
		switch v.Kind {
		case fhir.TokenIndex:
			x.tokens = append(x.tokens, id, typ, project, v.Code, v.System, v.Value, lastUpdated, v.Group)
			if counted && v.System != fhir.TextSystem {
				if p := fhir.LookupParam(typ, v.Code); p != nil && p.Counted {
					x.counted = append(x.counted, countKey{typ, project, v.Code, v.Value})
				}
			}
		case fhir.StringIndex:
			x.strs = append(x.strs, id, typ, project, v.Code, fhir.NormalizeString(v.Value), v.Value, lastUpdated, v.Group)
		case fhir.DateIndex:
			x.dates = append(x.dates, id, typ, project, v.Code, v.Lo.UnixMicro(), v.Hi.UnixMicro(), lastUpdated, v.Group)
		case fhir.NumberIndex:
			x.nums = append(x.nums, id, typ, project, v.Code, v.Num, v.NumHi, v.System, v.Value, lastUpdated, v.Group)
		}
	}
	return values
}

func (x *indexRows) insert(ctx context.Context, s *Store) error {
	if err := s.insertRows(ctx, "search_token", "resource_id, resource_type, project_id, code, system, value, last_updated, grp", 8, x.tokens); err != nil {
		return err
	}
	if err := s.insertRows(ctx, "search_string", "resource_id, resource_type, project_id, code, value_norm, value_exact, last_updated, grp", 8, x.strs); err != nil {
		return err
	}
	if err := s.insertRows(ctx, "search_date", "resource_id, resource_type, project_id, code, lo, hi, last_updated, grp", 8, x.dates); err != nil {
		return err
	}
	return s.insertRows(ctx, "search_number", "resource_id, resource_type, project_id, code, lo, hi, system, unit, last_updated, grp", 10, x.nums)
}

// insertChunks are the row counts of the multi-row INSERT statements
// insertRows uses, largest first. The statements are prepared once and
// reused: parsing a fresh statement for every batch was a seventh of the
// cost of writing a batch of AuditEvents. 256 rows of 10 columns stays far
// under both databases' bind-parameter limits (SQLite 32766, PostgreSQL
// 65535).
var insertChunks = []int{256, 64, 16, 4, 1}

// insertRows inserts rows of width columns from a flat argument list: as
// many of the largest prepared statements as fit, then smaller ones.
func (s *Store) insertRows(ctx context.Context, table, cols string, width int, args []any) error {
	tuple := "(" + strings.TrimSuffix(strings.Repeat("?, ", width), ", ") + ")"
	for _, n := range insertChunks {
		if len(args) < n*width {
			continue
		}
		q := s.rebind(`INSERT INTO ` + table + ` (` + cols + `) VALUES ` + strings.TrimSuffix(strings.Repeat(tuple+", ", n), ", "))
		st, done, err := s.stmt(ctx, q)
		if err != nil {
			return fmt.Errorf("insert into %s: %w", table, err)
		}
		for len(args) >= n*width {
			if _, err := st.ExecContext(ctx, args[:n*width]...); err != nil {
				done()
				if isUniqueViolation(err) {
					return fhir.Errorf(fhir.EConflict, "Resource already exists")
				}
				return fmt.Errorf("insert into %s: %w", table, err)
			}
			args = args[n*width:]
		}
		done()
	}
	return nil
}

// CreateMany implements store.Store: one multi-row INSERT per table for the
// whole batch instead of four statements per resource.
func (s *Store) CreateMany(ctx context.Context, list []fhir.Resource, w store.Write) error {
	if w.Project == "" {
		return fmt.Errorf("sqlstore: create without a project")
	}
	return s.inTx(ctx, func(tx *Store) error {
		now := tx.now().UTC().Truncate(time.Microsecond)
		var rows []any
		var idx indexRows
		for _, res := range list {
			if w.CheckReferences {
				if err := tx.checkReferences(ctx, res, w.Project); err != nil {
					return err
				}
			}
			id := res.ID()
			if id == "" {
				id = newID()
			}
			res["id"] = id
			meta := fhir.Meta{VersionID: newID(), LastUpdated: now, Project: w.Project, Author: w.Author}
			res.SetMeta(meta)
			body, err := res.Marshal()
			if err != nil {
				return err
			}
			rows = append(rows, id, res.Type(), w.Project, meta.VersionID, now.UnixMicro(), false, string(body))
			values := idx.add(res, id, w.Project, now.UnixMicro())
			r := row{ID: id, ResourceType: res.Type(), ProjectID: w.Project, VersionID: meta.VersionID, LastUpdated: now.UnixMicro(), Content: string(body)}
			rec := r.record()
			tx.wrote(store.Written{Interaction: "create", Record: rec, Resource: res, Values: values})
		}
		if err := tx.insertRows(ctx, "resources", rowColumns, 7, rows); err != nil {
			return err
		}
		if err := idx.insert(ctx, tx); err != nil {
			return err
		}
		for _, res := range list {
			tx.counts.addLive(res.Type(), w.Project, 1)
		}
		for _, k := range idx.counted {
			tx.counts.addValue(k, 1)
		}
		return nil
	})
}

// checkReferences enforces the project wall on writes: every relative
// reference must name a live resource of the same project. A reference into
// another project gets the same answer as one to nothing, so that the
// existence of another project's resource is not revealed.
func (s *Store) checkReferences(ctx context.Context, res fhir.Resource, project string) error {
	refs := res.References()
	if len(refs) == 0 {
		return nil
	}
	seen := map[string]bool{}
	for _, ref := range refs {
		if seen[ref] {
			continue
		}
		seen[ref] = true
		typ, id, _ := fhir.SplitReference(ref)
		var n int
		err := sqlx.GetContext(ctx, s.q, &n, s.rebind(`SELECT COUNT(*) FROM resources WHERE id = ? AND resource_type = ? AND project_id = ? AND NOT deleted`), id, typ, project)
		if err != nil {
			return err
		}
		if n == 0 {
			return fhir.Invalid("Invalid reference: "+ref+" (not found in this project)", ref)
		}
	}
	return nil
}

func (s *Store) getRow(ctx context.Context, scope store.Scope, resourceType, id string, lock bool) (*row, error) {
	return s.getRowFrom(ctx, scope, resourceType, id, lock, false)
}

// getRowFrom is getRow; hotOK lets a read outside a transaction answer
// from the hot cache (ReadCached).
func (s *Store) getRowFrom(ctx context.Context, scope store.Scope, resourceType, id string, lock, hotOK bool) (*row, error) {
	if !fhir.ValidID(id) {
		return nil, fhir.ErrNotFound
	}
	var r row
	var err error
	if s.tx == nil && !lock {
		if s.cache != nil {
			if c, ok := s.cache.get(id); ok && c.ResourceType == resourceType {
				if !scope.Allows(c.ProjectID) {
					return nil, fhir.ErrNotFound
				}
				return &c, nil
			}
		}
		var stamp uint64
		if s.cache != nil {
			stamp = s.cache.stamp(id)
		}
		hot := hotOK && s.hot != nil && store.CachedTypes[resourceType] && s.feed.running.Load()
		var gen uint64
		if hot {
			if c, ok := s.hot.get(resourceType, id); ok {
				if !scope.Allows(c.ProjectID) {
					return nil, fhir.ErrNotFound
				}
				return &c, nil
			}
			gen = s.hot.begin()
		}
		// The read every request makes runs as a statement prepared once,
		// scanned field by field (sqlx's reflective scan cost a third of it).
		var st *sql.Stmt
		if st, err = s.readStmt(ctx); err == nil {
			err = st.QueryRowContext(ctx, id, resourceType).Scan(&r.ID, &r.ResourceType, &r.ProjectID, &r.VersionID, &r.LastUpdated, &r.Deleted, &r.Content)
		}
		if err == nil && s.cache != nil {
			s.cache.put(r, stamp)
		}
		if err == nil && hot {
			s.hot.put(r, gen)
		}
	} else {
		q := readRowSQL
		if lock && s.dialect == Postgres {
			q += ` FOR UPDATE`
		}
		err = sqlx.GetContext(ctx, s.q, &r, s.rebind(q), id, resourceType)
	}
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !scope.Allows(r.ProjectID)) {
		return nil, fhir.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", resourceType, id, err)
	}
	return &r, nil
}

// Read implements store.Store.
func (s *Store) Read(ctx context.Context, scope store.Scope, resourceType, id string) (*store.Record, error) {
	start := time.Now()
	rec, err := s.readResource(ctx, scope, resourceType, id, false)
	s.observe(opRead, start, err)
	return rec, err
}

// ReadCached implements store.Store.
func (s *Store) ReadCached(ctx context.Context, scope store.Scope, resourceType, id string) (*store.Record, error) {
	start := time.Now()
	rec, err := s.readResource(ctx, scope, resourceType, id, true)
	s.observe(opRead, start, err)
	return rec, err
}

func (s *Store) readResource(ctx context.Context, scope store.Scope, resourceType, id string, hotOK bool) (*store.Record, error) {
	r, err := s.getRowFrom(ctx, scope, resourceType, id, false, hotOK)
	if err != nil {
		return nil, err
	}
	rec := r.record()
	if r.Deleted {
		return &rec, fhir.ErrGone
	}
	return &rec, nil
}

// ReadVersion implements store.Store.
func (s *Store) ReadVersion(ctx context.Context, scope store.Scope, resourceType, id, versionID string) (*store.Record, error) {
	start := time.Now()
	rec, err := s.readVersion(ctx, scope, resourceType, id, versionID)
	s.observe(opRead, start, err)
	return rec, err
}

func (s *Store) readVersion(ctx context.Context, scope store.Scope, resourceType, id, versionID string) (*store.Record, error) {
	if !fhir.ValidID(id) || !fhir.ValidID(versionID) {
		return nil, fhir.ErrNotFound
	}
	var r row
	err := sqlx.GetContext(ctx, s.q, &r, s.rebind(`SELECT `+rowColumns+` FROM (`+historyRowsSQL+`) v WHERE version_id = ?`),
		id, resourceType, id, resourceType, versionID)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !scope.Allows(r.ProjectID)) {
		return nil, fhir.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	rec := r.record()
	if r.Deleted {
		return &rec, fhir.ErrGone
	}
	return &rec, nil
}

// Update implements store.Store.
func (s *Store) Update(ctx context.Context, scope store.Scope, resourceType, id string, w store.Write, fn store.UpdateFunc) (*store.Record, error) {
	var out *store.Record
	err := s.inTx(ctx, func(tx *Store) error {
		r, err := tx.getRow(ctx, scope, resourceType, id, true)
		if err != nil {
			return err
		}
		if r.Deleted {
			return fhir.ErrGone
		}
		if w.IfMatch != "" && w.IfMatch != r.VersionID {
			return fhir.Errorf(fhir.EPrecondition, "Version mismatch: current version is %s", r.VersionID)
		}
		cur, err := fhir.ParseResource([]byte(r.Content))
		if err != nil {
			return fmt.Errorf("stored %s/%s does not parse: %w", resourceType, id, err)
		}
		next, err := fn(cur)
		if err != nil {
			return err
		}
		if next.Type() != resourceType {
			return fhir.Invalid("Incorrect resource type", "resourceType")
		}
		if w.CheckReferences {
			if err := tx.checkReferences(ctx, next, r.ProjectID); err != nil {
				return err
			}
		}
		var values []fhir.IndexValue
		out, values, err = tx.write(ctx, next, id, r.ProjectID, w.Author, false)
		if err == nil {
			tx.wrote(store.Written{Interaction: "update", Record: *out, Previous: []byte(r.Content), Resource: next, Values: values})
		}
		return err
	})
	return out, err
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, scope store.Scope, resourceType, id string, w store.Write) error {
	return s.inTx(ctx, func(tx *Store) error {
		r, err := tx.getRow(ctx, scope, resourceType, id, true)
		if err != nil {
			return err
		}
		if r.Deleted {
			return nil
		}
		if w.IfMatch != "" && w.IfMatch != r.VersionID {
			return fhir.Errorf(fhir.EPrecondition, "Version mismatch: current version is %s", r.VersionID)
		}
		now := tx.now().UTC().Truncate(time.Microsecond)
		if err := tx.archiveCurrent(ctx, resourceType, id, r.ProjectID); err != nil {
			return err
		}
		// The deletion is the current version: a row without content.
		version := newID()
		if _, err := tx.q.ExecContext(ctx, tx.rebind(`UPDATE resources SET version_id = ?, last_updated = ?, deleted = ?, content = ? WHERE id = ?`),
			version, now.UnixMicro(), true, "", id); err != nil {
			return err
		}
		tx.wrote(store.Written{Interaction: "delete", Record: store.Record{ResourceType: resourceType, ID: id, VersionID: version,
			LastUpdated: time.UnixMicro(now.UnixMicro()).UTC(), Project: r.ProjectID, Deleted: true}, Previous: []byte(r.Content)})
		tx.counts.addLive(resourceType, r.ProjectID, -1)
		old, err := tx.countedValues(ctx, resourceType, id)
		if err != nil {
			return err
		}
		for _, k := range old {
			tx.counts.addValue(k, -1)
		}
		return tx.clearIndex(ctx, id)
	})
}

// History implements store.Store.
func (s *Store) History(ctx context.Context, scope store.Scope, resourceType, id string, count, offset int) ([]store.Record, error) {
	start := time.Now()
	recs, err := s.history(ctx, scope, resourceType, id, count, offset)
	s.observe(opHistory, start, err)
	return recs, err
}

func (s *Store) history(ctx context.Context, scope store.Scope, resourceType, id string, count, offset int) ([]store.Record, error) {
	if _, err := s.getRow(ctx, scope, resourceType, id, false); err != nil {
		return nil, err
	}
	var rows []row
	err := sqlx.SelectContext(ctx, s.q, &rows, s.rebind(`SELECT `+rowColumns+` FROM (`+historyRowsSQL+`) v ORDER BY last_updated DESC, version_id DESC LIMIT ? OFFSET ?`),
		id, resourceType, id, resourceType, count, offset)
	if err != nil {
		return nil, err
	}
	out := make([]store.Record, len(rows))
	for i := range rows {
		out[i] = rows[i].record()
	}
	return out, nil
}

func isUniqueViolation(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "duplicate key") || strings.Contains(msg, "UNIQUE constraint failed")
}
