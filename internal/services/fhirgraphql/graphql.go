package fhirgraphql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/graphql-go/graphql"
	"github.com/graphql-go/graphql/language/ast"
	"github.com/graphql-go/graphql/language/parser"
	"github.com/graphql-go/graphql/language/source"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/limits"
)

// Engine answers GraphQL queries for callers.
type Engine struct {
	svc *fhirservice.Service
	lim limits.Limits

	// prepared keeps checked documents by query text: the web app sends
	// the same few queries again and again, and checking one against the
	// schema costs about a millisecond.
	mu       sync.Mutex
	prepared map[string]*ast.Document
}

// Bounds of the prepared-document cache: entries, and the longest query
// kept. A full cache is emptied.
const (
	preparedEntries  = 256
	preparedMaxQuery = 16 << 10
)

// sharedSchema is generated once per process (it takes about a second of
// CPU and depends only on the embedded definitions); each Engine's reads go
// to its own service, which every query carries in its context.
var sharedSchema = sync.OnceValues(func() (*graphql.Schema, error) {
	set, err := definitions.Load()
	if err != nil {
		return nil, err
	}
	schema, err := buildSchema(set, &resolver{})
	if err != nil {
		return nil, fmt.Errorf("fhirgraphql: schema: %w", err)
	}
	return &schema, nil
})

// New returns an engine whose reads and searches go through svc, each query
// within lim's GraphQL limits, and starts generating the schema in the
// background so that the first query need not wait for it.
func New(svc *fhirservice.Service, lim limits.Limits) *Engine {
	go sharedSchema()
	return &Engine{svc: svc, lim: lim.WithDefaults(), prepared: map[string]*ast.Document{}}
}

// Schema is the generated schema (waiting for it the first time).
func (e *Engine) Schema() (*graphql.Schema, error) { return sharedSchema() }

// Request is one GraphQL request.
type Request struct {
	Query         string         `json:"query"`
	OperationName string         `json:"operationName"`
	Variables     map[string]any `json:"variables"`
}

// Result is GraphQL's answer: data and errors.
type Result = graphql.Result

// Do runs a query for p. A query that cannot run at all (unparsable,
// invalid against the schema, too deep, a mutation) is an *fhir.Error (400);
// errors of single fields are in the result, beside the data.
func (e *Engine) Do(ctx context.Context, p *principal.Principal, req *Request) (*Result, error) {
	if p == nil {
		return nil, fhir.ErrUnauthorized
	}
	schema, err := e.Schema()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	doc := e.prepared[req.Query]
	e.mu.Unlock()
	if doc == nil {
		if doc, err = prepare(schema, e.lim, req); err != nil {
			return nil, err
		}
		if len(req.Query) <= preparedMaxQuery {
			e.mu.Lock()
			if len(e.prepared) >= preparedEntries {
				clear(e.prepared)
			}
			e.prepared[req.Query] = doc
			e.mu.Unlock()
		}
	}
	ctx = context.WithValue(ctx, stateKey{}, &state{p: p, svc: e.svc, maxReads: e.lim.GraphQLReads})
	res := graphql.Execute(graphql.ExecuteParams{Schema: *schema, AST: doc, OperationName: req.OperationName,
		Args: req.Variables, Context: ctx})
	return res, nil
}

// prepare parses a query and checks it against the schema and the limits.
// The library panics on some malformed documents its parser accepts (a
// variable without a type); such a panic is a 400 too.
func prepare(schema *graphql.Schema, lim limits.Limits, req *Request) (doc *ast.Document, err error) {
	defer func() {
		if p := recover(); p != nil {
			doc, err = nil, fhir.Invalid("GraphQL query could not be checked: it is malformed", "query")
		}
	}()
	return check(schema, lim, req)
}

func check(schema *graphql.Schema, lim limits.Limits, req *Request) (*ast.Document, error) {
	if strings.TrimSpace(req.Query) == "" {
		return nil, fhir.Invalid("Must provide query string", "query")
	}
	doc, err := parser.Parse(parser.ParseParams{Source: source.NewSource(&source.Source{Body: []byte(req.Query), Name: "GraphQL request"})})
	if err != nil {
		return nil, fhir.Invalid("GraphQL syntax error: "+firstLine(err.Error()), "query")
	}
	if err := checkDocument(doc, lim); err != nil {
		return nil, err
	}
	if v := graphql.ValidateDocument(schema, doc, nil); !v.IsValid {
		return nil, fhir.Invalid("GraphQL validation error: "+v.Errors[0].Message, "query")
	}
	return doc, nil
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

// checkDocument refuses mutations and subscriptions (the schema has none;
// FHIR writes go through REST), fragments that spread themselves, and
// selections nested deeper than lim.GraphQLDepth or, with every fragment
// spread expanded, more than lim.GraphQLSelections of them. It runs before the library's
// validation, some of whose rules recurse without end on a fragment cycle
// and grow exponentially with fragments spread several times.
func checkDocument(doc *ast.Document, lim limits.Limits) error {
	fragments := map[string]*ast.FragmentDefinition{}
	for _, d := range doc.Definitions {
		if f, ok := d.(*ast.FragmentDefinition); ok && f.Name != nil {
			fragments[f.Name.Value] = f
		}
	}
	var selections int64
	var walk func(set *ast.SelectionSet, d int, stack map[string]bool) error
	walk = func(set *ast.SelectionSet, d int, stack map[string]bool) error {
		if set == nil {
			return nil
		}
		if int64(d) > lim.GraphQLDepth {
			return fhir.Invalid(fmt.Sprintf("GraphQL query too deep (limit %d)", lim.GraphQLDepth), "query")
		}
		for _, s := range set.Selections {
			if selections++; selections > lim.GraphQLSelections {
				return fhir.Invalid(fmt.Sprintf("GraphQL query too large (limit %d selections with fragments expanded)", lim.GraphQLSelections), "query")
			}
			var err error
			switch s := s.(type) {
			case *ast.Field:
				err = walk(s.SelectionSet, d+1, stack)
			case *ast.InlineFragment:
				err = walk(s.SelectionSet, d, stack)
			case *ast.FragmentSpread:
				if s.Name == nil {
					continue
				}
				name := s.Name.Value
				if stack[name] {
					return fhir.Invalid("GraphQL fragment "+name+" spreads itself", "query")
				}
				f, ok := fragments[name]
				if !ok {
					continue // validation names it
				}
				stack[name] = true
				err = walk(f.SelectionSet, d, stack)
				delete(stack, name)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range doc.Definitions {
		var err error
		switch d := d.(type) {
		case *ast.OperationDefinition:
			if d.Operation != ast.OperationTypeQuery {
				return fhir.Invalid("Only GraphQL queries are supported: write through the REST API", "query")
			}
			for _, v := range d.VariableDefinitions {
				if v == nil || v.Type == nil || v.Variable == nil {
					return fhir.Invalid("GraphQL variable without a type", "query")
				}
			}
			err = walk(d.SelectionSet, 1, map[string]bool{})
		case *ast.FragmentDefinition:
			// Unused fragments are validated too: check them alone.
			if d.Name != nil {
				err = walk(d.SelectionSet, 1, map[string]bool{d.Name.Value: true})
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// state is one query's: its caller, the service it reads through and how
// many reads it made.
type state struct {
	p        *principal.Principal
	svc      *fhirservice.Service
	maxReads int64
	reads    atomic.Int64
}

type stateKey struct{}

// resolver reads and searches through the FHIR service of the query
// (state.svc).
type resolver struct{}

// get runs a GET through the service for the query's caller and decodes its
// JSON answer.
func (r *resolver) get(ctx context.Context, rel string) (map[string]any, error) {
	st, _ := ctx.Value(stateKey{}).(*state)
	if st == nil {
		return nil, fhir.ErrUnauthorized
	}
	if st.reads.Add(1) > st.maxReads {
		return nil, fmt.Errorf("GraphQL query reads too many resources (limit %d reads and searches)", st.maxReads)
	}
	resp := st.svc.Do(ctx, st.p, &fhirservice.Request{Method: "GET", URL: rel, Accept: "application/fhir+json"})
	if resp.Err != nil {
		return nil, fieldError(resp.Err)
	}
	var m map[string]any
	if err := json.Unmarshal(resp.Body, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// fieldError is the error of a field as GraphQL shows it: the outcome's
// text ("Not found"), not the error code; internal errors say no more.
func fieldError(err error) error {
	var fe *fhir.Error
	if errors.As(err, &fe) {
		return errors.New(fe.Message)
	}
	return errors.New("Internal server error")
}

// read resolves T(id:).
func (r *resolver) read(typ string) graphql.FieldResolveFn {
	return func(p graphql.ResolveParams) (any, error) {
		id, _ := p.Args["id"].(string)
		if !fhir.ValidID(id) {
			return nil, fhir.ErrNotFound
		}
		return r.get(p.Context, typ+"/"+id)
	}
}

// search resolves TList(…): the arguments are the search's parameters
// (codes maps argument names back to parameter codes).
func (r *resolver) search(typ string, codes map[string]string) graphql.FieldResolveFn {
	return func(p graphql.ResolveParams) (any, error) {
		q := url.Values{}
		for name, v := range p.Args {
			code, ok := codes[name]
			if !ok {
				continue
			}
			switch v := v.(type) {
			case string:
				q.Add(code, v)
			case int:
				q.Add(code, strconv.Itoa(v))
			}
		}
		rel := typ
		if len(q) > 0 {
			rel += "?" + q.Encode()
		}
		b, err := r.get(p.Context, rel)
		if err != nil {
			return nil, err
		}
		entries, _ := b["entry"].([]any)
		out := make([]any, 0, len(entries))
		for _, e := range entries {
			if m, ok := e.(map[string]any); ok && m["resource"] != nil {
				out = append(out, m["resource"])
			}
		}
		return out, nil
	}
}

// reference resolves Reference.resource: the resource a relative reference
// ("Type/id") names, read as the caller; other references resolve to null.
func (r *resolver) reference(p graphql.ResolveParams) (any, error) {
	m, _ := p.Source.(map[string]any)
	ref, _ := m["reference"].(string)
	typ, id, ok := fhir.SplitReference(ref)
	if !ok || !fhir.KnownType(typ) || !fhir.ValidID(id) {
		return nil, nil
	}
	return r.get(p.Context, typ+"/"+id)
}
