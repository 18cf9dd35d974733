package sqlstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// maxRune bounds a prefix range: every string starting with p sorts in
// [p, p+maxRune) under byte-wise ("C") collation.
const maxRune = "\U0010FFFF"

// query accumulates a WHERE clause and its arguments.
type query struct {
	where []string
	args  []any
}

func (q *query) add(cond string, args ...any) {
	q.where = append(q.where, cond)
	q.args = append(q.args, args...)
}

// Search implements store.Store. Every parameter is answered by the same few
// SQL shapes chosen by its type, so a new parameter needs no new SQL.
func (s *Store) Search(ctx context.Context, scope store.Scope, req *fhir.SearchRequest) (*store.SearchResult, error) {
	q := &query{}
	q.add(`r.resource_type = ?`, req.ResourceType)
	q.add(`NOT r.deleted`)
	projects := scopeClause(scope)
	if projects != nil {
		if len(projects) == 0 {
			return &store.SearchResult{}, nil
		}
		q.add(`r.project_id IN (`+placeholders(len(projects))+`)`, projects...)
	}
	for _, f := range req.Filters {
		if err := addFilter(q, req.ResourceType, f, projects); err != nil {
			return nil, err
		}
	}
	if len(req.AnyOf) > 0 {
		var ors []string
		var args []any
		for _, group := range req.AnyOf {
			g := &query{}
			for _, f := range group {
				if err := addFilter(g, req.ResourceType, f, projects); err != nil {
					return nil, err
				}
			}
			if len(g.where) == 0 { // a group without filters lets everything through
				ors = nil
				break
			}
			ors = append(ors, "("+strings.Join(g.where, " AND ")+")")
			args = append(args, g.args...)
		}
		if ors != nil {
			q.add("("+strings.Join(ors, " OR ")+")", args...)
		}
	}
	where := strings.Join(q.where, " AND ")
	res := &store.SearchResult{}
	if req.Total == "accurate" || req.Total == "estimate" {
		var n int
		if err := sqlx.GetContext(ctx, s.q, &n, s.rebind(`SELECT COUNT(*) FROM resources r WHERE `+where), q.args...); err != nil {
			return nil, fmt.Errorf("search count: %w", err)
		}
		res.Total = &n
	}
	if req.Count == 0 {
		return res, nil
	}
	order := "r.last_updated, r.id"
	if len(req.Sort) > 0 {
		var keys []string
		for _, k := range req.Sort {
			dir := ""
			if k.Descending {
				dir = " DESC"
			}
			keys = append(keys, "r."+k.Column+dir)
		}
		if req.Sort[len(req.Sort)-1].Column != "id" {
			keys = append(keys, "r.id")
		}
		order = strings.Join(keys, ", ")
	}
	sqlText := `SELECT ` + prefixed("r.", rowColumns) + ` FROM resources r WHERE ` + where + ` ORDER BY ` + order + ` LIMIT ? OFFSET ?`
	args := append(append([]any{}, q.args...), req.Count+1, req.Offset)
	var rows []row
	if err := sqlx.SelectContext(ctx, s.q, &rows, s.rebind(sqlText), args...); err != nil {
		return nil, fmt.Errorf("search: %w", err)
	}
	if len(rows) > req.Count {
		res.More = true
		rows = rows[:req.Count]
	}
	res.Records = make([]store.Record, len(rows))
	for i := range rows {
		res.Records[i] = rows[i].record()
	}
	return res, nil
}

// scopeClause returns nil for every project, else the allowed project ids.
func scopeClause(scope store.Scope) []any {
	if scope.All {
		return nil
	}
	out := make([]any, len(scope.Projects))
	for i, p := range scope.Projects {
		out[i] = p
	}
	return out
}

func addFilter(q *query, resourceType string, f fhir.Filter, projects []any) error {
	p := f.Param
	if p.Column != "" {
		return addColumnFilter(q, f)
	}
	table := map[fhir.IndexKind]string{fhir.TokenIndex: "search_token", fhir.StringIndex: "search_string", fhir.DateIndex: "search_date"}[fhir.KindOf(p.Type)]
	sub := `SELECT i.resource_id FROM ` + table + ` i WHERE i.resource_type = ? AND i.code = ?`
	subArgs := []any{resourceType, p.Code}
	if projects != nil {
		sub += ` AND i.project_id IN (` + placeholders(len(projects)) + `)`
		subArgs = append(subArgs, projects...)
	}
	if f.Modifier == "missing" {
		// :missing=true matches resources with no value at all.
		if f.Values[0].Raw == "true" {
			q.add(`r.id NOT IN (`+sub+`)`, subArgs...)
		} else {
			q.add(`r.id IN (`+sub+`)`, subArgs...)
		}
		return nil
	}
	var ors []string
	var orArgs []any
	for _, v := range f.Values {
		cond, args := valueCondition(p, f.Modifier, v)
		ors = append(ors, cond)
		orArgs = append(orArgs, args...)
	}
	sub += ` AND (` + strings.Join(ors, " OR ") + `)`
	subArgs = append(subArgs, orArgs...)
	if f.Modifier == "not" {
		// A correlated NOT EXISTS probes the index per candidate row; NOT IN
		// would materialise every matching value of the project first (all
		// ClientApplication and Bot memberships for "profile-type:not=…").
		q.add(`NOT EXISTS (`+sub+` AND i.resource_id = r.id)`, subArgs...)
	} else {
		q.add(`r.id IN (`+sub+`)`, subArgs...)
	}
	return nil
}

func valueCondition(p *fhir.SearchParam, modifier string, v fhir.FilterValue) (string, []any) {
	switch p.Type {
	case fhir.StringParam:
		switch modifier {
		case "exact":
			return `i.value_exact = ?`, []any{v.Code}
		case "contains":
			return `i.value_norm LIKE ? ESCAPE '\'`, []any{"%" + escapeLike(fhir.NormalizeString(v.Code)) + "%"}
		}
		n := fhir.NormalizeString(v.Code)
		return `(i.value_norm >= ? AND i.value_norm < ?)`, []any{n, n + maxRune}
	case fhir.DateParam:
		return dateCondition("i.lo", "i.hi", v)
	case fhir.TokenParam, fhir.BooleanParam:
		if v.HasSystem {
			if v.Code == "" {
				return `i.system = ?`, []any{v.System}
			}
			return `(i.system = ? AND i.value = ?)`, []any{v.System, v.Code}
		}
		return `i.value = ?`, []any{v.Code}
	default: // reference
		return `i.value = ?`, []any{v.Code}
	}
}

// dateCondition compares a stored range [lo, hi) with the value's range.
func dateCondition(lo, hi string, v fhir.FilterValue) (string, []any) {
	qlo, qhi := v.Lo.UnixMicro(), v.Hi.UnixMicro()
	switch v.Prefix {
	case "gt":
		return hi + ` > ?`, []any{qhi}
	case "lt":
		return lo + ` < ?`, []any{qlo}
	case "ge":
		return hi + ` > ?`, []any{qlo}
	case "le":
		return lo + ` < ?`, []any{qhi}
	case "ne":
		return `NOT (` + lo + ` >= ? AND ` + hi + ` <= ?)`, []any{qlo, qhi}
	default: // eq
		return `(` + lo + ` >= ? AND ` + hi + ` <= ?)`, []any{qlo, qhi}
	}
}

func addColumnFilter(q *query, f fhir.Filter) error {
	var ors []string
	var args []any
	for _, v := range f.Values {
		switch f.Param.Column {
		case "last_updated":
			// A stored instant t is the range [t, t+1µs).
			cond, a := dateCondition("r.last_updated", "(r.last_updated + 1)", v)
			ors = append(ors, cond)
			args = append(args, a...)
		default: // id, project_id
			ors = append(ors, `r.`+f.Param.Column+` = ?`)
			args = append(args, v.Code)
		}
	}
	cond := `(` + strings.Join(ors, " OR ") + `)`
	if f.Modifier == "not" {
		cond = `NOT ` + cond
	}
	q.add(cond, args...)
	return nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func prefixed(prefix, cols string) string {
	parts := strings.Split(cols, ", ")
	for i := range parts {
		parts[i] = prefix + parts[i]
	}
	return strings.Join(parts, ", ")
}

func escapeLike(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}
