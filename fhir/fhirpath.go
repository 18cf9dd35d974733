package fhir

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// This file holds the subset of FHIRPath that search parameter definitions
// use: paths from a resource type, unions (|), indexers, parentheses,
// where(...) with resolve() is T, = / != against literals, and / or,
// ofType(T) / as(T) / "as T" / "is T" for choice elements, resolve(),
// extension('url'), first(), exists(), empty(), iif(c, a, b), and string,
// number and boolean literals. An expression outside it does not parse, and
// its parameter is left out of the table (SearchParamsSkipped lists them).
// A Subscription's criteria (ParseCriteria) has a little more: see there.

// Limits of the parser: definitions are data, but the parser is fuzzed as
// if they were hostile.
const (
	maxPathLength = 4096
	maxPathDepth  = 64
)

// pathNode is one node of a parsed expression.
type pathNode struct {
	op   string // see eval
	name string // identifier, function name, type or literal text
	kids []*pathNode
	num  float64
	idx  int
}

// PathExpr is a parsed FHIRPath expression of the search subset.
type PathExpr struct {
	src  string
	root *pathNode
	// chains is set when the expression is a union of plain paths from a
	// type ("Patient.name | Person.name"): Eval then walks them directly,
	// without the general evaluator's allocations (most definitions are
	// such paths, and every write evaluates them all).
	chains []pathChain
}

// pathChain is one plain path: a type, then element names.
type pathChain struct {
	typ   string
	names []string
}

// String is the expression's source.
func (e *PathExpr) String() string { return e.src }

// ParsePath parses an expression of the subset.
func ParsePath(src string) (*PathExpr, error) {
	if len(src) > maxPathLength {
		return nil, errors.New("fhirpath: expression too long")
	}
	return parsePath(src, false)
}

// ParseCriteria parses a Subscription's FHIRPath criteria: the search
// subset and, beside it, the environment variables %current, %previous and
// %resource, the operators implies, xor, <, >, <= and >=, and count(). The
// search subset stays as it is, so that no search parameter's meaning
// changes with them.
func ParseCriteria(src string) (*PathExpr, error) {
	return parsePath(src, true)
}

// criteriaVariables are the environment variables a criteria may name.
var criteriaVariables = map[string]bool{"current": true, "previous": true, "resource": true}

func parsePath(src string, criteria bool) (*PathExpr, error) {
	if len(src) > maxPathLength {
		return nil, errors.New("fhirpath: expression too long")
	}
	toks, err := lexPath(src)
	if err != nil {
		return nil, err
	}
	p := &pathParser{toks: toks, criteria: criteria, levels: pathLevels}
	if criteria {
		p.levels = criteriaLevels
	}
	n, err := p.expr(0)
	if err != nil {
		return nil, err
	}
	if p.pos != len(p.toks) {
		return nil, fmt.Errorf("fhirpath: unexpected %q", p.toks[p.pos].text)
	}
	e := &PathExpr{src: src, root: n}
	if chains, ok := plainChains(n); ok && !criteria {
		e.chains = chains
	}
	return e, nil
}

// plainChains decomposes a union of plain paths from resource types.
func plainChains(n *pathNode) ([]pathChain, bool) {
	switch n.op {
	case "|":
		l, ok := plainChains(n.kids[0])
		if !ok {
			return nil, false
		}
		r, ok := plainChains(n.kids[1])
		return append(l, r...), ok
	case "paren":
		return plainChains(n.kids[0])
	case "child":
		c, ok := plainChains(n.kids[0])
		if !ok || len(c) != 1 {
			return nil, false
		}
		c[0].names = append(c[0].names, n.name)
		return c, true
	case "ident":
		if n.name != "" && n.name[0] >= 'A' && n.name[0] <= 'Z' && isResourceTypeName(n.name) {
			return []pathChain{{typ: n.name}}, true
		}
	}
	return nil, false
}

type pathToken struct {
	kind byte // 'i' identifier, 's' string, 'n' number, 'p' punctuation/operator
	text string
}

func lexPath(s string) ([]pathToken, error) {
	var out []pathToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '\'':
			var b strings.Builder
			j := i + 1
			for ; j < len(s) && s[j] != '\''; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, errors.New("fhirpath: unterminated string")
			}
			out = append(out, pathToken{'s', b.String()})
			i = j + 1
		case c == '`':
			j := strings.IndexByte(s[i+1:], '`')
			if j < 0 {
				return nil, errors.New("fhirpath: unterminated identifier")
			}
			out = append(out, pathToken{'i', s[i+1 : i+1+j]})
			i += j + 2
		case c >= '0' && c <= '9':
			j := i
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' && j+1 < len(s) && s[j+1] >= '0' && s[j+1] <= '9') {
				j++
			}
			out = append(out, pathToken{'n', s[i:j]})
			i = j
		case c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			out = append(out, pathToken{'i', s[i:j]})
			i = j
		case c == '%' && i+1 < len(s) && (s[i+1] == '_' || s[i+1] >= 'a' && s[i+1] <= 'z' || s[i+1] >= 'A' && s[i+1] <= 'Z'):
			j := i + 2
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			out = append(out, pathToken{'v', s[i+1 : j]})
			i = j
		case (c == '<' || c == '>') && i+1 < len(s) && s[i+1] == '=':
			out = append(out, pathToken{'p', s[i : i+2]})
			i += 2
		case c == '<' || c == '>':
			out = append(out, pathToken{'p', string(c)})
			i++
		case c == '!' && i+1 < len(s) && s[i+1] == '=':
			out = append(out, pathToken{'p', "!="})
			i += 2
		case strings.IndexByte(".()[]|=,", c) >= 0:
			out = append(out, pathToken{'p', string(c)})
			i++
		default:
			return nil, fmt.Errorf("fhirpath: unsupported character %q", c)
		}
	}
	return out, nil
}

type pathParser struct {
	toks  []pathToken
	pos   int
	depth int
	// criteria allows what ParseCriteria adds to the search subset.
	criteria bool
	levels   [][]string
}

func (p *pathParser) peek() pathToken {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return pathToken{}
}

func (p *pathParser) accept(kind byte, text string) bool {
	t := p.peek()
	if t.kind == kind && t.text == text {
		p.pos++
		return true
	}
	return false
}

func (p *pathParser) expect(text string) error {
	if !p.accept('p', text) {
		return fmt.Errorf("fhirpath: expected %q", text)
	}
	return nil
}

// Binary operators of the subset, loosest first (FHIRPath precedence).
var pathLevels = [][]string{{"or"}, {"and"}, {"=", "!="}, {"|"}, {"is", "as"}}

// criteriaLevels are the operators of a Subscription's criteria.
var criteriaLevels = [][]string{{"implies"}, {"or", "xor"}, {"and"}, {"=", "!="}, {"<", ">", "<=", ">="}, {"|"}, {"is", "as"}}

func (p *pathParser) expr(level int) (*pathNode, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxPathDepth {
		return nil, errors.New("fhirpath: expression nested too deeply")
	}
	if level == len(p.levels) {
		return p.term()
	}
	left, err := p.expr(level + 1)
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		op := ""
		for _, o := range p.levels[level] {
			if t.text == o && (t.kind == 'p' || t.kind == 'i') {
				op = o
			}
		}
		if op == "" {
			return left, nil
		}
		p.pos++
		if op == "is" || op == "as" {
			typ, err := p.typeName()
			if err != nil {
				return nil, err
			}
			left = &pathNode{op: op, name: typ, kids: []*pathNode{left}}
			continue
		}
		right, err := p.expr(level + 1)
		if err != nil {
			return nil, err
		}
		left = &pathNode{op: op, kids: []*pathNode{left, right}}
	}
}

func (p *pathParser) typeName() (string, error) {
	t := p.peek()
	if t.kind != 'i' {
		return "", errors.New("fhirpath: expected a type name")
	}
	p.pos++
	name := t.text
	// FHIR.Quantity, System.String
	if p.accept('p', ".") {
		t = p.peek()
		if t.kind != 'i' {
			return "", errors.New("fhirpath: expected a type name")
		}
		p.pos++
		name = t.text
	}
	return name, nil
}

// term is a primary followed by invocations and indexers.
func (p *pathParser) term() (*pathNode, error) {
	var n *pathNode
	t := p.peek()
	switch {
	case t.kind == 'p' && t.text == "(":
		p.pos++
		inner, err := p.expr(0)
		if err != nil {
			return nil, err
		}
		if err := p.expect(")"); err != nil {
			return nil, err
		}
		n = &pathNode{op: "paren", kids: []*pathNode{inner}}
	case t.kind == 's':
		p.pos++
		n = &pathNode{op: "str", name: t.text}
	case t.kind == 'n':
		p.pos++
		f, err := strconv.ParseFloat(t.text, 64)
		if err != nil {
			return nil, err
		}
		n = &pathNode{op: "num", name: t.text, num: f}
	case t.kind == 'v':
		if !p.criteria || !criteriaVariables[t.text] {
			return nil, fmt.Errorf("fhirpath: unknown variable %%%s", t.text)
		}
		p.pos++
		n = &pathNode{op: "var", name: t.text}
	case t.kind == 'i' && (t.text == "true" || t.text == "false"):
		p.pos++
		n = &pathNode{op: "bool", name: t.text}
	case t.kind == 'i':
		inv, err := p.invocation(true)
		if err != nil {
			return nil, err
		}
		n = inv
	default:
		return nil, fmt.Errorf("fhirpath: unexpected %q", t.text)
	}
	for {
		switch {
		case p.accept('p', "."):
			inv, err := p.invocation(false)
			if err != nil {
				return nil, err
			}
			inv.kids = append([]*pathNode{n}, inv.kids...)
			n = inv
		case p.accept('p', "["):
			t := p.peek()
			if t.kind != 'n' {
				return nil, errors.New("fhirpath: expected an index")
			}
			p.pos++
			i, err := strconv.Atoi(t.text)
			if err != nil || i > 1<<16 {
				return nil, errors.New("fhirpath: invalid index")
			}
			if err := p.expect("]"); err != nil {
				return nil, err
			}
			n = &pathNode{op: "index", idx: i, kids: []*pathNode{n}}
		default:
			return n, nil
		}
	}
}

// pathFunctions are the functions of the subset with their argument count.
var pathFunctions = map[string]int{
	"where": 1, "ofType": 1, "as": 1, "is": 1, "resolve": 0, "extension": 1,
	"first": 0, "exists": 0, "empty": 0, "iif": 3, "not": 0,
}

// criteriaFunctions are the functions a criteria has beyond the search
// subset's.
var criteriaFunctions = map[string]int{"count": 0}

// invocation parses an identifier or a function call. The focus of a
// function call is its first kid, added by the caller; leading marks an
// invocation that starts a term (its focus is the input).
func (p *pathParser) invocation(leading bool) (*pathNode, error) {
	t := p.peek()
	if t.kind != 'i' {
		return nil, errors.New("fhirpath: expected a name")
	}
	p.pos++
	if !p.accept('p', "(") {
		if leading {
			return &pathNode{op: "ident", name: t.text}, nil
		}
		return &pathNode{op: "child", name: t.text}, nil
	}
	arity, ok := pathFunctions[t.text]
	if !ok && p.criteria {
		arity, ok = criteriaFunctions[t.text]
	}
	if !ok {
		return nil, fmt.Errorf("fhirpath: unsupported function %s()", t.text)
	}
	fn := &pathNode{op: "fn", name: t.text}
	if leading {
		fn.kids = []*pathNode{{op: "this"}}
	}
	var args []*pathNode
	if !p.accept('p', ")") {
		for {
			var arg *pathNode
			var err error
			if t.text == "ofType" || t.text == "as" || t.text == "is" {
				var typ string
				typ, err = p.typeName()
				arg = &pathNode{op: "type", name: typ}
			} else {
				arg, err = p.expr(0)
			}
			if err != nil {
				return nil, err
			}
			args = append(args, arg)
			if p.accept('p', ")") {
				break
			}
			if err := p.expect(","); err != nil {
				return nil, err
			}
		}
	}
	if len(args) != arity {
		return nil, fmt.Errorf("fhirpath: %s() takes %d arguments", t.text, arity)
	}
	fn.kids = append(fn.kids, args...)
	return fn, nil
}

// pathItem is one value an expression yields: a JSON value of the resource
// (map, slice element, string, json.Number, bool) and, for a choice
// element (value[x]), the type its name carried.
type pathItem struct {
	v   any
	typ string
}

// Eval evaluates the expression on a resource.
func (e *PathExpr) Eval(r Resource) []any {
	if e.chains != nil {
		var out []any
		rt := r.Type()
		for _, c := range e.chains {
			if c.typ == rt || c.typ == "Resource" || c.typ == "DomainResource" {
				out = walkChain(out, map[string]any(r), c.names)
			}
		}
		return out
	}
	items := evalPath(e.root, []pathItem{{v: map[string]any(r), typ: r.Type()}}, nil)
	out := make([]any, 0, len(items))
	for _, it := range items {
		out = append(out, it.v)
	}
	return out
}

// EvalOn evaluates the expression on any node of a resource (an element
// of a composite search parameter: its components' expressions are
// relative to it).
func (e *PathExpr) EvalOn(node any) []any {
	if r, ok := node.(map[string]any); ok {
		if _, isResource := r["resourceType"]; isResource {
			return e.Eval(Resource(r))
		}
	}
	items := evalPath(e.root, []pathItem{{v: node}}, nil)
	out := make([]any, 0, len(items))
	for _, it := range items {
		out = append(out, it.v)
	}
	return out
}

// typedItems is Eval keeping the choice types (for extraction of Range and
// Period values, which need no type, this is only used in tests).
func (e *PathExpr) evalItems(r Resource) []pathItem {
	return evalPath(e.root, []pathItem{{v: map[string]any(r), typ: r.Type()}}, nil)
}

func isResourceTypeName(name string) bool {
	return name == "Resource" || name == "DomainResource" || KnownType(name)
}

// pathEnv holds the values of the environment variables (%name) of an
// expression parsed with them (ParseCriteria); nil for the search subset.
type pathEnv map[string][]pathItem

// evalPath evaluates n on the input collection, with the environment's
// variables.
func evalPath(n *pathNode, in []pathItem, env pathEnv) []pathItem {
	switch n.op {
	case "this":
		return in
	case "paren":
		return evalPath(n.kids[0], in, env)
	case "str":
		return []pathItem{{v: n.name, typ: "string"}}
	case "num":
		return []pathItem{{v: json.Number(n.name), typ: "decimal"}}
	case "bool":
		return []pathItem{{v: n.name == "true", typ: "boolean"}}
	case "var":
		return env[n.name]
	case "ident":
		// A leading type name selects the input when it is of that type
		// (Resource and DomainResource match every resource); any other
		// name is an element of the input.
		if n.name != "" && n.name[0] >= 'A' && n.name[0] <= 'Z' && isResourceTypeName(n.name) {
			var out []pathItem
			for _, it := range in {
				if m, ok := it.v.(map[string]any); ok {
					rt, _ := m["resourceType"].(string)
					if rt != "" && (rt == n.name || n.name == "Resource" || n.name == "DomainResource") {
						out = append(out, it)
					}
				}
			}
			return out
		}
		return children(in, n.name)
	case "child":
		return children(evalPath(n.kids[0], in, env), n.name)
	case "index":
		items := evalPath(n.kids[0], in, env)
		if n.idx < len(items) {
			return items[n.idx : n.idx+1]
		}
		return nil
	case "|":
		return append(evalPath(n.kids[0], in, env), evalPath(n.kids[1], in, env)...)
	case "as":
		return ofType(evalPath(n.kids[0], in, env), n.name)
	case "is":
		return boolItem(len(ofType(evalPath(n.kids[0], in, env), n.name)) > 0)
	case "=", "!=":
		l, r := evalPath(n.kids[0], in, env), evalPath(n.kids[1], in, env)
		if len(l) == 0 || len(r) == 0 {
			return nil
		}
		eq := equalItems(l, r)
		if n.op == "!=" {
			eq = !eq
		}
		return boolItem(eq)
	case "and":
		l, r := truth(evalPath(n.kids[0], in, env)), truth(evalPath(n.kids[1], in, env))
		switch {
		case l == 0 || r == 0:
			return boolItem(false)
		case l == 1 && r == 1:
			return boolItem(true)
		}
		return nil
	case "or":
		l, r := truth(evalPath(n.kids[0], in, env)), truth(evalPath(n.kids[1], in, env))
		switch {
		case l == 1 || r == 1:
			return boolItem(true)
		case l == 0 && r == 0:
			return boolItem(false)
		}
		return nil
	case "xor":
		l, r := truth(evalPath(n.kids[0], in, env)), truth(evalPath(n.kids[1], in, env))
		if l < 0 || r < 0 {
			return nil
		}
		return boolItem(l != r)
	case "implies":
		l := truth(evalPath(n.kids[0], in, env))
		if l == 0 {
			return boolItem(true)
		}
		r := truth(evalPath(n.kids[1], in, env))
		switch {
		case r == 1:
			return boolItem(true)
		case l == 1 && r == 0:
			return boolItem(false)
		}
		return nil
	case "<", ">", "<=", ">=":
		c, ok := compareItems(evalPath(n.kids[0], in, env), evalPath(n.kids[1], in, env))
		if !ok {
			return nil
		}
		switch n.op {
		case "<":
			return boolItem(c < 0)
		case ">":
			return boolItem(c > 0)
		case "<=":
			return boolItem(c <= 0)
		}
		return boolItem(c >= 0)
	case "fn":
		return evalFunction(n, in, env)
	}
	return nil
}

func evalFunction(n *pathNode, in []pathItem, env pathEnv) []pathItem {
	focus := evalPath(n.kids[0], in, env)
	args := n.kids[1:]
	switch n.name {
	case "where":
		var out []pathItem
		for _, it := range focus {
			if truth(evalPath(args[0], []pathItem{it}, env)) == 1 {
				out = append(out, it)
			}
		}
		return out
	case "ofType", "as":
		return ofType(focus, args[0].name)
	case "is":
		return boolItem(len(ofType(focus, args[0].name)) > 0)
	case "resolve":
		var out []pathItem
		for _, it := range focus {
			ref := referenceOf(it.v)
			if typ, id, ok := splitAnyReference(ref); ok {
				out = append(out, pathItem{v: map[string]any{"resourceType": typ, "id": id}, typ: typ})
			}
		}
		return out
	case "extension":
		urls := evalPath(args[0], in, env)
		if len(urls) != 1 {
			return nil
		}
		url, _ := urls[0].v.(string)
		var out []pathItem
		for _, ext := range children(focus, "extension") {
			if m, ok := ext.v.(map[string]any); ok && m["url"] == url {
				out = append(out, ext)
			}
		}
		return out
	case "first":
		if len(focus) > 0 {
			return focus[:1]
		}
		return nil
	case "exists":
		return boolItem(len(focus) > 0)
	case "count":
		return []pathItem{{v: json.Number(strconv.Itoa(len(focus))), typ: "integer"}}
	case "empty":
		return boolItem(len(focus) == 0)
	case "not":
		switch truth(focus) {
		case 1:
			return boolItem(false)
		case 0:
			return boolItem(true)
		}
		return nil
	case "iif":
		// iif's criterion and branches are evaluated on the input.
		switch truth(evalPath(args[0], in, env)) {
		case 1:
			return evalPath(args[1], in, env)
		default:
			return evalPath(args[2], in, env)
		}
	}
	return nil
}

func boolItem(b bool) []pathItem { return []pathItem{{v: b, typ: "boolean"}} }

// truth is FHIRPath's singleton evaluation of a collection as a boolean:
// 1 true, 0 false, -1 empty. A non-boolean singleton is true.
func truth(items []pathItem) int {
	if len(items) == 0 {
		return -1
	}
	if b, ok := items[0].v.(bool); ok && len(items) == 1 {
		if b {
			return 1
		}
		return 0
	}
	return 1
}

// compareItems orders two singletons: numbers by value, strings (dates and
// times among them, whose ISO form orders as they do) by their bytes.
// Anything else, or a collection of another size, does not compare.
func compareItems(l, r []pathItem) (int, bool) {
	if len(l) != 1 || len(r) != 1 {
		return 0, false
	}
	ln, lok := l[0].v.(json.Number)
	rn, rok := r[0].v.(json.Number)
	if lok && rok {
		a, err1 := ln.Float64()
		b, err2 := rn.Float64()
		if err1 != nil || err2 != nil {
			return 0, false
		}
		switch {
		case a < b:
			return -1, true
		case a > b:
			return 1, true
		}
		return 0, true
	}
	ls, lok := l[0].v.(string)
	rs, rok := r[0].v.(string)
	if lok && rok {
		return strings.Compare(ls, rs), true
	}
	return 0, false
}

// EvalCriteria evaluates a criteria on a resource, with its environment:
// the resource is the input and %current and %resource, and previous (nil
// when there is none) is %previous. It is true only when the result is a
// true boolean or another non-empty singleton (FHIRPath's singleton
// evaluation).
func (e *PathExpr) EvalCriteria(current, previous Resource) bool {
	env := pathEnv{}
	cur := []pathItem{{v: map[string]any(current), typ: current.Type()}}
	env["current"], env["resource"] = cur, cur
	if previous != nil {
		env["previous"] = []pathItem{{v: map[string]any(previous), typ: previous.Type()}}
	}
	return truth(evalPath(e.root, cur, env)) == 1
}

func equalItems(l, r []pathItem) bool {
	if len(l) != len(r) {
		return false
	}
	for i := range l {
		if scalarString(l[i].v) != scalarString(r[i].v) || scalarString(l[i].v) == "" && l[i].v != r[i].v {
			return false
		}
	}
	return true
}

func scalarString(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case json.Number:
		return t.String()
	case bool:
		return strconv.FormatBool(t)
	}
	return ""
}

// children selects a named element of every item, flattening arrays. A
// choice element (value[x]) is found by its typed name (valueQuantity) and
// keeps its type.
func children(in []pathItem, name string) []pathItem {
	var out []pathItem
	for _, it := range in {
		m, ok := it.v.(map[string]any)
		if !ok {
			continue
		}
		if v, ok := m[name]; ok {
			out = appendFlat(out, v, "")
			continue
		}
		if !choiceElements[name] {
			continue
		}
		for k, v := range m {
			if len(k) > len(name) && strings.HasPrefix(k, name) && k[len(name)] >= 'A' && k[len(name)] <= 'Z' {
				out = appendFlat(out, v, k[len(name):])
			}
		}
	}
	return out
}

// walkChain appends the values at a plain path below v, flattening arrays,
// as children does.
func walkChain(out []any, v any, names []string) []any {
	switch t := v.(type) {
	case nil:
	case []any:
		for _, x := range t {
			out = walkChain(out, x, names)
		}
	default:
		if len(names) == 0 {
			out = append(out, v)
		}
	case map[string]any:
		if len(names) == 0 {
			return append(out, v)
		}
		name := names[0]
		if next, ok := t[name]; ok {
			return walkChain(out, next, names[1:])
		}
		if choiceElements[name] {
			for k, next := range t {
				if len(k) > len(name) && strings.HasPrefix(k, name) && k[len(name)] >= 'A' && k[len(name)] <= 'Z' {
					out = walkChain(out, next, names[1:])
				}
			}
		}
	}
	return out
}

func appendFlat(out []pathItem, v any, typ string) []pathItem {
	if arr, ok := v.([]any); ok {
		for _, x := range arr {
			if x != nil {
				out = append(out, pathItem{v: x, typ: typ})
			}
		}
		return out
	}
	if v == nil {
		return out
	}
	return append(out, pathItem{v: v, typ: typ})
}

// ofType keeps the items of a type: a choice element by the type its name
// carried; a resource by its resourceType; other items (whose type the JSON
// does not say) are kept.
func ofType(in []pathItem, typ string) []pathItem {
	var out []pathItem
	for _, it := range in {
		switch {
		case it.typ != "":
			if strings.EqualFold(it.typ, typ) {
				out = append(out, it)
			}
		default:
			if m, ok := it.v.(map[string]any); ok {
				if rt, _ := m["resourceType"].(string); rt != "" && rt != typ {
					continue
				}
			}
			out = append(out, it)
		}
	}
	return out
}

// splitAnyReference splits "Type/id", or an absolute URL ending in
// "Type/id" (possibly with "/_history/v"), into its type and id.
func splitAnyReference(ref string) (typ, id string, ok bool) {
	if typ, id, ok := SplitReference(ref); ok {
		return typ, id, true
	}
	if i := strings.Index(ref, "/_history/"); i > 0 {
		ref = ref[:i]
	}
	parts := strings.Split(ref, "/")
	if len(parts) < 2 {
		return "", "", false
	}
	typ, id = parts[len(parts)-2], parts[len(parts)-1]
	if KnownType(typ) && ValidID(id) {
		return typ, id, true
	}
	return "", "", false
}
