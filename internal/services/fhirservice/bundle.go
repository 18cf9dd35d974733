package fhirservice

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
)

// Batch and transaction Bundles (POST to the FHIR base), as the reference's
// router runs them: each entry is one interaction run through Do, so it is
// authorized exactly like the same request on its own.
//
//   - batch: entries are independent; each gets its own answer, failures
//     included, in a batch-response.
//   - transaction: all entries or none, in one store transaction; the first
//     failing entry's error is the answer and nothing is kept. Entries whose
//     fullUrl is urn:uuid:… are created before the entries that refer to
//     them (in Bundle order otherwise), and every "urn:uuid:…" in a later
//     entry (references, the request url) is rewritten to the created
//     "Type/id".
//
// A PATCH entry carries its JSON Patch as a Binary resource whose data is the
// patch in base64 (the reference's convention); ifNoneExist makes a POST a
// conditional create and a url "Type?query" makes a PUT, PATCH or DELETE
// conditional, all run by Do as the same REST request (conditional.go);
// ifMatch makes a write conditional on a version.

// bundleRequest is the part of a Bundle that Bundle reads.
type bundleRequest struct {
	ResourceType string        `json:"resourceType"`
	Type         string        `json:"type"`
	Entry        []bundleEntry `json:"entry"`
}

type bundleEntry struct {
	FullURL  string          `json:"fullUrl"`
	Resource json.RawMessage `json:"resource"`
	Request  *struct {
		Method      string `json:"method"`
		URL         string `json:"url"`
		IfMatch     string `json:"ifMatch"`
		IfNoneExist string `json:"ifNoneExist"`
	} `json:"request"`
}

// responseEntry is one entry of a batch-response or transaction-response.
type responseEntry struct {
	FullURL  string          `json:"fullUrl,omitempty"`
	Resource json.RawMessage `json:"resource,omitempty"`
	Response entryResponse   `json:"response"`
}

type entryResponse struct {
	Status       string          `json:"status"`
	Location     string          `json:"location,omitempty"`
	ETag         string          `json:"etag,omitempty"`
	LastModified string          `json:"lastModified,omitempty"`
	Outcome      json.RawMessage `json:"outcome,omitempty"`
}

// urnUUID finds the urn:uuid: references of a transaction.
var urnUUID = regexp.MustCompile(`urn:uuid:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

// parseBundle reads a batch or transaction Bundle and checks its shape: a
// Bundle of type batch or transaction with at most maxEntries entries.
func parseBundle(body []byte, maxEntries int64) (*bundleRequest, error) {
	var b bundleRequest
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fhir.Invalid("Content could not be parsed")
	}
	switch {
	case b.ResourceType != "Bundle":
		return nil, fhir.Invalid("Not a Bundle", "resourceType")
	case b.Type == "":
		return nil, fhir.Invalid("Missing bundle type", "type")
	case b.Type != "batch" && b.Type != "transaction":
		return nil, fhir.Invalid("Unrecognized bundle type: only batch and transaction Bundles are processed", "type")
	case b.Entry == nil:
		return nil, fhir.Invalid("Missing bundle entry", "entry")
	case int64(len(b.Entry)) > maxEntries:
		return nil, fhir.Invalid(fmt.Sprintf("Too many bundle entries (limit %d)", maxEntries), "entry")
	}
	return &b, nil
}

// Bundle runs a batch or transaction Bundle for p and answers the response
// Bundle (or, for a failed transaction, the failing entry's error).
func (s *Service) Bundle(ctx context.Context, p *principal.Principal, body []byte) *Response {
	if p == nil {
		return ErrorResponse(fhir.ErrUnauthorized)
	}
	b, err := parseBundle(body, s.lim.BundleEntries)
	if err != nil {
		return ErrorResponse(err)
	}
	run := &bundleRun{svc: s, p: p, bundle: b, ids: map[string]string{}}
	var out []responseEntry
	if b.Type == "batch" {
		out = make([]responseEntry, len(b.Entry))
		for i := range b.Entry {
			out[i] = run.entry(ctx, s, i)
		}
	} else {
		order, err := transactionOrder(b.Entry)
		if err != nil {
			return ErrorResponse(err)
		}
		err = s.InTx(ctx, func(tx *Service) error {
			out = make([]responseEntry, len(b.Entry))
			run.ids, run.failed = map[string]string{}, nil
			for _, i := range order {
				e := run.entry(ctx, tx, i)
				if run.failed != nil {
					return run.failed
				}
				out[i] = e
			}
			return nil
		})
		if err != nil {
			return ErrorResponse(err)
		}
	}
	resp, err := jsonResponse(200, map[string]any{"resourceType": "Bundle", "type": b.Type + "-response", "entry": out})
	if err != nil {
		return ErrorResponse(err)
	}
	return resp
}

// bundleRun is the state of one Bundle: the urn:uuid ids resolved so far and,
// in a transaction, the first failure.
type bundleRun struct {
	svc    *Service
	p      *principal.Principal
	bundle *bundleRequest
	// ids maps a urn:uuid fullUrl to the "Type/id" it became.
	ids    map[string]string
	failed error
}

// entry runs entry i through svc (the service, or its transaction) and
// answers its response entry. In a transaction a failure is also kept in
// run.failed, naming the entry.
func (run *bundleRun) entry(ctx context.Context, svc *Service, i int) responseEntry {
	e := run.bundle.Entry[i]
	req, err := run.request(e)
	var resp *Response
	if err != nil {
		resp = ErrorResponse(err)
	} else {
		resp = svc.Do(ctx, run.p, req)
	}
	if resp.Err != nil && run.bundle.Type == "transaction" {
		run.failed = entryError(resp.Err, i)
	}
	out := responseEntry{Response: entryResponse{Status: strconv.Itoa(resp.Status), Location: resp.Location,
		ETag: resp.ETag, LastModified: resp.LastModified}}
	switch {
	case resp.Err != nil || resp.Outcome != nil:
		out.Response.Outcome = resp.Body
	case json.Valid(resp.Body):
		out.Resource = resp.Body
		outcome := fhir.AllOK()
		if resp.Status == 201 {
			outcome.ID = "created"
			outcome.Issue[0].Details.Text = "Created"
		}
		out.Response.Outcome, _ = json.Marshal(outcome)
		var created struct{ ResourceType, ID string }
		if json.Unmarshal(resp.Body, &created) == nil && created.ID != "" && created.ResourceType != "Bundle" {
			if urnUUID.MatchString(e.FullURL) && e.FullURL == urnUUID.FindString(e.FullURL) {
				run.ids[e.FullURL] = created.ResourceType + "/" + created.ID
			}
			out.FullURL = run.svc.base + created.ResourceType + "/" + created.ID
		}
	}
	return out
}

// entryError is a transaction entry's error, naming the entry.
func entryError(err error, i int) error {
	var fe *fhir.Error
	if !errors.As(err, &fe) {
		return err
	}
	c := *fe
	c.Expression = []string{fmt.Sprintf("Bundle.entry[%d]", i)}
	if fe.Outcome == nil {
		c.Message = fmt.Sprintf("Bundle.entry[%d]: %s", i, fe.Message)
	} else if fe.Code == fhir.EInvalid {
		// A resource that is not valid FHIR: each issue keeps its
		// expression (Patient.birthDate) and says which entry it is in.
		o := *fe.Outcome
		o.Issue = append([]fhir.Issue(nil), o.Issue...)
		for k, is := range o.Issue {
			if is.Details != nil {
				is.Details = &fhir.IssueDetails{Text: fmt.Sprintf("Bundle.entry[%d]: %s", i, is.Details.Text)}
			}
			o.Issue[k] = is
		}
		c.Outcome = &o
	}
	return &c
}

// request builds the Request of an entry, with the urn:uuid references
// resolved so far rewritten.
func (run *bundleRun) request(e bundleEntry) (*Request, error) {
	if e.Request == nil {
		return nil, fhir.Invalid("Missing entry.request", "request")
	}
	method := strings.ToUpper(strings.TrimSpace(e.Request.Method))
	switch method {
	case "":
		return nil, fhir.Invalid("Missing entry.request.method", "request.method")
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE":
	default:
		return nil, fhir.Invalid("Unsupported entry.request.method: "+e.Request.Method, "request.method")
	}
	if method == "HEAD" {
		method = "GET"
	}
	if e.Request.URL == "" {
		return nil, fhir.Invalid("Missing entry.request.url", "request.url")
	}
	target := run.rewriteString(e.Request.URL, false)
	// An absolute URL under this server's FHIR base is taken as relative.
	target = strings.TrimPrefix(target, run.svc.base)
	if u, err := url.Parse(target); err != nil || u.Scheme != "" || u.Host != "" {
		return nil, fhir.Invalid("entry.request.url must be relative to the FHIR base", "request.url")
	}
	req := &Request{Method: method, URL: target, IfMatch: e.Request.IfMatch, Accept: "application/fhir+json"}
	hasResource := len(e.Resource) > 0 && !bytes.Equal(bytes.TrimSpace(e.Resource), []byte("null"))
	switch method {
	case "POST", "PUT":
		if !hasResource {
			if method == "POST" && strings.Contains(target, "/_search") {
				break
			}
			return nil, fhir.Invalid("Missing entry.resource", "resource")
		}
		body, err := run.rewrite(e.Resource)
		if err != nil {
			return nil, err
		}
		req.Body, req.ContentType = body, FHIRJSON
		if method == "POST" {
			req.IfNoneExist = run.rewriteString(e.Request.IfNoneExist, false)
		}
	case "PATCH":
		patch, err := patchBody(e.Resource)
		if err != nil {
			return nil, err
		}
		if patch, err = run.rewrite(patch); err != nil {
			return nil, err
		}
		req.Body, req.ContentType = patch, mediaJSONPatch
	}
	return req, nil
}

// patchBody is a PATCH entry's JSON Patch: the data of its Binary resource.
func patchBody(resource json.RawMessage) ([]byte, error) {
	var bin struct {
		ResourceType string `json:"resourceType"`
		Data         string `json:"data"`
	}
	if len(resource) == 0 || json.Unmarshal(resource, &bin) != nil {
		return nil, fhir.Invalid("Missing entry.resource", "resource")
	}
	if bin.ResourceType != "Binary" {
		return nil, fhir.Invalid("Patch resource must be a Binary", "resource.resourceType")
	}
	data, err := base64.StdEncoding.DecodeString(bin.Data)
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return nil, fhir.Invalid("Missing entry.resource.data: the JSON Patch in base64", "resource.data")
	}
	if t := bytes.TrimSpace(data); t[0] != '[' {
		return nil, fhir.Invalid("Patch body must be an array", "resource.data")
	}
	return data, nil
}

// rewrite replaces the resolved urn:uuid references in a JSON value: every
// string that contains one ("urn:uuid:…" in a reference, a url, a narrative)
// gets the "Type/id" it became; a resource id gets the id alone.
func (run *bundleRun) rewrite(raw json.RawMessage) ([]byte, error) {
	if len(run.ids) == 0 || !urnUUID.Match(raw) {
		return raw, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fhir.Invalid("Content could not be parsed", "resource")
	}
	if m, ok := v.(map[string]any); ok {
		if id, ok := m["id"].(string); ok {
			m["id"] = run.rewriteString(id, true)
		}
	}
	v = run.rewriteValue(v)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func (run *bundleRun) rewriteValue(v any) any {
	switch t := v.(type) {
	case string:
		return run.rewriteString(t, false)
	case []any:
		for i := range t {
			t[i] = run.rewriteValue(t[i])
		}
	case map[string]any:
		for k, x := range t {
			t[k] = run.rewriteValue(x)
		}
	}
	return v
}

func (run *bundleRun) rewriteString(s string, idOnly bool) string {
	if len(run.ids) == 0 || !strings.Contains(s, "urn:uuid:") {
		return s
	}
	return urnUUID.ReplaceAllStringFunc(s, func(urn string) string {
		ref, ok := run.ids[urn]
		if !ok {
			return urn
		}
		if idOnly {
			_, id, _ := strings.Cut(ref, "/")
			return id
		}
		return ref
	})
}

// transactionOrder is the order a transaction's entries run in: Bundle
// order, except that an entry referring to another entry's urn:uuid fullUrl
// runs after that entry. References that go round in a circle cannot be
// resolved (the store checks references on write): 400.
func transactionOrder(entries []bundleEntry) ([]int, error) {
	owner := map[string]int{}
	for i, e := range entries {
		if u := urnUUID.FindString(e.FullURL); u != "" && u == e.FullURL {
			if _, dup := owner[u]; dup {
				return nil, fhir.Invalid("Duplicate fullUrl "+u, fmt.Sprintf("Bundle.entry[%d].fullUrl", i))
			}
			owner[u] = i
		}
	}
	deps := make([][]int, len(entries))
	pending := make([]int, len(entries))
	waiting := make([][]int, len(entries))
	for i, e := range entries {
		seen := map[int]bool{}
		scan := func(b []byte) {
			for _, u := range urnUUID.FindAll(b, -1) {
				if j, ok := owner[string(u)]; ok && j != i && !seen[j] {
					seen[j] = true
					deps[i] = append(deps[i], j)
				}
			}
		}
		scan(e.Resource)
		if e.Request != nil {
			scan([]byte(e.Request.URL))
			scan([]byte(e.Request.IfNoneExist))
		}
		pending[i] = len(deps[i])
		for _, j := range deps[i] {
			waiting[j] = append(waiting[j], i)
		}
	}
	// Kahn's algorithm, always taking the lowest ready index.
	ready := &intHeap{}
	for i := range entries {
		if pending[i] == 0 {
			heap.Push(ready, i)
		}
	}
	order := make([]int, 0, len(entries))
	for ready.Len() > 0 {
		next := heap.Pop(ready).(int)
		order = append(order, next)
		for _, w := range waiting[next] {
			if pending[w]--; pending[w] == 0 {
				heap.Push(ready, w)
			}
		}
	}
	if len(order) < len(entries) {
		return nil, fhir.Invalid("The entries' urn:uuid references go round in a circle", "entry")
	}
	return order, nil
}

// intHeap is a min-heap of entry indexes.
type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
