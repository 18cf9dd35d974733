package fhir

import (
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Search limits, as the reference has them.
const (
	DefaultCount = 20
	MaxCount     = 1000
	MaxOffset    = 10000
	// MaxOrValues bounds the values of one parameter and MaxFilters the
	// parameters of one search: each becomes a SQL condition, and SQLite
	// refuses expressions nested deeper than 1000 (a 500 otherwise).
	MaxOrValues = 200
	MaxFilters  = 100
)

// SearchRequest is a parsed search: filters are ANDed, the values of one
// filter are ORed.
type SearchRequest struct {
	ResourceType string
	Filters      []Filter
	Count        int
	Offset       int
	Sort         []SortRule
	// Total is "", "none", "estimate" or "accurate".
	Total string
	// AnyOf restricts the search beyond Filters: a resource must match every
	// filter of at least one group (an access policy's criteria, one group
	// per policy entry). Empty means no restriction. Never set from a query.
	AnyOf [][]Filter
}

// Filter is one parameter of a search.
type Filter struct {
	Param *SearchParam
	// Modifier is "", "not", "exact", "missing" or "contains".
	Modifier string
	Values   []FilterValue
}

// FilterValue is one OR-ed value of a filter.
type FilterValue struct {
	// Raw is the value as given (after percent-decoding and \, unescaping).
	Raw string
	// Prefix is the comparator of date values: eq, ne, gt, lt, ge, le.
	Prefix string
	// System and Code split a token "system|code"; HasSystem is false when the
	// value had no "|" (any system matches).
	System, Code string
	HasSystem    bool
	// Lo and Hi bound a date value.
	Lo, Hi time.Time
}

// SortRule is one _sort key.
type SortRule struct {
	Column     string // a resource row column: "last_updated" or "id"
	Descending bool
}

// ignoredParams are accepted and ignored, as a FHIR server does with
// presentation-only parameters.
var ignoredParams = map[string]bool{"_format": true, "_pretty": true}

// ParseSearch parses a raw query string for a resource type. Names and values
// are percent-decoded before modifiers (":") and OR-lists (",") are split, as
// @medplum/core encodes them.
func ParseSearch(resourceType, rawQuery string) (*SearchRequest, error) {
	req := &SearchRequest{ResourceType: resourceType, Count: DefaultCount}
	if rawQuery == "" {
		return req, nil
	}
	for _, part := range strings.Split(rawQuery, "&") {
		if part == "" {
			continue
		}
		rawName, rawValue, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil {
			return nil, Invalid("Invalid search parameter encoding: " + rawName)
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return nil, Invalid("Invalid search value encoding for " + name)
		}
		if err := req.add(name, value); err != nil {
			return nil, err
		}
	}
	return req, nil
}

func (req *SearchRequest) add(name, value string) error {
	switch name {
	case "_count":
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 {
			return Invalid("Invalid _count: "+value, "_count")
		}
		req.Count = min(n, MaxCount)
		return nil
	case "_offset":
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 {
			return Invalid("Invalid _offset: "+value, "_offset")
		}
		if n > MaxOffset {
			return Invalid("Search offset exceeds maximum (got "+value+", max "+strconv.Itoa(MaxOffset)+")", "_offset")
		}
		req.Offset = n
		return nil
	case "_total":
		switch value {
		case "none", "estimate", "accurate":
			req.Total = value
			return nil
		}
		return Invalid("Invalid _total: "+value, "_total")
	case "_sort":
		for _, key := range strings.Split(value, ",") {
			desc := strings.HasPrefix(key, "-")
			key = strings.TrimPrefix(key, "-")
			p := LookupParam(req.ResourceType, key)
			if p == nil || (p.Column != "id" && p.Column != "last_updated") {
				return Invalid("Unsupported sort parameter: "+key, "_sort")
			}
			req.Sort = append(req.Sort, SortRule{Column: p.Column, Descending: desc})
		}
		return nil
	}
	if ignoredParams[name] {
		return nil
	}
	code, modifier, _ := strings.Cut(name, ":")
	p := LookupParam(req.ResourceType, code)
	if p == nil {
		return Invalid("Unknown search parameter: " + code)
	}
	f := Filter{Param: p, Modifier: modifier}
	if err := checkModifier(p, modifier); err != nil {
		return err
	}
	raws := splitOr(value)
	if len(raws) > MaxOrValues {
		return Invalid("Too many values for search parameter "+code+" (max "+strconv.Itoa(MaxOrValues)+")", code)
	}
	if len(req.Filters) >= MaxFilters {
		return Invalid("Too many search parameters (max " + strconv.Itoa(MaxFilters) + ")")
	}
	for _, raw := range raws {
		v, err := parseValue(p, modifier, raw)
		if err != nil {
			return err
		}
		f.Values = append(f.Values, v)
	}
	req.Filters = append(req.Filters, f)
	return nil
}

func checkModifier(p *SearchParam, modifier string) error {
	ok := false
	switch modifier {
	case "", "missing":
		ok = true
	case "not":
		ok = p.Type == TokenParam || p.Type == BooleanParam || p.Type == ReferenceParam
	case "exact", "contains":
		ok = p.Type == StringParam
	}
	if modifier == "missing" && p.Column != "" {
		ok = false
	}
	if !ok {
		return Invalid("Unsupported modifier :" + modifier + " for search parameter " + p.Code)
	}
	return nil
}

// splitOr splits on commas not escaped with a backslash, and unescapes "\,".
func splitOr(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && (s[i+1] == ',' || s[i+1] == '\\' || s[i+1] == '|' || s[i+1] == '$'):
			cur.WriteByte(s[i+1])
			i++
		case s[i] == ',':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(out, cur.String())
}

var datePrefixes = []string{"eq", "ne", "gt", "lt", "ge", "le"}

func parseValue(p *SearchParam, modifier, raw string) (FilterValue, error) {
	v := FilterValue{Raw: raw}
	if modifier == "missing" {
		if raw != "true" && raw != "false" {
			return v, Invalid("Search modifier :missing takes 'true' or 'false'")
		}
		return v, nil
	}
	switch p.Type {
	case BooleanParam:
		if raw != "true" && raw != "false" {
			return v, Invalid("Boolean search value must be 'true' or 'false'")
		}
		v.Code = raw
	case TokenParam:
		if sys, code, ok := strings.Cut(raw, "|"); ok {
			v.System, v.Code, v.HasSystem = sys, code, true
		} else {
			v.Code = raw
		}
		if p.Column == "id" && !ValidID(v.Code) {
			v.Code = "" // never matches; an invalid id is simply not found
		}
	case ReferenceParam:
		v.Code = raw
		if p.Column == "project_id" {
			v.Code = strings.TrimPrefix(raw, "Project/")
		}
	case DateParam:
		v.Prefix = "eq"
		s := raw
		for _, pre := range datePrefixes {
			if strings.HasPrefix(s, pre) {
				v.Prefix, s = pre, s[2:]
				break
			}
		}
		lo, hi, err := ParseDateRange(s)
		if err != nil {
			return v, Invalid("Invalid date value for " + p.Code + ": " + raw)
		}
		v.Lo, v.Hi = lo, hi
	case StringParam:
		v.Code = raw
	}
	return v, nil
}

// Query re-encodes the request as a query string (used for Bundle links).
func (req *SearchRequest) Query(offset int) string {
	q := url.Values{}
	var parts []string
	for _, f := range req.Filters {
		name := f.Param.Code
		if f.Modifier != "" {
			name += ":" + f.Modifier
		}
		vals := make([]string, len(f.Values))
		for i, v := range f.Values {
			vals[i] = strings.ReplaceAll(v.Raw, ",", `\,`)
			if f.Param.Type == DateParam && !strings.HasPrefix(v.Raw, v.Prefix) {
				vals[i] = v.Prefix + vals[i]
			}
		}
		parts = append(parts, url.QueryEscape(name)+"="+url.QueryEscape(strings.Join(vals, ",")))
	}
	if len(req.Sort) > 0 {
		keys := make([]string, len(req.Sort))
		for i, s := range req.Sort {
			k := "_lastUpdated"
			if s.Column == "id" {
				k = "_id"
			}
			if s.Descending {
				k = "-" + k
			}
			keys[i] = k
		}
		q.Set("_sort", strings.Join(keys, ","))
	}
	q.Set("_count", strconv.Itoa(req.Count))
	if offset > 0 {
		q.Set("_offset", strconv.Itoa(offset))
	}
	if req.Total != "" {
		q.Set("_total", req.Total)
	}
	if enc := q.Encode(); enc != "" {
		parts = append(parts, enc)
	}
	return strings.Join(parts, "&")
}
