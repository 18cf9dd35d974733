package sqlstore

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// maxRune bounds a prefix range: every string starting with p sorts in
// [p, p+maxRune) under byte-wise ("C") collation.
const maxRune = "\U0010FFFF"

// rareLimit is where a value stops being rare: a search whose most
// selective filter matches fewer index rows than this collects those rows
// and sorts them; otherwise it walks the type's resources in order and
// tests each (see Search).
const rareLimit = 2000

// cond is a SQL boolean expression and its arguments.
type cond struct {
	sql  string
	args []any
}

func and(cs []cond) cond {
	var parts []string
	var args []any
	for _, c := range cs {
		parts = append(parts, c.sql)
		args = append(args, c.args...)
	}
	if len(parts) == 0 {
		return cond{sql: "1 = 1"}
	}
	return cond{sql: strings.Join(parts, " AND "), args: args}
}

// Search implements store.Store. Every parameter is answered by the same few
// SQL shapes chosen by its type, so a new parameter needs no new SQL. A
// search runs in one of three shapes, chosen here rather than left to the
// planners (SQLite's has no statistics of values):
//
//   - stream: one token value in one project, sorted by _lastUpdated: the
//     value's index rows are already in that order, so the page is the
//     first rows that pass the other conditions (profile-type=Patient reads
//     21 index rows whatever the number of Patient members);
//   - collect: the filter with the fewest index rows, when fewer than
//     rareLimit (counted with a bounded index-only query), gives the
//     candidates, which are then tested and sorted;
//   - walk: the type's live resources of the project in sort order, each
//     tested by the conditions (profile-type:not=ClientApplication,Bot
//     tests about two rows per result).
func (s *Store) Search(ctx context.Context, scope store.Scope, req *fhir.SearchRequest) (*store.SearchResult, error) {
	start := time.Now()
	res, err := s.search(ctx, scope, req)
	s.observe(opSearch, start, err)
	return res, err
}

func (s *Store) search(ctx context.Context, scope store.Scope, req *fhir.SearchRequest) (*store.SearchResult, error) {
	if len(req.Has) > 0 {
		// A reverse chain is resolved by the FHIR service, as its caller
		// (fhirservice.Search): the store would otherwise ignore it.
		return nil, fhir.Invalid("_has is answered by the FHIR service, not the store", "_has")
	}
	projects := scopeClause(scope)
	if projects != nil && len(projects) == 0 {
		return &store.SearchResult{}, nil
	}
	b := &builder{projects: projects, typ: req.ResourceType}
	conds := b.conds(req)
	res := &store.SearchResult{}
	if req.Total == "accurate" || req.Total == "estimate" {
		n, err := s.count(ctx, b, req, conds)
		if err != nil {
			return nil, err
		}
		res.Total = &n
	}
	if req.Count == 0 {
		return res, nil
	}
	sqlText, args, err := s.pageQuery(ctx, b, req, conds)
	if err != nil {
		return nil, err
	}
	var rows []row
	if sqlText == "" {
		rows, err = s.sortWalk(ctx, b, req, conds)
	} else {
		args = append(args, req.Count+1, req.Offset)
		err = sqlx.SelectContext(ctx, s.q, &rows, s.searchSQL(sqlText+` LIMIT ? OFFSET ?`), args...)
	}
	if err != nil {
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

// conds are the conditions of every filter of req on the resource row r.
func (b *builder) conds(req *fhir.SearchRequest) []cond {
	var conds []cond
	for _, f := range req.Filters {
		conds = append(conds, b.filter(f, "r"))
	}
	for _, e := range req.Expr {
		conds = append(conds, b.expr(e, "r"))
	}
	if c, ok := b.anyOf(req.AnyOf, "r"); ok {
		conds = append(conds, c)
	}
	return conds
}

// pageQuery chooses the shape of the search (see Search) and writes it,
// without its LIMIT and OFFSET; "" means the sort walk (sortWalk).
func (s *Store) pageQuery(ctx context.Context, b *builder, req *fhir.SearchRequest, conds []cond) (string, []any, error) {
	cols := prefixed("r.", rowColumns)
	byTime := len(req.Sort) == 0 || len(req.Sort) == 1 && req.Sort[0].Column == "last_updated"
	desc := len(req.Sort) == 1 && req.Sort[0].Descending
	drivers := driverFilters(req)
	pick := -1
	if byTime && len(drivers) == 1 && streams(req.Filters[drivers[0]]) && len(b.projects) == 1 {
		pick = drivers[0]
	} else if len(drivers) > 0 {
		// Each count is bounded by the fewest rows found so far: once
		// family:exact=… has 10 rows, gender=female reads at most 10.
		best, bestN := -1, rareLimit
		for _, i := range drivers {
			if bestN == 0 {
				break
			}
			n, err := s.boundedCount(ctx, b, req.Filters[i], bestN)
			if err != nil {
				return "", nil, err
			}
			if n < bestN {
				best, bestN = i, n
			}
		}
		switch {
		case best >= 0:
			// collect: the rare filter's rows, the others tested on them.
			f := req.Filters[best]
			src := b.indexRows(f)
			others := and(append(append([]cond{}, conds[:best]...), conds[best+1:]...))
			order, oargs := b.order(req)
			return `SELECT ` + cols + ` FROM resources r WHERE r.id IN (SELECT i.resource_id FROM ` + src.sql + `) AND ` + others.sql + ` ORDER BY ` + order,
				concat(src.args, others.args, oargs), nil
		case byTime && len(b.projects) == 1:
			for _, i := range drivers {
				if streams(req.Filters[i]) {
					pick = i
					break
				}
			}
		}
	}
	if pick >= 0 {
		f := req.Filters[pick]
		v := f.Values[0]
		others := and(append(append([]cond{}, conds[:pick]...), conds[pick+1:]...))
		dir := ""
		if desc {
			dir = " DESC"
		}
		sqlText := `SELECT ` + cols + ` FROM search_token i JOIN resources r ON r.id = i.resource_id
			WHERE i.resource_type = ? AND i.code = ? AND i.value = ? AND i.project_id = ?`
		args := []any{req.ResourceType, f.Param.Code, v.Code, b.projects[0]}
		if sys, ok := tokenSystem(f, v); ok {
			sqlText += ` AND i.system = ?`
			args = append(args, sys)
		} else if !f.Param.Single {
			// (A single-valued parameter has one row per resource.)
			// A value under two systems is two rows of one resource: the
			// resource is listed once, by the row of the first system.
			sqlText += ` AND NOT EXISTS (SELECT 1 FROM search_token j WHERE j.resource_id = i.resource_id AND j.code = i.code AND j.value = i.value AND j.system < i.system)`
		}
		sqlText += ` AND ` + others.sql + ` ORDER BY i.last_updated` + dir + `, i.resource_id` + dir
		return sqlText, append(args, others.args...), nil
	}
	// walk: by the sort parameter's index when there is one
	if len(req.Sort) == 1 && req.Sort[0].Param != nil {
		return "", nil, nil
	}
	if byTime && s.dialect == Postgres {
		// The walk in _lastUpdated order stops at the page's last row: the
		// filters are tested on each resource as it comes (a driver, if any,
		// matches too many rows to collect them). PostgreSQL would turn an
		// EXISTS into a join over every matching index row, then sort,
		// whenever its statistics (none right after a bulk load) promise few
		// matches: 107 ms for a super admin's profile-type=Patient over
		// 100,000 memberships instead of 1 (docs/decisions.md 43).
		pb := *b
		pb.perRow = true
		conds = pb.conds(req)
	}
	base := b.base("r")
	all := and(append([]cond{base}, conds...))
	order, oargs := b.order(req)
	return `SELECT ` + cols + ` FROM resources r WHERE ` + all.sql + ` ORDER BY ` + order, concat(all.args, oargs), nil
}

// sortKeys are, for each index kind, the column a parameter sorts by
// ascending and descending, and the column that breaks ties between two
// rows of one resource (as order's MIN and MAX do).
var sortKeys = map[fhir.IndexKind][4]string{
	// asc key, asc tie, desc key, desc tie
	fhir.TokenIndex:  {"value", "system", "value", "system"},
	fhir.StringIndex: {"value_norm", "value_exact", "value_norm", "value_exact"},
	fhir.DateIndex:   {"lo", "hi", "hi", "lo"},
	fhir.NumberIndex: {"lo", "hi", "hi", "lo"},
}

// sortWalk pages a search sorted by one parameter that no rare filter
// narrows: it walks the parameter's index in sort order, one row per
// resource (its least value ascending, its greatest descending), testing
// the conditions on each, and then the resources without a value, which
// come last. Sorting every candidate by a correlated key instead took a
// second for 50,000 of them.
func (s *Store) sortWalk(ctx context.Context, b *builder, req *fhir.SearchRequest, conds []cond) ([]row, error) {
	rule := req.Sort[0]
	kind := fhir.KindOf(rule.Param.Type)
	table := indexTable[kind]
	keys := sortKeys[kind]
	key, tie, cmp, dir := keys[0], keys[1], "<", ""
	if rule.Descending {
		key, tie, cmp, dir = keys[2], keys[3], ">", " DESC"
	}
	others := and(conds)
	cols := prefixed("r.", rowColumns)
	valued := `FROM ` + table + ` s JOIN resources r ON r.id = s.resource_id
		WHERE s.resource_type = ? AND s.code = ?`
	args := []any{b.typ, rule.Param.Code}
	if b.projects != nil {
		valued += ` AND s.project_id IN (` + placeholders(len(b.projects)) + `)`
		args = append(args, b.projects...)
	}
	if !rule.Param.Single {
		// A single-valued parameter has one row per resource: nothing to
		// keep out, and no probe per row read.
		valued += ` AND NOT EXISTS (SELECT 1 FROM ` + table + ` j WHERE j.resource_id = s.resource_id AND j.code = s.code
			AND (j.` + key + ` ` + cmp + ` s.` + key + ` OR j.` + key + ` = s.` + key + ` AND j.` + tie + ` ` + cmp + ` s.` + tie + `))`
	}
	valued += ` AND ` + others.sql
	args = append(args, others.args...)
	var rows []row
	want := req.Count + 1
	if err := sqlx.SelectContext(ctx, s.q, &rows, s.searchSQL(`SELECT `+cols+` `+valued+` ORDER BY s.`+key+dir+`, s.resource_id`+dir+` LIMIT ? OFFSET ?`),
		append(append([]any{}, args...), want, req.Offset)...); err != nil {
		return nil, err
	}
	if len(rows) == want {
		return rows, nil
	}
	// The page reaches past the resources with a value: how many there
	// are is known from this page, unless it started past them all.
	valuedCount := req.Offset + len(rows)
	if len(rows) == 0 && req.Offset > 0 {
		if err := sqlx.GetContext(ctx, s.q, &valuedCount, s.searchSQL(`SELECT COUNT(*) `+valued), args...); err != nil {
			return nil, err
		}
	}
	missing := and([]cond{b.base("r"), others})
	var more []row
	if err := sqlx.SelectContext(ctx, s.q, &more, s.searchSQL(`SELECT `+cols+` FROM resources r WHERE `+missing.sql+`
		AND NOT EXISTS (SELECT 1 FROM `+table+` j WHERE j.resource_id = r.id AND j.code = ?) ORDER BY r.id`+dir+` LIMIT ? OFFSET ?`),
		concat(missing.args, []any{rule.Param.Code, want - len(rows), max(0, req.Offset-valuedCount)})...); err != nil {
		return nil, err
	}
	return append(rows, more...), nil
}

// driverFilters are the filters whose index rows can give a search its
// candidates: positive comparisons on indexed values.
func driverFilters(req *fhir.SearchRequest) []int {
	var out []int
	for i, f := range req.Filters {
		if f.Param.Column != "" || f.Chain != nil {
			continue
		}
		switch f.Modifier {
		case "", "exact", "iexact", "below":
		default:
			continue
		}
		if f.Param.Type == fhir.DateParam || f.Param.Type == fhir.NumberParam || f.Param.Type == fhir.QuantityParam {
			ok := true
			for _, v := range f.Values {
				ok = ok && v.Prefix != "ne"
			}
			if !ok {
				continue
			}
		}
		out = append(out, i)
	}
	return out
}

// streams reports whether a filter's index rows come in _lastUpdated order:
// one token value.
func streams(f fhir.Filter) bool {
	if len(f.Values) != 1 || fhir.KindOf(f.Param.Type) != fhir.TokenIndex || f.Modifier != "" {
		return false
	}
	v := f.Values[0]
	if f.TargetType != "" && v.HasSystem && v.System != f.TargetType {
		return false // matches nothing; valueCond says so
	}
	return v.Code != ""
}

// tokenSystem is the system a streamed token value compares, if any.
func tokenSystem(f fhir.Filter, v fhir.FilterValue) (string, bool) {
	if f.Param.Type == fhir.ReferenceParam && f.TargetType != "" {
		return f.TargetType, true
	}
	if f.Param.Type == fhir.URIParam {
		return "", true
	}
	return v.System, v.HasSystem
}

// boundedCount counts a filter's index rows up to limit: a Counted
// parameter's from value_counts (its rows are its resources), any other's
// by an index-only COUNT over a LIMIT.
func (s *Store) boundedCount(ctx context.Context, b *builder, f fhir.Filter, limit int) (int, error) {
	if vals, ok := countedValues(f); ok {
		n, err := s.valueCount(ctx, b, f, vals)
		return min(n, limit), err
	}
	src := b.indexRows(f)
	var n int
	err := sqlx.GetContext(ctx, s.q, &n, s.searchSQL(`SELECT COUNT(*) FROM (SELECT 1 FROM `+src.sql+` LIMIT ?) t`), append(src.args, limit)...)
	if err != nil {
		return 0, fmt.Errorf("search estimate: %w", err)
	}
	return n, nil
}

// valueCount is the number of live resources with one of vals for a
// Counted parameter, kept as they are written (value_counts, migration
// 0006).
func (s *Store) valueCount(ctx context.Context, b *builder, f fhir.Filter, vals []any) (int, error) {
	q := `SELECT COALESCE(SUM(c.n), 0) FROM value_counts c WHERE c.resource_type = ? AND c.code = ? AND c.value IN (` + placeholders(len(vals)) + `)`
	args := append([]any{b.typ, f.Param.Code}, vals...)
	if b.projects != nil {
		q += ` AND c.project_id IN (` + placeholders(len(b.projects)) + `)`
		args = append(args, b.projects...)
	}
	var n int
	if err := sqlx.GetContext(ctx, s.q, &n, s.searchSQL(q), args...); err != nil {
		return 0, fmt.Errorf("search count: %w", err)
	}
	return n, nil
}

// count answers _total. One filter is counted on its index alone (its rows
// exist only for live resources); its negation as the live resources less
// that; anything else with the conditions.
func (s *Store) count(ctx context.Context, b *builder, req *fhir.SearchRequest, conds []cond) (int, error) {
	get := func(q string, args []any) (int, error) {
		var n int
		if err := sqlx.GetContext(ctx, s.q, &n, s.searchSQL(q), args...); err != nil {
			return 0, fmt.Errorf("search count: %w", err)
		}
		return n, nil
	}
	base := b.base("r")
	live := func() (int, error) {
		// The live resources of the type are counted as they are written
		// (resource_counts, migration 0006).
		q, args := `SELECT COALESCE(SUM(c.live), 0) FROM resource_counts c WHERE c.resource_type = ?`, []any{b.typ}
		if b.projects != nil {
			q += ` AND c.project_id IN (` + placeholders(len(b.projects)) + `)`
			args = append(args, b.projects...)
		}
		return get(q, args)
	}
	if len(req.Expr) == 0 && len(req.AnyOf) == 0 {
		switch {
		case len(req.Filters) == 0:
			return live()
		case len(req.Filters) == 1 && req.Filters[0].Param.Column == "" && req.Filters[0].Chain == nil:
			f := req.Filters[0]
			negated := false
			switch {
			case f.Modifier == "not":
				f.Modifier, negated = "", true
			case f.Modifier == "missing":
				negated = f.Values[0].Raw == "true"
			}
			if vals, ok := countedValues(f); ok {
				n, err := s.valueCount(ctx, b, f, vals)
				if err != nil || !negated {
					return n, err
				}
				all, err := live()
				return all - n, err
			}
			src := b.indexRows(f)
			// A resource has one row per (code, system, value): rows are
			// resources when the parameter has one value per resource, or
			// the filter one value with its system.
			what := `COUNT(DISTINCT i.resource_id)`
			if _, sys := tokenSystem(f, f.Values[0]); f.Param.Single || len(f.Values) == 1 && sys && fhir.KindOf(f.Param.Type) == fhir.TokenIndex && f.Modifier == "" {
				what = `COUNT(*)`
			}
			n, err := get(`SELECT `+what+` FROM `+src.sql, src.args)
			if err != nil || !negated {
				return n, err
			}
			all, err := live()
			return all - n, err
		}
	}
	all := and(append([]cond{base}, conds...))
	return get(`SELECT COUNT(*) FROM resources r WHERE `+all.sql, all.args)
}

// countedValues are the values whose resources value_counts counts, when
// the filter is one comparison of a Counted parameter.
func countedValues(f fhir.Filter) ([]any, bool) {
	if !f.Param.Counted || f.Modifier != "" || f.TargetType != "" {
		return nil, false
	}
	var vals []any
	for _, v := range f.Values {
		if v.HasSystem {
			return nil, false
		}
		vals = append(vals, v.Code)
	}
	return vals, len(vals) > 0
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

// builder writes the conditions of one search.
type builder struct {
	projects []any // nil: every project
	typ      string
	// perRow has the filters' index probes tested per resource row
	// (PostgreSQL: an EXISTS whose subquery has an OFFSET is not turned
	// into a join, see pageQuery's walk).
	perRow bool
}

// exists is EXISTS (or NOT EXISTS) of the probe.
func (b *builder) exists(not bool, probe string) string {
	if b.perRow {
		probe += ` OFFSET 0`
	}
	if not {
		return `NOT EXISTS (` + probe + `)`
	}
	return `EXISTS (` + probe + `)`
}

// base selects the live resources of the type within the scope.
func (b *builder) base(a string) cond {
	c := cond{sql: a + `.resource_type = ? AND ` + a + `.deleted = ?`, args: []any{b.typ, false}}
	if b.projects != nil {
		c.sql += ` AND ` + a + `.project_id IN (` + placeholders(len(b.projects)) + `)`
		c.args = append(c.args, b.projects...)
	}
	return c
}

var indexTable = map[fhir.IndexKind]string{
	fhir.TokenIndex: "search_token", fhir.StringIndex: "search_string", fhir.DateIndex: "search_date", fhir.NumberIndex: "search_number",
}

// indexRows is "table i WHERE ..." selecting the index rows of the
// resource type that match a positive filter, within the scope.
func (b *builder) indexRows(f fhir.Filter) cond {
	if f.Param.Type == fhir.CompositeParam {
		j := compositeJoin(f)
		c := cond{sql: j.sql + ` WHERE i.resource_type = ? AND ` + j.where, args: concat(j.args, []any{b.typ}, j.whereArgs)}
		if b.projects != nil {
			c.sql += ` AND i.project_id IN (` + placeholders(len(b.projects)) + `)`
			c.args = append(c.args, b.projects...)
		}
		return c
	}
	c := cond{sql: indexTable[fhir.KindOf(f.Param.Type)] + ` i WHERE i.resource_type = ? AND i.code = ?`, args: []any{b.typ, f.Param.Code}}
	if f.Modifier != "missing" {
		v := b.values(f)
		c.sql += ` AND ` + v.sql
		c.args = append(c.args, v.args...)
	}
	if b.projects != nil {
		c.sql += ` AND i.project_id IN (` + placeholders(len(b.projects)) + `)`
		c.args = append(c.args, b.projects...)
	}
	return c
}

// filter is the condition of one filter on the resource row alias a.
func (b *builder) filter(f fhir.Filter, a string) cond {
	p := f.Param
	if p.Column != "" {
		return columnCond(f, a)
	}
	if p.Type == fhir.CompositeParam {
		j := compositeJoin(f)
		return cond{sql: b.exists(false, `SELECT 1 FROM `+j.sql+` WHERE i.resource_id = `+a+`.id AND `+j.where), args: concat(j.args, j.whereArgs)}
	}
	table := indexTable[fhir.KindOf(p.Type)]
	probe := `SELECT 1 FROM ` + table + ` i WHERE i.resource_id = ` + a + `.id AND i.code = ?`
	args := []any{p.Code}
	if f.Chain != nil {
		// The references to the type, whose target matches the chain.
		inner := &builder{projects: b.projects, typ: f.TargetType}
		c := and([]cond{inner.base("c"), inner.filter(*f.Chain, "c")})
		return cond{sql: `EXISTS (` + probe + ` AND i.system = ? AND i.value IN (SELECT c.id FROM resources c WHERE ` + c.sql + `))`,
			args: concat(args, []any{f.TargetType}, c.args)}
	}
	if f.Modifier == "missing" {
		return cond{sql: b.exists(f.Values[0].Raw == "true", probe), args: args}
	}
	v := b.values(f)
	if f.Modifier == "not" {
		// A correlated NOT EXISTS probes the index per candidate row; NOT IN
		// would materialise every matching value of the project first (all
		// ClientApplication and Bot memberships for "profile-type:not=…").
		return cond{sql: b.exists(true, probe+` AND `+v.sql), args: concat(args, v.args)}
	}
	return cond{sql: b.exists(false, probe+` AND `+v.sql), args: concat(args, v.args)}
}

// joined is a composite filter's index rows: sql is "table i JOIN table c1
// ON ... JOIN ..." (its arguments args), where the condition on them
// (whereArgs): the first component's rows are i, the others c1, c2...,
// joined on the resource and the element (grp).
type joined struct {
	sql, where      string
	args, whereArgs []any
}

// compositeJoin writes a composite filter: one element's rows, one per
// component, matching every part of one of its values.
func compositeJoin(f fhir.Filter) joined {
	comps := f.Param.Components
	j := joined{sql: indexTable[fhir.KindOf(comps[0].Type)] + ` i`}
	for k := 1; k < len(comps); k++ {
		a := "c" + strconv.Itoa(k)
		j.sql += ` JOIN ` + indexTable[fhir.KindOf(comps[k].Type)] + ` ` + a + ` ON ` + a + `.resource_id = i.resource_id AND ` + a + `.code = ? AND ` + a + `.grp = i.grp`
		j.args = append(j.args, comps[k].Code)
	}
	var ors []string
	for _, v := range f.Values {
		var ands []string
		for k, c := range comps {
			vc := valueCond(fhir.Filter{Param: c}, v.Components[k])
			if k > 0 {
				vc.sql = rowAlias.ReplaceAllString(vc.sql, "c"+strconv.Itoa(k)+".")
			}
			ands = append(ands, vc.sql)
			j.whereArgs = append(j.whereArgs, vc.args...)
		}
		ors = append(ors, `(`+strings.Join(ands, ` AND `)+`)`)
	}
	j.where = `i.code = ? AND (` + strings.Join(ors, ` OR `) + `)`
	j.whereArgs = append([]any{comps[0].Code}, j.whereArgs...)
	return j
}

// rowAlias finds the index row alias i in a valueCond.
var rowAlias = regexp.MustCompile(`\bi\.`)

// expr is the condition of a _filter expression.
func (b *builder) expr(e *fhir.FilterExpr, a string) cond {
	switch e.Op {
	case "not":
		c := b.expr(e.Args[0], a)
		return cond{sql: `NOT (` + c.sql + `)`, args: c.args}
	case "and", "or":
		l, r := b.expr(e.Args[0], a), b.expr(e.Args[1], a)
		return cond{sql: `(` + l.sql + ` ` + strings.ToUpper(e.Op) + ` ` + r.sql + `)`, args: concat(l.args, r.args)}
	}
	return b.filter(*e.Filter, a)
}

// anyOf is the access-policy restriction: every filter of one group.
func (b *builder) anyOf(groups [][]fhir.Filter, a string) (cond, bool) {
	if len(groups) == 0 {
		return cond{}, false
	}
	var ors []string
	var args []any
	for _, g := range groups {
		if len(g) == 0 { // a group without filters lets everything through
			return cond{}, false
		}
		var cs []cond
		for _, f := range g {
			cs = append(cs, b.filter(f, a))
		}
		c := and(cs)
		ors = append(ors, "("+c.sql+")")
		args = append(args, c.args...)
	}
	return cond{sql: "(" + strings.Join(ors, " OR ") + ")", args: args}, true
}

// values is the OR of a filter's values, on the index row i. Values that
// only compare i.value are one IN list: PostgreSQL answers an OR of
// equalities with a bitmap scan that reads the table, an IN list from the
// index alone.
func (b *builder) values(f fhir.Filter) cond {
	if len(f.Values) > 1 {
		var in []any
		for _, v := range f.Values {
			c := valueCond(f, v)
			if c.sql != `i.value = ?` {
				in = nil
				break
			}
			in = append(in, c.args...)
		}
		if in != nil {
			return cond{sql: `i.value IN (` + placeholders(len(in)) + `)`, args: in}
		}
	}
	var ors []string
	var args []any
	for _, v := range f.Values {
		c := valueCond(f, v)
		ors = append(ors, c.sql)
		args = append(args, c.args...)
	}
	return cond{sql: `(` + strings.Join(ors, " OR ") + `)`, args: args}
}

func valueCond(f fhir.Filter, v fhir.FilterValue) cond {
	switch f.Param.Type {
	case fhir.StringParam:
		n := fhir.NormalizeString(v.Code)
		switch f.Modifier {
		case "exact":
			return cond{`(i.value_norm = ? AND i.value_exact = ?)`, []any{n, v.Code}}
		case "iexact":
			return cond{`i.value_norm = ?`, []any{n}}
		case "contains", "text":
			return cond{`i.value_norm LIKE ? ESCAPE '\'`, []any{"%" + escapeLike(n) + "%"}}
		case "endswith":
			return cond{`i.value_norm LIKE ? ESCAPE '\'`, []any{"%" + escapeLike(n)}}
		}
		return cond{`(i.value_norm >= ? AND i.value_norm < ?)`, []any{n, n + maxRune}}
	case fhir.DateParam:
		return dateCondition("i.lo", "i.hi", v)
	case fhir.NumberParam, fhir.QuantityParam:
		c := numberCondition(v)
		if v.HasSystem {
			c.sql += ` AND i.system = ?`
			c.args = append(c.args, v.System)
		}
		if v.Code != "" {
			c.sql += ` AND i.unit = ?`
			c.args = append(c.args, v.Code)
		}
		return cond{`(` + c.sql + `)`, c.args}
	case fhir.URIParam:
		if f.Modifier == "below" {
			return cond{`(i.value >= ? AND i.value < ?)`, []any{v.Code, v.Code + maxRune}}
		}
		return cond{`i.value = ?`, []any{v.Code}}
	case fhir.ReferenceParam:
		if f.TargetType != "" {
			if v.HasSystem && v.System != f.TargetType {
				return cond{sql: `1 = 0`}
			}
			return cond{`(i.system = ? AND i.value = ?)`, []any{f.TargetType, v.Code}}
		}
		if v.HasSystem {
			return cond{`(i.system = ? AND i.value = ?)`, []any{v.System, v.Code}}
		}
		return cond{`i.value = ?`, []any{v.Code}}
	default: // token, boolean
		if f.Modifier == "text" {
			// The text rows (fhir.TextSystem): a word of the text starts
			// with the value.
			n := escapeLike(fhir.NormalizeString(v.Raw))
			return cond{`(i.system = ? AND (i.value LIKE ? ESCAPE '\' OR i.value LIKE ? ESCAPE '\'))`,
				[]any{fhir.TextSystem, escapeLike(fhir.TextPrefix) + n + "%", "% " + n + "%"}}
		}
		if v.HasSystem {
			if v.Code == "" {
				return cond{`i.system = ?`, []any{v.System}}
			}
			return cond{`(i.system = ? AND i.value = ?)`, []any{v.System, v.Code}}
		}
		return cond{`i.value = ?`, []any{v.Code}}
	}
}

// dateCondition compares a stored range [lo, hi) with the value's range.
func dateCondition(lo, hi string, v fhir.FilterValue) cond {
	qlo, qhi := v.Lo.UnixMicro(), v.Hi.UnixMicro()
	switch v.Prefix {
	case "gt":
		return cond{hi + ` > ?`, []any{qhi}}
	case "lt":
		return cond{lo + ` < ?`, []any{qlo}}
	case "ge":
		return cond{hi + ` > ?`, []any{qlo}}
	case "le":
		return cond{lo + ` < ?`, []any{qhi}}
	case "sa":
		return cond{lo + ` >= ?`, []any{qhi}}
	case "eb":
		return cond{hi + ` <= ?`, []any{qlo}}
	case "ap":
		return cond{`(` + lo + ` < ? AND ` + hi + ` > ?)`, []any{qhi, qlo}}
	case "ne":
		return cond{`NOT (` + lo + ` >= ? AND ` + hi + ` <= ?)`, []any{qlo, qhi}}
	default: // eq; lo < qhi follows from the others and bounds the index range
		return cond{`(` + lo + ` >= ? AND ` + lo + ` < ? AND ` + hi + ` <= ?)`, []any{qlo, qhi, qhi}}
	}
}

// numberCondition compares a stored range [i.lo, i.hi] (one number: lo =
// hi) with the value: eq and ne by the range the value's precision denotes,
// the others by the value itself; ap is within 10%.
func numberCondition(v fhir.FilterValue) cond {
	switch v.Prefix {
	case "gt":
		return cond{`i.hi > ?`, []any{v.Num}}
	case "lt":
		return cond{`i.lo < ?`, []any{v.Num}}
	case "ge":
		return cond{`i.hi >= ?`, []any{v.Num}}
	case "le":
		return cond{`i.lo <= ?`, []any{v.Num}}
	case "sa":
		return cond{`i.lo > ?`, []any{v.Num}}
	case "eb":
		return cond{`i.hi < ?`, []any{v.Num}}
	case "ap":
		d := v.Num / 10
		if d < 0 {
			d = -d
		}
		return cond{`(i.lo <= ? AND i.hi >= ?)`, []any{v.Num + d, v.Num - d}}
	case "ne":
		return cond{`NOT (i.lo >= ? AND i.hi < ?)`, []any{v.NumLo, v.NumHi}}
	default: // eq
		return cond{`(i.lo >= ? AND i.hi < ?)`, []any{v.NumLo, v.NumHi}}
	}
}

func columnCond(f fhir.Filter, a string) cond {
	var ors []string
	var args []any
	for _, v := range f.Values {
		switch f.Param.Column {
		case "last_updated":
			// A stored instant t is the range [t, t+1µs).
			c := dateCondition(a+".last_updated", "("+a+".last_updated + 1)", v)
			ors = append(ors, c.sql)
			args = append(args, c.args...)
		default: // id, project_id
			ors = append(ors, a+`.`+f.Param.Column+` = ?`)
			args = append(args, v.Code)
		}
	}
	c := cond{sql: `(` + strings.Join(ors, " OR ") + `)`, args: args}
	if f.Modifier == "not" {
		c.sql = `NOT ` + c.sql
	}
	return c
}

// order is the ORDER BY of a search on the resource row r: its _sort keys
// (a parameter sorts by its least value ascending, its greatest
// descending; resources without one come last), then the id.
func (b *builder) order(req *fhir.SearchRequest) (string, []any) {
	if len(req.Sort) == 0 {
		return "r.last_updated, r.id", nil
	}
	var keys []string
	var args []any
	for _, k := range req.Sort {
		dir := ""
		if k.Descending {
			dir = " DESC"
		}
		if k.Param == nil {
			keys = append(keys, "r."+k.Column+dir)
			continue
		}
		agg, col := "MIN", ""
		if k.Descending {
			agg = "MAX"
		}
		switch fhir.KindOf(k.Param.Type) {
		case fhir.StringIndex:
			col = "value_norm"
		case fhir.DateIndex, fhir.NumberIndex:
			col = "lo"
			if k.Descending {
				col = "hi"
			}
		default:
			col = "value"
		}
		keys = append(keys, `(SELECT `+agg+`(i.`+col+`) FROM `+indexTable[fhir.KindOf(k.Param.Type)]+` i WHERE i.resource_id = r.id AND i.code = ?)`+dir+` NULLS LAST`)
		args = append(args, k.Param.Code)
	}
	if last := req.Sort[len(req.Sort)-1]; last.Param != nil || last.Column != "id" {
		// The id breaks ties in the direction of the last key, so that a
		// descending _lastUpdated is one backward walk of its index.
		if last.Descending {
			keys = append(keys, "r.id DESC")
		} else {
			keys = append(keys, "r.id")
		}
	}
	return strings.Join(keys, ", "), args
}

func concat(lists ...[]any) []any {
	var out []any
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
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

// searchSQL is a search's query for the store's driver: rebound, and marked
// (searchMarker) so that PostgreSQL plans it for its parameters every time.
func (s *Store) searchSQL(q string) string { return searchMarker + s.rebind(q) }
