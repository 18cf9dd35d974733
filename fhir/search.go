package fhir

import (
	"math"
	"net/url"
	"slices"
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
	// parameters of one search (_filter comparisons included): each becomes
	// a SQL condition, and SQLite refuses expressions nested deeper than
	// 1000 (a 500 otherwise).
	MaxOrValues = 200
	MaxFilters  = 100
)

// SearchRequest is a parsed search: filters are ANDed, the values of one
// filter are ORed.
type SearchRequest struct {
	ResourceType string
	Filters      []Filter
	// Expr holds the _filter expressions, each ANDed with Filters.
	Expr []*FilterExpr
	// FilterText is the _filter values as given, for the Bundle links.
	FilterText []string
	Count      int
	Offset     int
	Sort       []SortRule
	// Total is "", "none", "estimate" or "accurate".
	Total string
	// AnyOf restricts the search beyond Filters: a resource must match every
	// filter of at least one group (an access policy's criteria, one group
	// per policy entry). Empty means no restriction. Never set from a query.
	AnyOf [][]Filter
	// Includes are the _include and _revinclude of the search, in order.
	Includes []Include
	// Has are the search's reverse chains (_has), each resolved by the
	// searcher into an _id filter before the search runs.
	Has []Has
}

// Has is one _has: the resources of the searched type that a resource of
// Type references through its parameter Param, where that resource matches
// Search (_has:Observation:subject:code=x is Type Observation, Param
// subject, Search code=x, itself possibly a _has).
type Has struct {
	Type   string
	Param  *SearchParam
	Search *SearchRequest
	// Name and Value are the parameter as given, for links.
	Name, Value string
}

// MaxHasDepth bounds the nesting of _has.
const MaxHasDepth = 3

func parseHas(resourceType, name, value string) (Has, error) {
	if strings.Count(name, "_has:") > MaxHasDepth {
		return Has{}, Invalid("_has nests too deeply (max "+strconv.Itoa(MaxHasDepth)+")", "_has")
	}
	parts := strings.SplitN(name, ":", 4)
	if len(parts) != 4 || parts[0] != "_has" || !KnownType(parts[1]) || parts[3] == "" {
		return Has{}, Invalid("Invalid _has: "+name+" (_has:Type:referenceParam:searchParam=value)", "_has")
	}
	h := Has{Type: parts[1], Name: name, Value: value}
	h.Param = LookupParam(parts[1], parts[2])
	if h.Param == nil || h.Param.Type != ReferenceParam {
		return Has{}, Invalid("Invalid _has: "+parts[2]+" is not a reference parameter of "+parts[1], "_has")
	}
	if len(h.Param.Target) > 0 && !slices.Contains(h.Param.Target, resourceType) && !slices.Contains(h.Param.Target, "Resource") {
		return Has{}, Invalid("Invalid _has: "+parts[1]+"."+parts[2]+" does not refer to "+resourceType, "_has")
	}
	inner := &SearchRequest{ResourceType: h.Type, Count: DefaultCount}
	if err := inner.add(parts[3], value); err != nil {
		return Has{}, err
	}
	if len(inner.Includes) > 0 || len(inner.Sort) > 0 {
		return Has{}, Invalid("Invalid _has: "+name, "_has")
	}
	h.Search = inner
	return h, nil
}

// Include is one _include (the resources that the matches' reference
// parameter Param points to) or _revinclude (Rev: the resources of Source
// whose Param points to a match), of Target type only when set; Iterate
// applies it to the resources included too.
type Include struct {
	Rev     bool
	Iterate bool
	Source  string
	Param   *SearchParam
	Target  string
}

// MaxIncludes bounds the _include and _revinclude parameters of a search.
const MaxIncludes = 10

// String is the include as a query gives it: its name and value.
func (inc Include) String() (string, string) {
	name := "_include"
	if inc.Rev {
		name = "_revinclude"
	}
	if inc.Iterate {
		name += ":iterate"
	}
	value := inc.Source + ":" + inc.Param.Code
	if inc.Target != "" {
		value += ":" + inc.Target
	}
	return name, value
}

// parseInclude parses an _include or _revinclude (name with its modifier).
func parseInclude(name, value string) (Include, error) {
	base, modifier, _ := strings.Cut(name, ":")
	inc := Include{Rev: base == "_revinclude"}
	switch modifier {
	case "":
	case "iterate", "recurse":
		inc.Iterate = true
	default:
		return inc, Invalid("Unknown modifier of "+base+": "+modifier, base)
	}
	if value == "*" || strings.HasSuffix(value, ":*") {
		return inc, Invalid(base+"=* is not supported: name the type and its reference parameter (Type:param)", base)
	}
	parts := strings.Split(value, ":")
	if len(parts) < 2 || len(parts) > 3 || !KnownType(parts[0]) {
		return inc, Invalid("Invalid "+base+": "+value+" (Type:param or Type:param:TargetType)", base)
	}
	inc.Source = parts[0]
	inc.Param = LookupParam(parts[0], parts[1])
	if inc.Param == nil || inc.Param.Type != ReferenceParam {
		return inc, Invalid("Invalid "+base+": "+parts[1]+" is not a reference parameter of "+parts[0], base)
	}
	if len(parts) == 3 {
		if !KnownType(parts[2]) {
			return inc, Invalid("Invalid "+base+" target type: "+parts[2], base)
		}
		inc.Target = parts[2]
	}
	return inc, nil
}

// Filter is one parameter of a search.
type Filter struct {
	Param *SearchParam
	// Modifier is "", "not", "exact", "missing", "contains" or "below" as a
	// query gives them, or "iexact" (case-insensitive equality) and
	// "endswith" for strings compared by _filter's eq and ew.
	Modifier string
	// TargetType restricts a reference parameter to references to one type
	// (the :Type modifier, or the type of a chain).
	TargetType string
	// Chain, on a reference parameter, is a search of the referenced type
	// ("subject:Patient.name=x"): the filter matches a resource that
	// references a resource matching Chain.
	Chain  *Filter
	Values []FilterValue

	// fromFilterText marks a comparison of a _filter conjunction.
	fromFilterText bool
}

// FilterValue is one OR-ed value of a filter.
type FilterValue struct {
	// Raw is the value as given (after percent-decoding and \, unescaping).
	Raw string
	// Prefix is the comparator of date, number and quantity values: eq, ne,
	// gt, lt, ge, le, sa, eb or ap.
	Prefix string
	// System and Code split a token "system|code"; HasSystem is false when the
	// value had no "|" (any system matches). A reference "Type/id" is the
	// token (Type, id); a bare id has no system; any other reference (a URL)
	// has the system "". A quantity's unit is (System, Code).
	System, Code string
	HasSystem    bool
	// Lo and Hi bound a date value.
	Lo, Hi time.Time
	// Num is a number or quantity value; NumLo and NumHi the range its
	// precision denotes ("100" is [99.5, 100.5)).
	Num, NumLo, NumHi float64
	// Components are the parts of a composite parameter's value, one per
	// component of the parameter (SearchParam.Components), all to be
	// matched by the values of one element.
	Components []FilterValue
}

// SortRule is one _sort key: a resource row column or a parameter.
type SortRule struct {
	// Column is "last_updated" or "id" for _lastUpdated and _id.
	Column string
	// Param is the parameter sorted by when Column is empty.
	Param      *SearchParam
	Descending bool
}

// ignoredParams are accepted and ignored: presentation parameters, and the
// element selections (_fields, _elements), which only shorten what is sent:
// the whole resource is sent instead.
var ignoredParams = map[string]bool{"_format": true, "_pretty": true, "_fields": true, "_elements": true}

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

// filterCount is the number of conditions the request holds.
func (req *SearchRequest) filterCount() int {
	n := len(req.Filters)
	for _, e := range req.Expr {
		n += e.size()
	}
	return n
}

func (req *SearchRequest) add(name, value string) error {
	if strings.HasPrefix(name, "_has:") {
		h, err := parseHas(req.ResourceType, name, value)
		if err != nil {
			return err
		}
		req.Has = append(req.Has, h)
		return nil
	}
	if strings.HasPrefix(name, "_include") || strings.HasPrefix(name, "_revinclude") {
		if b, _, _ := strings.Cut(name, ":"); b != "_include" && b != "_revinclude" {
			return Invalid("Unknown search parameter: "+name, name)
		}
		inc, err := parseInclude(name, value)
		if err != nil {
			return err
		}
		if len(req.Includes) >= MaxIncludes {
			return Invalid("Too many _include and _revinclude parameters (max "+strconv.Itoa(MaxIncludes)+")", name)
		}
		req.Includes = append(req.Includes, inc)
		return nil
	}
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
	case "_summary":
		switch value {
		case "count":
			req.Count, req.Total = 0, "accurate"
			return nil
		case "true", "false", "text", "data":
			return nil // the whole resource is sent
		}
		return Invalid("Invalid _summary: "+value, "_summary")
	case "_sort":
		for _, key := range strings.Split(value, ",") {
			desc := strings.HasPrefix(key, "-")
			key = strings.TrimPrefix(key, "-")
			p := LookupParam(req.ResourceType, key)
			if p == nil || (p.Column != "" && p.Column != "id" && p.Column != "last_updated") || p.Type == CompositeParam {
				return Invalid("Unsupported sort parameter: "+key, "_sort")
			}
			if len(req.Sort) >= 8 {
				return Invalid("Too many sort keys (max 8)", "_sort")
			}
			rule := SortRule{Column: p.Column, Descending: desc}
			if p.Column == "" {
				rule.Param = p
			}
			req.Sort = append(req.Sort, rule)
		}
		return nil
	case "_filter":
		e, err := ParseFilterExpr(req.ResourceType, value)
		if err != nil {
			return err
		}
		req.FilterText = append(req.FilterText, value)
		// A conjunction of comparisons is plain filters, which the store
		// can drive a search with; anything else stays an expression.
		if leaves, ok := e.conjunction(); ok {
			for i := range leaves {
				leaves[i].fromFilterText = true
			}
			req.Filters = append(req.Filters, leaves...)
		} else {
			req.Expr = append(req.Expr, e)
		}
		if req.filterCount() > MaxFilters {
			return Invalid("Too many search parameters (max " + strconv.Itoa(MaxFilters) + ")")
		}
		return nil
	}
	if ignoredParams[name] {
		return nil
	}
	f, err := parseFilter(req.ResourceType, name, value, true)
	if err != nil {
		return err
	}
	if req.filterCount() >= MaxFilters {
		return Invalid("Too many search parameters (max " + strconv.Itoa(MaxFilters) + ")")
	}
	req.Filters = append(req.Filters, f)
	return nil
}

// parseFilter parses one "name=value" of a query; chain allows one
// "reference.param" or "reference:Type.param" step.
func parseFilter(resourceType, name, value string, chain bool) (Filter, error) {
	head, rest, chained := strings.Cut(name, ".")
	code, modifier, _ := strings.Cut(head, ":")
	p := LookupParam(resourceType, code)
	if p == nil {
		return Filter{}, Invalid("Unknown search parameter: " + code)
	}
	f := Filter{Param: p}
	if p.Type == ReferenceParam && modifier != "" && KnownType(modifier) {
		f.TargetType = modifier
		modifier = ""
	}
	if chained {
		if !chain || p.Type != ReferenceParam || modifier != "" {
			return Filter{}, Invalid("Unsupported chained search: " + name)
		}
		target := f.TargetType
		if target == "" {
			if len(p.Target) != 1 {
				return Filter{}, Invalid("Chained search on " + code + " must name the target type (" + code + ":Type." + rest + ")")
			}
			target = p.Target[0]
		}
		inner, err := parseFilter(target, rest, value, false)
		if err != nil {
			return Filter{}, err
		}
		f.TargetType, f.Chain = target, &inner
		return f, nil
	}
	f.Modifier = modifier
	if err := checkModifier(p, modifier); err != nil {
		return Filter{}, err
	}
	if p.Type == CompositeParam {
		return parseComposite(f, value)
	}
	raws := splitOr(value)
	if len(raws) > MaxOrValues {
		return Filter{}, Invalid("Too many values for search parameter "+code+" (max "+strconv.Itoa(MaxOrValues)+")", code)
	}
	for _, raw := range raws {
		v, err := ParseValue(p, modifier, raw)
		if err != nil {
			return Filter{}, err
		}
		f.Values = append(f.Values, v)
	}
	return f, nil
}

// parseComposite parses the values of a composite parameter: each OR-ed
// value has one part per component, separated by "$" ("\$" is a dollar
// inside a part), each part a value of its component's type.
func parseComposite(f Filter, value string) (Filter, error) {
	p := f.Param
	raws := splitKeep(value, ',')
	if len(raws) > MaxOrValues {
		return Filter{}, Invalid("Too many values for search parameter "+p.Code+" (max "+strconv.Itoa(MaxOrValues)+")", p.Code)
	}
	for _, raw := range raws {
		parts := splitKeep(raw, '$')
		if len(parts) != len(p.Components) {
			return Filter{}, Invalid("Invalid value for composite search parameter "+p.Code+": "+raw+" (want "+
				strconv.Itoa(len(p.Components))+" parts separated by $)", p.Code)
		}
		v := FilterValue{Raw: raw}
		for i, part := range parts {
			cv, err := ParseValue(p.Components[i], "", splitOr(part)[0])
			if err != nil {
				return Filter{}, Invalid("Invalid value for composite search parameter "+p.Code+": "+raw+" ("+err.Error()+")", p.Code)
			}
			if cv.Raw == "" {
				return Filter{}, Invalid("Invalid value for composite search parameter "+p.Code+": "+raw+" (an empty part)", p.Code)
			}
			v.Components = append(v.Components, cv)
		}
		f.Values = append(f.Values, v)
	}
	return f, nil
}

// splitKeep splits on a separator not escaped with a backslash, keeping
// the escapes in the parts.
func splitKeep(s string, sep byte) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\':
			i++
		case s[i] == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func checkModifier(p *SearchParam, modifier string) error {
	if p.Type == CompositeParam && modifier != "" {
		return Invalid("Unsupported modifier :" + modifier + " for composite search parameter " + p.Code)
	}
	ok := false
	switch modifier {
	case "", "missing":
		ok = true
	case "not":
		ok = p.Type == TokenParam || p.Type == BooleanParam || p.Type == ReferenceParam || p.Type == URIParam
	case "exact", "contains":
		ok = p.Type == StringParam
	case "text":
		ok = p.Type == StringParam || p.Type == TokenParam
	case "below":
		ok = p.Type == URIParam
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

var comparePrefixes = []string{"eq", "ne", "gt", "lt", "ge", "le", "sa", "eb", "ap"}

// cutPrefix splits a comparator prefix off a date, number or quantity value.
func cutPrefix(raw string) (prefix, rest string) {
	for _, pre := range comparePrefixes {
		if strings.HasPrefix(raw, pre) {
			return pre, raw[2:]
		}
	}
	return "eq", raw
}

// ParseValue parses one value of a parameter (for a modifier).
func ParseValue(p *SearchParam, modifier, raw string) (FilterValue, error) {
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
			break
		}
		switch rv := ReferenceValue(raw); {
		case rv.System != "":
			v.System, v.Code, v.HasSystem = rv.System, rv.Value, true
		case ValidID(raw):
			v.Code = raw // any type
		default:
			v.HasSystem = true // a URL or other reference: exactly as stored
		}
	case DateParam:
		s := raw
		v.Prefix, s = cutPrefix(s)
		lo, hi, err := ParseDateRange(s)
		if err != nil {
			return v, Invalid("Invalid date value for " + p.Code + ": " + raw)
		}
		v.Lo, v.Hi = lo, hi
	case NumberParam, QuantityParam:
		s := raw
		v.Prefix, s = cutPrefix(s)
		num, unit, hasUnit := strings.Cut(s, "|")
		if hasUnit && p.Type == NumberParam {
			return v, Invalid("Invalid number value for " + p.Code + ": " + raw)
		}
		n, lo, hi, err := parseNumberRange(num)
		if err != nil {
			return v, Invalid("Invalid "+string(p.Type)+" value for "+p.Code+": "+raw, p.Code)
		}
		v.Num, v.NumLo, v.NumHi = n, lo, hi
		if hasUnit {
			v.System, v.Code, _ = strings.Cut(unit, "|")
			if !strings.Contains(unit, "|") { // "5.4||mg" is system|code; "5.4|mg" is a bare code
				v.System, v.Code = "", unit
			}
			v.HasSystem = v.System != ""
		}
	case StringParam, URIParam:
		v.Code = raw
	}
	return v, nil
}

// parseNumberRange parses a decimal and the range its precision denotes:
// "100" is [99.5, 100.5), "1.50" is [1.495, 1.505), "1e2" is [50, 150).
func parseNumberRange(s string) (n, lo, hi float64, err error) {
	if s == "" || len(s) > 64 {
		return 0, 0, 0, Invalid("invalid number")
	}
	n, err = strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(n, 0) || math.IsNaN(n) {
		return 0, 0, 0, Invalid("invalid number")
	}
	mant, exp := strings.ToLower(s), 0
	if i := strings.IndexByte(mant, 'e'); i >= 0 {
		exp, err = strconv.Atoi(mant[i+1:])
		if err != nil {
			return 0, 0, 0, Invalid("invalid number")
		}
		mant = mant[:i]
	}
	decimals := 0
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		decimals = len(mant) - i - 1
	}
	half := 0.5 * math.Pow(10, float64(exp-decimals))
	return n, n - half, n + half, nil
}

// Query re-encodes the request as a query string (used for Bundle links).
func (req *SearchRequest) Query(offset int) string {
	q := url.Values{}
	var parts []string
	for _, f := range req.Filters {
		if f.fromFilterText {
			continue // written back as the _filter it came from
		}
		name, value := f.queryPart()
		parts = append(parts, url.QueryEscape(name)+"="+url.QueryEscape(value))
	}
	for _, s := range req.FilterText {
		parts = append(parts, "_filter="+url.QueryEscape(s))
	}
	for _, h := range req.Has {
		parts = append(parts, url.QueryEscape(h.Name)+"="+url.QueryEscape(h.Value))
	}
	for _, inc := range req.Includes {
		name, value := inc.String()
		parts = append(parts, url.QueryEscape(name)+"="+url.QueryEscape(value))
	}
	if len(req.Sort) > 0 {
		keys := make([]string, len(req.Sort))
		for i, s := range req.Sort {
			k := "_lastUpdated"
			switch {
			case s.Param != nil:
				k = s.Param.Code
			case s.Column == "id":
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

// queryPart is the filter as a query's name and value.
func (f Filter) queryPart() (string, string) {
	name := f.Param.Code
	if f.Chain != nil {
		n, v := f.Chain.queryPart()
		return name + ":" + f.TargetType + "." + n, v
	}
	if f.TargetType != "" {
		name += ":" + f.TargetType
	}
	if f.Modifier != "" {
		name += ":" + f.Modifier
	}
	vals := make([]string, len(f.Values))
	for i, v := range f.Values {
		if f.Param.Type == CompositeParam {
			vals[i] = v.Raw // as given, its escapes kept (parseComposite)
			continue
		}
		vals[i] = strings.ReplaceAll(strings.ReplaceAll(v.Raw, `\`, `\\`), ",", `\,`)
	}
	return name, strings.Join(vals, ",")
}
