package fhir

import (
	"strconv"
	"strings"
	"unicode"
)

// FilterExpr is a parsed _filter expression: comparisons of search
// parameters combined with and, or, not and parentheses, as the reference's
// web app sends them ("based-on eq Task/1 or focus eq Task/1").
type FilterExpr struct {
	// Op is "and", "or" or "not" (one argument); "" for a comparison.
	Op   string
	Args []*FilterExpr
	// Filter is the comparison of a leaf.
	Filter *Filter
}

func (e *FilterExpr) size() int {
	if e.Filter != nil {
		return 1
	}
	n := 0
	for _, a := range e.Args {
		n += a.size()
	}
	return n
}

// conjunction returns the comparisons of an expression that only ANDs
// them.
func (e *FilterExpr) conjunction() ([]Filter, bool) {
	switch {
	case e.Filter != nil:
		return []Filter{*e.Filter}, true
	case e.Op == "and":
		l, ok := e.Args[0].conjunction()
		if !ok {
			return nil, false
		}
		r, ok := e.Args[1].conjunction()
		return append(l, r...), ok
	}
	return nil, false
}

// Limits of _filter: its length, nesting and comparisons (MaxFilters).
const (
	maxFilterLength = 8192
	maxFilterDepth  = 32
)

// ParseFilterExpr parses a _filter value for a resource type. The
// comparison operators are eq, ne, co, sw, ew, gt, lt, ge, le, sa, eb, ap
// and pr; the others of the specification (po, ss, sb, in, ni, re) are
// refused.
func ParseFilterExpr(resourceType, s string) (*FilterExpr, error) {
	if len(s) > maxFilterLength {
		return nil, Invalid("_filter is too long (max "+strconv.Itoa(maxFilterLength)+" bytes)", "_filter")
	}
	toks, err := lexFilter(s)
	if err != nil {
		return nil, err
	}
	p := &filterParser{toks: toks, typ: resourceType}
	e, err := p.or()
	if err != nil {
		return nil, err
	}
	if p.pos != len(p.toks) {
		return nil, Invalid("Invalid _filter: unexpected "+strconv.Quote(p.toks[p.pos].text), "_filter")
	}
	if e.size() > MaxFilters {
		return nil, Invalid("Too many comparisons in _filter (max "+strconv.Itoa(MaxFilters)+")", "_filter")
	}
	return e, nil
}

type filterToken struct {
	text   string
	quoted bool
}

func lexFilter(s string) ([]filterToken, error) {
	var out []filterToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case isFilterSpace(c):
			i++
		case c == '(' || c == ')':
			out = append(out, filterToken{text: string(c)})
			i++
		case c == '"':
			var b strings.Builder
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, Invalid("Invalid _filter: unterminated string", "_filter")
			}
			out = append(out, filterToken{text: b.String(), quoted: true})
			i = j + 1
		default:
			j := i
			for j < len(s) && !isFilterSpace(s[j]) && s[j] != '(' && s[j] != ')' {
				j++
			}
			out = append(out, filterToken{text: s[i:j]})
			i = j
		}
	}
	return out, nil
}

// isFilterSpace is ASCII white space (the lexer works on bytes: a byte of a
// multi-byte character is never space).
func isFilterSpace(c byte) bool { return c < 0x80 && unicode.IsSpace(rune(c)) }

type filterParser struct {
	toks  []filterToken
	pos   int
	depth int
	typ   string
}

func (p *filterParser) word(w string) bool {
	if p.pos < len(p.toks) && !p.toks[p.pos].quoted && strings.EqualFold(p.toks[p.pos].text, w) {
		p.pos++
		return true
	}
	return false
}

func (p *filterParser) or() (*FilterExpr, error) {
	left, err := p.and()
	if err != nil {
		return nil, err
	}
	for p.word("or") {
		right, err := p.and()
		if err != nil {
			return nil, err
		}
		left = &FilterExpr{Op: "or", Args: []*FilterExpr{left, right}}
	}
	return left, nil
}

func (p *filterParser) and() (*FilterExpr, error) {
	left, err := p.unary()
	if err != nil {
		return nil, err
	}
	for p.word("and") {
		right, err := p.unary()
		if err != nil {
			return nil, err
		}
		left = &FilterExpr{Op: "and", Args: []*FilterExpr{left, right}}
	}
	return left, nil
}

func (p *filterParser) unary() (*FilterExpr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxFilterDepth {
		return nil, Invalid("Invalid _filter: nested too deeply", "_filter")
	}
	if p.word("not") {
		inner, err := p.unary()
		if err != nil {
			return nil, err
		}
		return &FilterExpr{Op: "not", Args: []*FilterExpr{inner}}, nil
	}
	if p.word("(") {
		inner, err := p.or()
		if err != nil {
			return nil, err
		}
		if !p.word(")") {
			return nil, Invalid("Invalid _filter: missing )", "_filter")
		}
		return inner, nil
	}
	if p.pos+3 > len(p.toks) {
		return nil, Invalid("Invalid _filter: expected \"parameter operator value\"", "_filter")
	}
	name, op, value := p.toks[p.pos], p.toks[p.pos+1], p.toks[p.pos+2]
	if name.quoted || op.quoted || !value.quoted && (value.text == "(" || value.text == ")") {
		return nil, Invalid("Invalid _filter: expected \"parameter operator value\"", "_filter")
	}
	p.pos += 3
	return filterComparison(p.typ, name.text, strings.ToLower(op.text), value.text)
}

// filterComparison turns "name op value" into a filter.
func filterComparison(resourceType, name, op, value string) (*FilterExpr, error) {
	head, rest, chained := strings.Cut(name, ".")
	p := LookupParam(resourceType, head)
	if p == nil {
		return nil, Invalid("Unknown search parameter: " + head)
	}
	if chained {
		if p.Type != ReferenceParam || len(p.Target) != 1 || strings.Contains(rest, ".") {
			return nil, Invalid("Unsupported chained search in _filter: " + name)
		}
		inner, err := filterComparison(p.Target[0], rest, op, value)
		if err != nil {
			return nil, err
		}
		wrap := func(f *Filter) *FilterExpr {
			return &FilterExpr{Filter: &Filter{Param: p, TargetType: p.Target[0], Chain: f}}
		}
		if inner.Op == "not" { // "subject.name ne x": no referenced resource named x
			return &FilterExpr{Op: "not", Args: []*FilterExpr{wrap(inner.Args[0].Filter)}}, nil
		}
		return wrap(inner.Filter), nil
	}
	if p.Type == CompositeParam {
		return nil, Invalid("Composite parameter "+p.Code+" is not supported in _filter: use it as a search parameter", "_filter")
	}
	unsupported := Invalid("Unsupported _filter operator "+op+" for "+string(p.Type.FHIRType())+" parameter "+p.Code, "_filter")
	f := &Filter{Param: p}
	negate := false
	raw := value
	switch p.Type {
	case DateParam, NumberParam, QuantityParam:
		switch op {
		case "eq", "ne", "gt", "lt", "ge", "le", "sa", "eb", "ap":
			raw = op + value
		case "pr":
		default:
			return nil, unsupported
		}
	case StringParam:
		switch op {
		case "eq":
			f.Modifier = "iexact"
		case "ne":
			f.Modifier, negate = "iexact", true
		case "co":
			f.Modifier = "contains"
		case "sw":
		case "ew":
			f.Modifier = "endswith"
		case "pr":
		default:
			return nil, unsupported
		}
	default: // token, boolean, reference, uri
		switch op {
		case "eq":
		case "ne":
			negate = true
		case "sw", "sb":
			if p.Type != URIParam {
				return nil, unsupported
			}
			f.Modifier = "below"
		case "pr":
		default:
			return nil, unsupported
		}
	}
	if op == "pr" {
		if value != "true" && value != "false" {
			return nil, Invalid("_filter operator pr takes true or false", "_filter")
		}
		f.Modifier = "missing"
		raw = strconv.FormatBool(value == "false")
	}
	if p.Column != "" && f.Modifier == "missing" {
		return nil, unsupported
	}
	v, err := ParseValue(p, f.Modifier, raw)
	if err != nil {
		return nil, err
	}
	f.Values = []FilterValue{v}
	leaf := &FilterExpr{Filter: f}
	if negate {
		return &FilterExpr{Op: "not", Args: []*FilterExpr{leaf}}, nil
	}
	return leaf, nil
}

// String writes the expression back in _filter syntax (for tests and logs).
func (e *FilterExpr) String() string {
	switch e.Op {
	case "not":
		return "not (" + e.Args[0].String() + ")"
	case "and", "or":
		return "(" + e.Args[0].String() + " " + e.Op + " " + e.Args[1].String() + ")"
	}
	n, v := e.Filter.queryPart()
	return n + " = " + strconv.Quote(v)
}
