package fhir

import (
	"strings"
	"time"
)

// This file evaluates searches in memory, for resources that are not in a
// store (the FHIR definitions): the same comparisons the SQL store makes,
// on the values Extract gives. store/storetest holds the store to the same
// semantics.

// MatchInMemory reports whether a resource (with its index values, from
// Extract) matches the request's filters and _filter expressions. Chained
// searches need other resources: they are refused with EInvalid.
func MatchInMemory(req *SearchRequest, r Resource, values []IndexValue) (bool, error) {
	for _, f := range req.Filters {
		ok, err := matchFilter(f, r, values)
		if err != nil || !ok {
			return false, err
		}
	}
	for _, e := range req.Expr {
		ok, err := matchExpr(e, r, values)
		if err != nil || !ok {
			return false, err
		}
	}
	if len(req.AnyOf) > 0 {
		anyGroup := false
		for _, g := range req.AnyOf {
			all := true
			for _, f := range g {
				ok, err := matchFilter(f, r, values)
				if err != nil {
					return false, err
				}
				all = all && ok
			}
			if all {
				anyGroup = true
				break
			}
		}
		if !anyGroup {
			return false, nil
		}
	}
	return true, nil
}

func matchExpr(e *FilterExpr, r Resource, values []IndexValue) (bool, error) {
	switch e.Op {
	case "not":
		ok, err := matchExpr(e.Args[0], r, values)
		return !ok, err
	case "and", "or":
		l, err := matchExpr(e.Args[0], r, values)
		if err != nil {
			return false, err
		}
		if e.Op == "and" && !l || e.Op == "or" && l {
			return l, nil
		}
		return matchExpr(e.Args[1], r, values)
	}
	return matchFilter(*e.Filter, r, values)
}

func matchFilter(f Filter, r Resource, values []IndexValue) (bool, error) {
	if f.Chain != nil {
		return false, Invalid("Chained search is not supported on " + r.Type())
	}
	if f.Param.Column != "" {
		return matchColumn(f, r), nil
	}
	if f.Param.Type == CompositeParam {
		return matchComposite(f, values), nil
	}
	var own []IndexValue
	for _, v := range values {
		if v.Code == f.Param.Code {
			own = append(own, v)
		}
	}
	if f.Modifier == "missing" {
		return (len(own) == 0) == (f.Values[0].Raw == "true"), nil
	}
	found := false
	for _, v := range own {
		for _, q := range f.Values {
			if matchValue(f, q, v) {
				found = true
			}
		}
	}
	if f.Modifier == "not" {
		return !found, nil
	}
	return found, nil
}

// matchComposite reports whether one element (one Group of the
// components' values) matches every part of one of the filter's values.
func matchComposite(f Filter, values []IndexValue) bool {
	for _, q := range f.Values {
		// groups[g] counts the parts element g matched.
		groups := map[int]int{}
		for i, c := range f.Param.Components {
			cf := Filter{Param: c}
			for g := range groupsOf(values, c.Code) {
				if groups[g] != i {
					continue
				}
				for _, v := range values {
					if v.Code == c.Code && v.Group == g && matchValue(cf, q.Components[i], v) {
						groups[g]++
						break
					}
				}
			}
		}
		for _, n := range groups {
			if n == len(f.Param.Components) {
				return true
			}
		}
	}
	return false
}

func groupsOf(values []IndexValue, code string) map[int]bool {
	out := map[int]bool{}
	for _, v := range values {
		if v.Code == code {
			out[v.Group] = true
		}
	}
	return out
}

func matchColumn(f Filter, r Resource) bool {
	found := false
	for _, q := range f.Values {
		switch f.Param.Column {
		case "id":
			found = found || r.ID() == q.Code
		case "project_id":
			found = found || r.MetaProject() == q.Code
		case "last_updated":
			meta, _ := r["meta"].(map[string]any)
			s, _ := meta["lastUpdated"].(string)
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				continue
			}
			lo := t.UTC().Truncate(time.Microsecond)
			found = found || matchDate(q, lo, lo.Add(time.Microsecond))
		}
	}
	if f.Modifier == "not" {
		return !found
	}
	return found
}

// matchValue is valueCond of store/sqlstore for one stored value.
func matchValue(f Filter, q FilterValue, v IndexValue) bool {
	switch f.Param.Type {
	case StringParam:
		n, stored := NormalizeString(q.Code), NormalizeString(v.Value)
		switch f.Modifier {
		case "exact":
			return v.Value == q.Code
		case "iexact":
			return stored == n
		case "contains", "text":
			return strings.Contains(stored, n)
		case "endswith":
			return strings.HasSuffix(stored, n)
		}
		return strings.HasPrefix(stored, n)
	case DateParam:
		return matchDate(q, v.Lo, v.Hi)
	case NumberParam, QuantityParam:
		if q.HasSystem && v.System != q.System || q.Code != "" && v.Value != q.Code {
			return false
		}
		return matchNumber(q, v.Num, v.NumHi)
	case URIParam:
		if f.Modifier == "below" {
			return strings.HasPrefix(v.Value, q.Code)
		}
		return v.Value == q.Code
	case ReferenceParam:
		if f.TargetType != "" {
			return (!q.HasSystem || q.System == f.TargetType) && v.System == f.TargetType && v.Value == q.Code
		}
		if q.HasSystem {
			return v.System == q.System && v.Value == q.Code
		}
		return v.Value == q.Code
	default: // token, boolean
		if f.Modifier == "text" {
			n := NormalizeString(q.Raw)
			return v.System == TextSystem && (strings.HasPrefix(v.Value, TextPrefix+n) || strings.Contains(v.Value, " "+n))
		}
		if q.HasSystem {
			return v.System == q.System && (q.Code == "" || v.Value == q.Code)
		}
		return v.Value == q.Code
	}
}

// matchDate compares a stored range [lo, hi) with a date value.
func matchDate(q FilterValue, lo, hi time.Time) bool {
	switch q.Prefix {
	case "gt":
		return hi.After(q.Hi)
	case "lt":
		return lo.Before(q.Lo)
	case "ge":
		return hi.After(q.Lo)
	case "le":
		return lo.Before(q.Hi)
	case "sa":
		return !lo.Before(q.Hi)
	case "eb":
		return !hi.After(q.Lo)
	case "ap":
		return lo.Before(q.Hi) && hi.After(q.Lo)
	case "ne":
		return !(!lo.Before(q.Lo) && !hi.After(q.Hi))
	default:
		return !lo.Before(q.Lo) && !hi.After(q.Hi)
	}
}

// matchNumber compares a stored range [lo, hi] with a number value.
func matchNumber(q FilterValue, lo, hi float64) bool {
	switch q.Prefix {
	case "gt":
		return hi > q.Num
	case "lt":
		return lo < q.Num
	case "ge":
		return hi >= q.Num
	case "le":
		return lo <= q.Num
	case "sa":
		return lo > q.Num
	case "eb":
		return hi < q.Num
	case "ap":
		d := q.Num / 10
		if d < 0 {
			d = -d
		}
		return lo <= q.Num+d && hi >= q.Num-d
	case "ne":
		return !(lo >= q.NumLo && hi < q.NumHi)
	default:
		return lo >= q.NumLo && hi < q.NumHi
	}
}

// SortKey is the value a resource sorts by for a _sort rule on a parameter:
// the least (ascending) or greatest (descending) of its values, as the SQL
// store sorts; ok is false when it has none (such resources sort last).
func SortKey(rule SortRule, values []IndexValue) (key string, num float64, ok bool) {
	for _, v := range values {
		if v.Code != rule.Param.Code {
			continue
		}
		var k string
		var n float64
		switch v.Kind {
		case StringIndex:
			k = NormalizeString(v.Value)
		case DateIndex:
			n = float64(v.Lo.UnixMicro())
			if rule.Descending {
				n = float64(v.Hi.UnixMicro())
			}
		case NumberIndex:
			n = v.Num
			if rule.Descending {
				n = v.NumHi
			}
		default:
			k = v.Value
		}
		if !ok || !rule.Descending && (k < key || n < num) || rule.Descending && (k > key || n > num) {
			key, num, ok = k, n, true
		}
	}
	return key, num, ok
}
