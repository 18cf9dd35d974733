package fhir

import (
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"
)

// IndexKind is the index table a value goes to.
type IndexKind int

// Index kinds.
const (
	TokenIndex  IndexKind = iota // tokens, booleans and references: (system, value)
	StringIndex                  // strings: normalised and exact
	DateIndex                    // date ranges [Lo, Hi)
)

// IndexValue is one searchable value extracted from a resource.
type IndexValue struct {
	Code   string
	Kind   IndexKind
	System string // tokens only
	Value  string // token value, reference, or exact string
	Lo, Hi time.Time
}

// KindOf is the index kind of a parameter type.
func KindOf(t ParamType) IndexKind {
	switch t {
	case StringParam:
		return StringIndex
	case DateParam:
		return DateIndex
	default:
		return TokenIndex
	}
}

// MaxIndexedValue bounds the bytes of one indexed string or token value.
// PostgreSQL cannot index a B-tree entry over ~2.7 kB, so an unbounded value
// (a long name text, a huge code) would make the whole write fail. Longer
// strings are indexed by their first MaxIndexedValue bytes (prefix searches
// still work); longer tokens, which no one searches by, are not indexed.
const MaxIndexedValue = 1024

// boundValue applies MaxIndexedValue; ok is false when v is not indexed.
func boundValue(v IndexValue) (IndexValue, bool) {
	switch v.Kind {
	case StringIndex:
		if len(v.Value) > MaxIndexedValue {
			cut := MaxIndexedValue
			for cut > 0 && !utf8.RuneStart(v.Value[cut]) {
				cut--
			}
			v.Value = v.Value[:cut]
		}
	case TokenIndex:
		if len(v.Value) > MaxIndexedValue || len(v.System) > MaxIndexedValue {
			return v, false
		}
	}
	return v, true
}

// NormalizeString is how string parameters are compared: case-insensitive.
func NormalizeString(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// Extract computes every index value of r for the parameters of its type.
func Extract(r Resource) []IndexValue {
	var out []IndexValue
	for _, p := range IndexedParams(r.Type()) {
		seen := map[IndexValue]bool{}
		for _, path := range p.Paths {
			for _, node := range walkPath(map[string]any(r), strings.Split(path, ".")) {
				for _, v := range valuesOf(p, node) {
					v.Code = p.Code
					v.Kind = KindOf(p.Type)
					v, ok := boundValue(v)
					if ok && !seen[v] {
						seen[v] = true
						out = append(out, v)
					}
				}
			}
		}
	}
	return out
}

// walkPath follows a dotted path, flattening arrays, applying "[k=v]" filters.
func walkPath(v any, path []string) []any {
	if len(path) == 0 {
		if arr, ok := v.([]any); ok {
			return arr
		}
		return []any{v}
	}
	if arr, ok := v.([]any); ok {
		var out []any
		for _, x := range arr {
			out = append(out, walkPath(x, path)...)
		}
		return out
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	step := path[0]
	var filterKey, filterVal string
	if i := strings.IndexByte(step, '['); i > 0 && strings.HasSuffix(step, "]") {
		filterKey, filterVal, _ = strings.Cut(step[i+1:len(step)-1], "=")
		step = step[:i]
	}
	next, ok := obj[step]
	if !ok {
		return nil
	}
	if filterKey != "" {
		var kept []any
		items, isArr := next.([]any)
		if !isArr {
			items = []any{next}
		}
		for _, it := range items {
			if m, ok := it.(map[string]any); ok && m[filterKey] == filterVal {
				kept = append(kept, it)
			}
		}
		next = kept
	}
	return walkPath(next, path[1:])
}

func valuesOf(p *SearchParam, node any) []IndexValue {
	switch p.Type {
	case StringParam:
		return stringValues(node)
	case DateParam:
		return dateValues(node)
	case ReferenceParam:
		if ref := referenceOf(node); ref != "" {
			return []IndexValue{{Value: ref}}
		}
		return nil
	case BooleanParam:
		if b, ok := node.(bool); ok {
			if b {
				return []IndexValue{{Value: "true"}}
			}
			return []IndexValue{{Value: "false"}}
		}
		return nil
	default:
		if p.Derive == ReferenceType {
			if typ, _, ok := SplitReference(referenceOf(node)); ok {
				return []IndexValue{{Value: typ}}
			}
			return nil
		}
		return tokenValues(node)
	}
}

func referenceOf(node any) string {
	switch t := node.(type) {
	case map[string]any:
		s, _ := t["reference"].(string)
		return s
	case string:
		return t
	}
	return ""
}

func stringValues(node any) []IndexValue {
	switch t := node.(type) {
	case string:
		if t == "" {
			return nil
		}
		return []IndexValue{{Value: t}}
	case map[string]any:
		// HumanName, Address and similar: every string part is searchable.
		var out []IndexValue
		for _, k := range []string{"text", "family", "given", "prefix", "suffix", "line", "city", "district", "state", "postalCode", "country"} {
			switch v := t[k].(type) {
			case string:
				if v != "" {
					out = append(out, IndexValue{Value: v})
				}
			case []any:
				for _, x := range v {
					if s, ok := x.(string); ok && s != "" {
						out = append(out, IndexValue{Value: s})
					}
				}
			}
		}
		return out
	}
	return nil
}

func tokenValues(node any) []IndexValue {
	switch t := node.(type) {
	case string:
		return []IndexValue{{Value: t}}
	case bool:
		if t {
			return []IndexValue{{Value: "true"}}
		}
		return []IndexValue{{Value: "false"}}
	case json.Number:
		return []IndexValue{{Value: t.String()}}
	case map[string]any:
		if codings, ok := t["coding"].([]any); ok { // CodeableConcept
			var out []IndexValue
			for _, c := range codings {
				out = append(out, tokenValues(c)...)
			}
			if text, ok := t["text"].(string); ok && len(out) == 0 {
				out = append(out, IndexValue{Value: text})
			}
			return out
		}
		sys, _ := t["system"].(string)
		if code, ok := t["code"].(string); ok { // Coding
			return []IndexValue{{System: sys, Value: code}}
		}
		if v, ok := t["value"].(string); ok { // Identifier, ContactPoint
			return []IndexValue{{System: sys, Value: v}}
		}
	}
	return nil
}

func dateValues(node any) []IndexValue {
	switch t := node.(type) {
	case string:
		lo, hi, err := ParseDateRange(t)
		if err != nil {
			return nil
		}
		return []IndexValue{{Lo: lo, Hi: hi}}
	case map[string]any: // Period
		start, _ := t["start"].(string)
		end, _ := t["end"].(string)
		lo, hi := time.Unix(-62135596800, 0).UTC(), time.Unix(253402300799, 0).UTC()
		if start != "" {
			if l, _, err := ParseDateRange(start); err == nil {
				lo = l
			}
		}
		if end != "" {
			if _, h, err := ParseDateRange(end); err == nil {
				hi = h
			}
		}
		if start == "" && end == "" {
			return nil
		}
		return []IndexValue{{Lo: lo, Hi: hi}}
	}
	return nil
}

// ParseDateRange parses a FHIR date, dateTime or instant into the half-open
// range of instants it denotes: "2020" is the whole year, an instant is one
// millisecond.
func ParseDateRange(s string) (lo, hi time.Time, err error) {
	// The layout is chosen from the value's shape, so that a value is parsed
	// once (a failed time.Parse allocates its error, and dates are parsed on
	// every write of a dated resource).
	var layout string
	var add func(time.Time) time.Time
	switch {
	case len(s) == 4:
		layout, add = "2006", func(t time.Time) time.Time { return t.AddDate(1, 0, 0) }
	case len(s) == 7:
		layout, add = "2006-01", func(t time.Time) time.Time { return t.AddDate(0, 1, 0) }
	case len(s) == 10:
		layout, add = "2006-01-02", func(t time.Time) time.Time { return t.AddDate(0, 0, 1) }
	case len(s) > 16 && s[10] == 'T' && s[16] != ':':
		layout, add = "2006-01-02T15:04Z07:00", func(t time.Time) time.Time { return t.Add(time.Minute) }
	case len(s) > 19 && s[10] == 'T' && s[19] == '.':
		// An instant is one millisecond, whatever precision it is written in.
		layout, add = "2006-01-02T15:04:05.999999999Z07:00", func(t time.Time) time.Time { return t.Add(time.Millisecond) }
	case len(s) > 19 && s[10] == 'T':
		layout, add = "2006-01-02T15:04:05Z07:00", func(t time.Time) time.Time { return t.Add(time.Second) }
	default:
		return time.Time{}, time.Time{}, Invalid("Invalid date value: " + s)
	}
	t, perr := time.Parse(layout, s)
	if perr != nil {
		return time.Time{}, time.Time{}, Invalid("Invalid date value: " + s)
	}
	if strings.HasSuffix(layout, ".999999999Z07:00") {
		t = t.Truncate(time.Millisecond)
	}
	return t.UTC(), add(t).UTC(), nil
}
