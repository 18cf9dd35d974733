package deploy

import (
	"fmt"
	"strings"
)

// This file reads what a PromQL expression names, without a PromQL parser
// (Prometheus's would be a large dependency for a test): the metric names of
// its selectors with the labels they match on, the function each selector
// is an argument of, and the labels of its by, without, on, ignoring and
// group_ modifiers. It understands the expressions this directory writes
// (selectors, functions, aggregations, binary operators, ranges, strings,
// Grafana's $variables) and refuses shapes it does not (a selector without a
// metric name), so that nothing it cannot read passes unchecked. promtool
// checks the syntax itself.

// selector is one vector selector of an expression.
type selector struct {
	name   string
	labels []string // label names of its matchers
	fn     string   // the innermost function or aggregation it is inside ("" at top level)
}

// references is what an expression names.
type references struct {
	selectors []selector
	grouping  []string // labels of by, without, on, ignoring, group_left, group_right
}

type tokenKind int

const (
	tokIdent tokenKind = iota
	tokString
	tokNumber
	tokPunct
)

type token struct {
	kind tokenKind
	text string
}

// keywords are identifiers that are neither metrics nor functions.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// groupingKeywords take a parenthesised list of label names.
var groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// tokenize splits expr into tokens, dropping range and subquery brackets
// ([5m], [$__rate_interval], [1h:5m]) and Grafana variables outside strings.
func tokenize(expr string) ([]token, error) {
	var out []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#': // a comment runs to the end of the line
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && c != '`' {
					j++
				}
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			out = append(out, token{tokString, expr[i+1 : j]})
			i = j + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated range at %d", i)
			}
			i += j + 1
		case c == '$':
			// $name, ${name}, $__rate_interval: a Grafana variable.
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated variable at %d", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdentChar(expr[j]) {
					j++
				}
			}
			out = append(out, token{tokNumber, expr[i:j]})
			i = j
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdentChar(expr[j]) {
				j++
			}
			out = append(out, token{tokIdent, expr[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			j := i
			for j < len(expr) && (isIdentChar(expr[j]) || expr[j] == '.') {
				j++
			}
			out = append(out, token{tokNumber, expr[i:j]})
			i = j
		case strings.IndexByte("(){},+-*/%^=!<>~", c) >= 0:
			out = append(out, token{tokPunct, string(c)})
			i++
		default:
			return nil, fmt.Errorf("unexpected %q at %d", c, i)
		}
	}
	return out, nil
}

// parseRefs reads what expr names.
func parseRefs(expr string) (references, error) {
	toks, err := tokenize(expr)
	if err != nil {
		return references{}, err
	}
	var refs references
	var stack []string // one entry per open parenthesis: its function, or ""
	pending := ""      // an aggregation whose by/without list comes before its body
	top := func() string {
		if len(stack) == 0 {
			return ""
		}
		return stack[len(stack)-1]
	}
	is := func(i int, kind tokenKind, text string) bool {
		return i < len(toks) && toks[i].kind == kind && toks[i].text == text
	}
	for i := 0; i < len(toks); {
		t := toks[i]
		switch {
		case t.kind == tokIdent && groupingKeywords[t.text]:
			i++
			if !is(i, tokPunct, "(") {
				if t.text == "group_left" || t.text == "group_right" {
					continue // without a label list
				}
				return refs, fmt.Errorf("%s without a label list", t.text)
			}
			for i++; i < len(toks) && !is(i, tokPunct, ")"); i++ {
				if toks[i].kind == tokIdent {
					refs.grouping = append(refs.grouping, toks[i].text)
				} else if !is(i, tokPunct, ",") {
					return refs, fmt.Errorf("unexpected %q in %s list", toks[i].text, t.text)
				}
			}
			i++
		case t.kind == tokIdent && is(i+1, tokPunct, "("):
			stack = append(stack, t.text)
			i += 2
		case t.kind == tokIdent && i+1 < len(toks) && toks[i+1].kind == tokIdent && (toks[i+1].text == "by" || toks[i+1].text == "without"):
			pending = t.text
			i++
		case t.kind == tokIdent && keywords[t.text]:
			i++
		case t.kind == tokIdent:
			sel := selector{name: t.text, fn: top()}
			i++
			if is(i, tokPunct, "{") {
				for i++; i < len(toks) && !is(i, tokPunct, "}"); i++ {
					if toks[i].kind == tokIdent && i+1 < len(toks) && toks[i+1].kind == tokPunct {
						sel.labels = append(sel.labels, toks[i].text)
					}
				}
				if i >= len(toks) {
					return refs, fmt.Errorf("unterminated matchers of %s", sel.name)
				}
				i++
			}
			refs.selectors = append(refs.selectors, sel)
		case is(i, tokPunct, "{"):
			return refs, fmt.Errorf("a selector without a metric name: name the metric")
		case is(i, tokPunct, "("):
			stack = append(stack, pending)
			pending = ""
			i++
		case is(i, tokPunct, ")"):
			if len(stack) == 0 {
				return refs, fmt.Errorf("unbalanced )")
			}
			stack = stack[:len(stack)-1]
			i++
		default:
			i++
		}
	}
	if len(stack) != 0 {
		return refs, fmt.Errorf("unbalanced (")
	}
	return refs, nil
}
