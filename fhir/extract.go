package fhir

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// IndexKind is the index table a value goes to.
type IndexKind int

// Index kinds.
const (
	TokenIndex  IndexKind = iota // tokens, booleans, uris and references: (system, value)
	StringIndex                  // strings: normalised and exact
	DateIndex                    // date ranges [Lo, Hi)
	NumberIndex                  // numbers and quantities: [Num, NumHi] with a unit (System, Value)
	// CompositeIndex is a composite parameter's kind: it has no rows of its
	// own, its components' rows are in the tables of their kinds.
	CompositeIndex
)

// IndexValue is one searchable value extracted from a resource. A
// reference "Type/id" is the token (Type, id); any other reference (a URL,
// a canonical) is the token ("", reference).
type IndexValue struct {
	Code   string
	Kind   IndexKind
	System string
	Value  string
	Lo, Hi time.Time
	// Num and NumHi bound a number or quantity: equal for a single value,
	// the ends of a Range (±Inf when open).
	Num, NumHi float64
	// Group numbers, from 1, the element a composite parameter's component
	// value comes from: the values of one element share it. 0 on the values
	// of other parameters.
	Group int
}

// KindOf is the index kind of a parameter type.
func KindOf(t ParamType) IndexKind {
	switch t {
	case StringParam:
		return StringIndex
	case DateParam:
		return DateIndex
	case NumberParam, QuantityParam:
		return NumberIndex
	case CompositeParam:
		return CompositeIndex
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
	case TokenIndex, NumberIndex:
		if len(v.Value) > MaxIndexedValue || len(v.System) > MaxIndexedValue {
			return v, false
		}
	}
	return v, true
}

// NormalizeString is how string parameters are compared: case-insensitive.
func NormalizeString(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// Extract computes every index value of r for the parameters of its type,
// by evaluating each parameter's FHIRPath expression.
func Extract(r Resource) []IndexValue {
	var out []IndexValue
	for _, p := range IndexedParams(r.Type()) {
		if p.Type == CompositeParam {
			out = appendComposite(out, r, p)
			continue
		}
		var seen map[IndexValue]bool
		nodes := p.path.Eval(r)
		if p.Single && len(nodes) > 1 {
			// A parameter of one value per resource keeps one even when a
			// resource breaks its definition's cardinality: the store's
			// counts rely on it.
			nodes = nodes[:1]
		}
		for _, node := range nodes {
			for _, v := range valuesOf(p, node) {
				v.Code = p.Code
				v.Kind = KindOf(p.Type)
				v, ok := boundValue(v)
				if !ok || seen[v] {
					continue
				}
				if seen == nil {
					seen = map[IndexValue]bool{}
				}
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	return out
}

// appendComposite appends the component values of a composite parameter,
// element by element: an element gives rows only when every component has a
// value there, and each row carries the element's number.
func appendComposite(out []IndexValue, r Resource, p *SearchParam) []IndexValue {
	nodes := p.path.Eval(r)
	if len(nodes) > MaxCompositeElements {
		nodes = nodes[:MaxCompositeElements]
	}
	group := 0
	var parts [][]IndexValue
	for _, node := range nodes {
		parts = parts[:0]
		for _, c := range p.Components {
			var vals []IndexValue
			for _, n := range c.path.EvalOn(node) {
				for _, v := range valuesOf(c, n) {
					v.Code, v.Kind = c.Code, KindOf(c.Type)
					if v, ok := boundValue(v); ok && !slices.Contains(vals, v) {
						vals = append(vals, v)
					}
				}
			}
			if len(vals) == 0 {
				break
			}
			parts = append(parts, vals)
		}
		if len(parts) < len(p.Components) {
			continue
		}
		group++
		for _, vals := range parts {
			for _, v := range vals {
				v.Group = group
				out = append(out, v)
			}
		}
	}
	return out
}

// ExtractParam computes the index values of one parameter.
func ExtractParam(r Resource, p *SearchParam) []IndexValue {
	var out []IndexValue
	for _, v := range Extract(r) {
		if v.Code == p.Code {
			out = append(out, v)
		}
	}
	return out
}

func valuesOf(p *SearchParam, node any) []IndexValue {
	switch p.Type {
	case StringParam:
		return stringValues(node)
	case DateParam:
		return dateValues(node)
	case ReferenceParam:
		if ref := referenceOf(node); ref != "" {
			return []IndexValue{ReferenceValue(ref)}
		}
		return nil
	case BooleanParam:
		if b, ok := node.(bool); ok {
			return []IndexValue{{Value: strconv.FormatBool(b)}}
		}
		return nil
	case NumberParam, QuantityParam:
		return numberValues(node)
	case URIParam:
		if s, ok := node.(string); ok && s != "" {
			return []IndexValue{{Value: s}}
		}
		return nil
	default:
		return tokenValues(node)
	}
}

// ReferenceValue is how a reference is indexed and searched: "Type/id" as
// (Type, id), a version-specific one ("Type/id/_history/v") as the same (a
// search for the resource finds references to any of its versions),
// anything else as ("", reference).
func ReferenceValue(ref string) IndexValue {
	if base, version, ok := strings.Cut(ref, "/_history/"); ok && version != "" && !strings.Contains(version, "/") {
		ref = base
	}
	if typ, id, ok := SplitReference(ref); ok && KnownType(typ) {
		return IndexValue{System: typ, Value: id}
	}
	return IndexValue{Value: ref}
}

func referenceOf(node any) string {
	switch t := node.(type) {
	case map[string]any:
		s, _ := t["reference"].(string)
		return s
	case string: // canonical, uri
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

// TextSystem is the system of the token index rows that hold a coded
// element's text (a CodeableConcept's text, its codings' and a Coding's
// display), lower-cased and prefixed with TextPrefix, for the :text
// modifier. The prefix keeps them from equalling a code that a search
// without a system looks for.
const (
	TextSystem = "urn:sandbot:text"
	TextPrefix = "text:"
)

func textValue(s string) (IndexValue, bool) {
	n := NormalizeString(s)
	if n == "" {
		return IndexValue{}, false
	}
	return IndexValue{System: TextSystem, Value: TextPrefix + n}, true
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
			if text, ok := t["text"].(string); ok {
				if len(out) == 0 {
					out = append(out, IndexValue{Value: text})
				}
				if v, ok := textValue(text); ok {
					out = append(out, v)
				}
			}
			return out
		}
		sys, _ := t["system"].(string)
		if code, ok := t["code"].(string); ok { // Coding
			out := []IndexValue{{System: sys, Value: code}}
			if display, ok := t["display"].(string); ok {
				if v, ok := textValue(display); ok {
					out = append(out, v)
				}
			}
			return out
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
	case map[string]any: // Period; Timing
		if events, ok := t["event"].([]any); ok {
			var out []IndexValue
			for _, e := range events {
				out = append(out, dateValues(e)...)
			}
			return out
		}
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

// numberValues reads a number, a Quantity (value, unit) or a Range.
func numberValues(node any) []IndexValue {
	switch t := node.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(t.String(), 64)
		if err != nil {
			return nil
		}
		return []IndexValue{{Num: f, NumHi: f}}
	case map[string]any:
		low, lok := t["low"].(map[string]any)
		high, hok := t["high"].(map[string]any)
		if lok || hok { // Range
			v := IndexValue{Num: -math.MaxFloat64, NumHi: math.MaxFloat64} // an open end
			for _, q := range []map[string]any{low, high} {
				if q == nil {
					continue
				}
				sys, code := quantityUnit(q)
				if v.Value == "" {
					v.System, v.Value = sys, code
				}
			}
			if f, ok := quantityNumber(low); ok {
				v.Num = f
			}
			if f, ok := quantityNumber(high); ok {
				v.NumHi = f
			}
			return []IndexValue{v}
		}
		f, ok := quantityNumber(t)
		if !ok {
			return nil
		}
		sys, code := quantityUnit(t)
		return []IndexValue{{Num: f, NumHi: f, System: sys, Value: code}}
	}
	return nil
}

func quantityNumber(q map[string]any) (float64, bool) {
	n, ok := q["value"].(json.Number)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(n.String(), 64)
	return f, err == nil
}

// quantityUnit is a Quantity's system and code, the unit when it has no code.
func quantityUnit(q map[string]any) (system, code string) {
	system, _ = q["system"].(string)
	code, _ = q["code"].(string)
	if code == "" {
		code, _ = q["unit"].(string)
	}
	return system, code
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
