package fhirservice

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/mediatype"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// FHIRJSON is the content type of FHIR JSON answers.
const FHIRJSON = mediatype.FHIRJSON

// httpDate is the format of Last-Modified (RFC 7231 IMF-fixdate).
const httpDate = "Mon, 02 Jan 2006 15:04:05 GMT"

// Media types the dispatcher tells apart.
const (
	mediaJSONPatch = "application/json-patch+json"
	mediaForm      = "application/x-www-form-urlencoded"
)

// Request is one FHIR REST interaction as HTTP would carry it, without HTTP.
type Request struct {
	// Method is GET, POST, PUT, PATCH or DELETE.
	Method string
	// URL is relative to the FHIR base and percent-encoded as in a URL:
	// "Patient", "Patient?name=x", "Patient/1", "Patient/1/_history",
	// "Patient/1/_history/2", "Patient/_search". A leading "/" or
	// "fhir/R4/" is ignored.
	URL string
	// Body is the body of a POST, PUT or PATCH.
	Body []byte
	// ContentType is Body's: JSON (application/fhir+json or any JSON type)
	// for a resource, application/json-patch+json for PATCH,
	// application/x-www-form-urlencoded for a POST _search, anything for a
	// raw Binary upload. A missing one is 415 where JSON is needed.
	ContentType string
	// IfMatch is an If-Match value (W/"vid" or "vid"): an update, patch or
	// delete then applies only to that version (412 otherwise).
	IfMatch string
	// IfNoneExist is an If-None-Exist value (a search query of the type,
	// "identifier=x|1"): a create then happens only when nothing matches
	// (conditional.go). Other interactions ignore it, as the reference does.
	IfNoneExist string
	// Accept decides how a Binary is read: its raw content, unless Accept
	// names JSON (application/fhir+json or application/json).
	Accept string
}

// Response is the answer to a Request.
type Response struct {
	Status int
	// Body is FHIR JSON (a resource, a Bundle or an OperationOutcome), or a
	// Binary's raw content.
	Body        []byte
	ContentType string
	// ETag is W/"<versionId>", LastModified an HTTP date and Location the
	// new version's URL (created resources), when they apply.
	ETag, LastModified, Location string
	// Err is the error the answer reports, nil on success; Body is then its
	// OperationOutcome. HTTP answers it through httpx (which adds request
	// ids and logs server errors).
	Err error
	// Outcome is set when Body is a successful OperationOutcome (a
	// delete's), for HTTP to add its request ids to.
	Outcome *fhir.OperationOutcome
}

// BodyLimit is the largest body Do accepts for a request: the raw-module
// limit for a raw Binary upload, the JSON limit otherwise. HTTP reads bodies
// with it.
func (s *Service) BodyLimit(method, rawURL, contentType string) int64 {
	if strings.EqualFold(method, "POST") && !mediatype.IsJSON(mediatype.Of(contentType)) {
		if segs, _, err := splitURL(rawURL); err == nil && len(segs) == 1 && segs[0] == "Binary" {
			return s.lim.ModuleBytes
		}
	}
	return s.lim.JSONBodyBytes
}

// Do runs one interaction for p and answers it: the one router of the FHIR
// REST interactions, used by the /fhir/R4 handlers, by bots' in-process calls
// and by Bundle entries. Operations ($execute, $deploy, …) are not routed
// here: a bot's call cannot start a bot. Do never fails: errors are answers.
func (s *Service) Do(ctx context.Context, p *principal.Principal, req *Request) *Response {
	resp, err := s.do(ctx, p, req)
	if err != nil {
		return ErrorResponse(err)
	}
	return resp
}

// ErrorResponse is the answer that reports err.
func ErrorResponse(err error) *Response {
	body, _ := json.Marshal(fhir.OutcomeFor(err))
	return &Response{Status: fhir.ErrorCodeOf(err).Status(), Body: body, ContentType: FHIRJSON, Err: err}
}

func (s *Service) do(ctx context.Context, p *principal.Principal, req *Request) (*Response, error) {
	if p == nil {
		return nil, fhir.ErrUnauthorized
	}
	segs, rawQuery, err := splitURL(req.URL)
	if err != nil {
		return nil, err
	}
	if int64(len(req.Body)) > s.BodyLimit(req.Method, req.URL, req.ContentType) {
		return nil, fhir.Errorf(fhir.ETooLarge, "Request body too large (limit %d bytes)", s.BodyLimit(req.Method, req.URL, req.ContentType))
	}
	if len(segs) == 0 {
		return nil, fhir.ErrNotFound
	}
	typ := segs[0]
	if !fhir.KnownType(typ) {
		return nil, fhir.Errorf(fhir.ENotFound, "Unknown resource type: %s", typ)
	}
	method := strings.ToUpper(req.Method)
	if definitions.Serves(typ) {
		if !projectTerminology[typ] {
			return s.doDefinition(typ, segs, method, rawQuery, req)
		}
		if resp, handled, err := s.doTerminology(ctx, p, typ, segs, method, rawQuery, req); handled {
			return resp, err
		}
	}
	switch {
	case len(segs) == 1 && method == "GET":
		return s.doSearch(ctx, p, typ, rawQuery)
	case len(segs) == 2 && segs[1] == "_search" && method == "POST":
		return s.doSearch(ctx, p, typ, searchQuery(rawQuery, req))
	case len(segs) == 1 && method == "POST":
		return s.doCreate(ctx, p, typ, req, rawQuery)
	case len(segs) == 2 && method == "GET":
		rec, err := s.Read(ctx, p, typ, segs[1])
		if err != nil {
			return nil, err
		}
		if typ == "Binary" && !wantsJSON(req.Accept) {
			return binaryContent(rec)
		}
		return recordResponse(200, rec, "")
	case len(segs) == 1 && method == "PUT":
		return s.doUpdateWhere(ctx, p, typ, req, rawQuery)
	case len(segs) == 1 && method == "PATCH":
		return s.doPatchWhere(ctx, p, typ, req, rawQuery)
	case len(segs) == 1 && method == "DELETE":
		if err := s.DeleteWhere(ctx, p, typ, rawQuery, ifMatch(req.IfMatch)); err != nil {
			return nil, err
		}
		return outcomeResponse(200, fhir.AllOK()), nil
	case len(segs) == 2 && method == "PUT":
		if err := authorizeID(p, typ, segs[1], OpUpdate); err != nil {
			return nil, err
		}
		res, err := jsonBody(req, "")
		if err != nil {
			return nil, err
		}
		rec, err := s.Update(ctx, p, typ, segs[1], res, ifMatch(req.IfMatch))
		if err != nil {
			return nil, err
		}
		return recordResponse(200, rec, "")
	case len(segs) == 2 && method == "PATCH":
		if err := authorizeID(p, typ, segs[1], OpUpdate); err != nil {
			return nil, err
		}
		ops, err := requestPatch(req)
		if err != nil {
			return nil, err
		}
		rec, err := s.Patch(ctx, p, typ, segs[1], ops, ifMatch(req.IfMatch))
		if err != nil {
			return nil, err
		}
		return recordResponse(200, rec, "")
	case len(segs) == 2 && method == "DELETE":
		if err := s.Delete(ctx, p, typ, segs[1], ifMatch(req.IfMatch)); err != nil {
			return nil, err
		}
		return outcomeResponse(200, fhir.AllOK()), nil
	case len(segs) == 3 && segs[2] == "_history" && method == "GET":
		return s.doHistory(ctx, p, typ, segs[1], rawQuery)
	case len(segs) == 4 && segs[2] == "_history" && method == "GET":
		rec, err := s.VRead(ctx, p, typ, segs[1], segs[3])
		if err != nil {
			return nil, err
		}
		return recordResponse(200, rec, "")
	}
	return nil, fhir.ErrNotFound
}

// searchQuery is the query of a search: the URL's, and a POST's form body.
func searchQuery(rawQuery string, req *Request) string {
	if mediatype.Of(req.ContentType) != mediaForm || len(req.Body) == 0 {
		return rawQuery
	}
	if rawQuery != "" {
		rawQuery += "&"
	}
	return rawQuery + string(req.Body)
}

// splitURL splits a relative FHIR URL into its decoded path segments and
// its raw query.
func splitURL(raw string) ([]string, string, error) {
	path, query, _ := strings.Cut(raw, "?")
	path, _, _ = strings.Cut(path, "#")
	path = strings.TrimPrefix(path, "/")
	path = strings.TrimPrefix(path, "fhir/R4/")
	if path == "" || path == "fhir/R4" {
		return nil, query, nil
	}
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		dec, err := url.PathUnescape(seg)
		if err != nil || dec == "" {
			return nil, "", fhir.ErrNotFound
		}
		segs[i] = dec
	}
	return segs, query, nil
}

func (s *Service) doCreate(ctx context.Context, p *principal.Principal, typ string, req *Request, rawQuery string) (*Response, error) {
	if err := Authorize(p, typ, OpCreate); err != nil {
		return nil, err
	}
	var res fhir.Resource
	var err error
	if typ == "Binary" && !mediatype.IsJSON(mediatype.Of(req.ContentType)) {
		res = rawBinary(req, rawQuery)
	} else if res, err = jsonBody(req, typ); err != nil {
		return nil, err
	}
	if strings.TrimSpace(req.IfNoneExist) != "" {
		rec, created, err := s.CreateIfNoneExist(ctx, p, res, req.IfNoneExist)
		if err != nil {
			return nil, err
		}
		return s.writtenResponse(rec, created)
	}
	rec, err := s.Create(ctx, p, res)
	if err != nil {
		return nil, err
	}
	return s.writtenResponse(rec, true)
}

// writtenResponse answers a write: 201 with a Location for a created
// resource, 200 otherwise.
func (s *Service) writtenResponse(rec *store.Record, created bool) (*Response, error) {
	if !created {
		return recordResponse(200, rec, "")
	}
	return recordResponse(201, rec, s.base+rec.ResourceType+"/"+rec.ID+"/_history/"+rec.VersionID)
}

// doUpdateWhere is a conditional update (PUT <type>?<query>).
func (s *Service) doUpdateWhere(ctx context.Context, p *principal.Principal, typ string, req *Request, rawQuery string) (*Response, error) {
	if err := Authorize(p, typ, OpUpdate); err != nil {
		return nil, err
	}
	res, err := jsonBody(req, typ)
	if err != nil {
		return nil, err
	}
	rec, created, err := s.UpdateWhere(ctx, p, typ, rawQuery, res, ifMatch(req.IfMatch))
	if err != nil {
		return nil, err
	}
	return s.writtenResponse(rec, created)
}

// doPatchWhere is a conditional patch (PATCH <type>?<query>).
func (s *Service) doPatchWhere(ctx context.Context, p *principal.Principal, typ string, req *Request, rawQuery string) (*Response, error) {
	if err := Authorize(p, typ, OpUpdate); err != nil {
		return nil, err
	}
	ops, err := requestPatch(req)
	if err != nil {
		return nil, err
	}
	rec, err := s.PatchWhere(ctx, p, typ, rawQuery, ops, ifMatch(req.IfMatch))
	if err != nil {
		return nil, err
	}
	return recordResponse(200, rec, "")
}

// requestPatch is a PATCH request's JSON Patch.
func requestPatch(req *Request) (jsonpatch.Patch, error) {
	if mediatype.Of(req.ContentType) != mediaJSONPatch {
		return nil, fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type")
	}
	return DecodePatch(req.Body)
}

// rawBinary wraps a non-JSON upload in a Binary resource.
func rawBinary(req *Request, rawQuery string) fhir.Resource {
	ct := req.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	res := fhir.Resource{"resourceType": "Binary", "contentType": ct, "data": base64.StdEncoding.EncodeToString(req.Body)}
	if q, err := url.ParseQuery(rawQuery); err == nil && q.Get("_filename") != "" {
		res["meta"] = map[string]any{"tag": []any{map[string]any{"system": "https://sandbot.dev/filename", "code": q.Get("_filename")}}}
	}
	return res
}

// jsonBody parses a JSON resource body; typ, when set, is the type it must have.
func jsonBody(req *Request, typ string) (fhir.Resource, error) {
	if !mediatype.IsJSON(mediatype.Of(req.ContentType)) {
		return nil, fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type")
	}
	return parseBody(req.Body, typ)
}

func (s *Service) doSearch(ctx context.Context, p *principal.Principal, typ, rawQuery string) (*Response, error) {
	if err := Authorize(p, typ, OpRead); err != nil {
		return nil, err
	}
	req, err := fhir.ParseSearch(typ, rawQuery)
	if err != nil {
		return nil, err
	}
	res, err := s.Search(ctx, p, req)
	if err != nil {
		return nil, err
	}
	b := fhir.Bundle{ResourceType: "Bundle", Type: "searchset", Total: res.Total}
	for i := range res.Records {
		rec := &res.Records[i]
		b.Entry = append(b.Entry, fhir.BundleEntry{
			FullURL:  s.base + typ + "/" + rec.ID,
			Search:   &fhir.EntrySearch{Mode: "match"},
			Resource: json.RawMessage(rec.JSON),
		})
	}
	inc, truncated, err := s.includes(ctx, p, req, res.Records)
	if err != nil {
		return nil, err
	}
	b.Entry = append(b.Entry, s.includeEntries(inc, truncated)...)
	b.Link = SearchLinks(s.base, req, len(res.Records), res.More)
	return jsonResponse(200, b)
}

// SearchLinks builds a searchset's self/first/next/previous links under the
// FHIR base as the reference does: first only when there are results, next
// when another page exists (more), previous after the first page; n is the
// page's size.
func SearchLinks(base string, req *fhir.SearchRequest, n int, more bool) []fhir.BundleLink {
	link := func(offset int) string { return base + req.ResourceType + "?" + req.Query(offset) }
	out := []fhir.BundleLink{{Relation: "self", URL: link(req.Offset)}}
	if req.Count > 0 && (n > 0 || req.Offset > 0) {
		out = append(out, fhir.BundleLink{Relation: "first", URL: link(0)})
		if more {
			out = append(out, fhir.BundleLink{Relation: "next", URL: link(req.Offset + req.Count)})
		}
		if req.Offset > 0 {
			out = append(out, fhir.BundleLink{Relation: "previous", URL: link(max(0, req.Offset-req.Count))})
		}
	}
	return out
}

func (s *Service) doHistory(ctx context.Context, p *principal.Principal, typ, id, rawQuery string) (*Response, error) {
	if err := authorizeID(p, typ, id, OpRead); err != nil {
		return nil, err
	}
	paging, err := fhir.ParseSearch(typ, "")
	if err != nil {
		return nil, err
	}
	if q, err := url.ParseQuery(rawQuery); err == nil && q.Get("_count") != "" {
		pq := "_count=" + url.QueryEscape(q.Get("_count"))
		if o := q.Get("_offset"); o != "" {
			pq += "&_offset=" + url.QueryEscape(o)
		}
		if paging, err = fhir.ParseSearch(typ, pq); err != nil {
			return nil, err
		}
	}
	recs, err := s.History(ctx, p, typ, id, paging.Count, paging.Offset)
	if err != nil {
		return nil, err
	}
	b := fhir.Bundle{ResourceType: "Bundle", Type: "history",
		Link: []fhir.BundleLink{{Relation: "self", URL: s.base + typ + "/" + id + "/_history"}}}
	for i := range recs {
		rec := &recs[i]
		e := fhir.BundleEntry{FullURL: s.base + typ + "/" + rec.ID,
			Response: &fhir.EntryResponse{Status: "200", LastModified: rec.LastUpdated.Format(fhir.TimeFormat), Etag: `W/"` + rec.VersionID + `"`}}
		if rec.Deleted {
			e.Request = &fhir.EntryRequest{Method: "DELETE", URL: typ + "/" + rec.ID}
			e.Response.Status = "410"
		} else {
			e.Resource = json.RawMessage(rec.JSON)
		}
		b.Entry = append(b.Entry, e)
	}
	return jsonResponse(200, b)
}

// recordResponse answers with a resource and its version headers.
func recordResponse(status int, rec *store.Record, location string) (*Response, error) {
	return &Response{Status: status, Body: rec.JSON, ContentType: FHIRJSON, ETag: `W/"` + rec.VersionID + `"`,
		LastModified: rec.LastUpdated.UTC().Format(httpDate), Location: location}, nil
}

// binaryContent answers with a Binary's raw content.
func binaryContent(rec *store.Record) (*Response, error) {
	res, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	data, err := base64.StdEncoding.DecodeString(res.String("data"))
	if err != nil {
		return nil, err
	}
	ct := res.String("contentType")
	if ct == "" {
		ct = "application/octet-stream"
	}
	return &Response{Status: 200, Body: data, ContentType: ct, ETag: `W/"` + rec.VersionID + `"`}, nil
}

func jsonResponse(status int, v any) (*Response, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return &Response{Status: status, Body: bytes.TrimRight(buf.Bytes(), "\n"), ContentType: FHIRJSON}, nil
}

func outcomeResponse(status int, o *fhir.OperationOutcome) *Response {
	r, err := jsonResponse(status, o)
	if err != nil {
		return ErrorResponse(err)
	}
	r.Outcome = o
	return r
}

// ifMatch extracts the version id of an If-Match value (W/"vid" or "vid").
func ifMatch(v string) string {
	v = strings.TrimSpace(v)
	v = strings.TrimPrefix(v, "W/")
	return strings.Trim(v, `"`)
}

// wantsJSON reports whether an Accept value asks for the FHIR JSON of a
// Binary rather than its content.
func wantsJSON(accept string) bool {
	return strings.Contains(accept, "fhir+json") || strings.Contains(accept, "application/json")
}
