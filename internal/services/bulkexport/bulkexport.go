// Package bulkexport runs FHIR Bulk Data exports (Bulk Data Access 2.0,
// $export at the system, Patient and Group levels) as jobs of the job
// engine: the request is checked and accepted as an AsyncJob, and a worker
// in any process reads, as the caller (resolved again when the job runs),
// every resource the export asks for, through the FHIR service's search
// (the caller's project, access policy and hidden fields, exactly as a
// search would), and writes them as NDJSON files (Binary resources of the
// caller's project) that the manifest lists. It knows nothing of HTTP.
package bulkexport

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/internal/services/jobs"
)

// The job kind and queue of exports.
const (
	jobKind  = "bulk-export"
	jobQueue = "bulk_export"
)

// Bounds of one export's output: a file holds at most this many resources
// and about this many bytes; a search page reads pageSize at a time.
const (
	FileResources = 5000
	FileBytes     = 4 << 20
	pageSize      = 1000
	chunk         = 100
)

// Levels of an export.
const (
	System  = "system"
	Patient = "patient"
	Group   = "group"
)

// Config configures the service.
type Config struct {
	FHIR *fhirservice.Service
	Jobs *jobs.Engine
	// Resume resolves the caller again when the job runs, so that a
	// revoked login or membership fails it.
	Resume func(context.Context, principal.Credentials) (*principal.Principal, error)
	Log    *slog.Logger
}

// Service starts and runs exports.
type Service struct {
	cfg Config
}

// New builds the service and registers its job with the engine.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg}
	cfg.Jobs.Handle(jobKind, jobQueue, s.run)
	return s
}

// Request is an export as asked: its level (and Group), and its
// parameters as the query or a Parameters body gave them.
type Request struct {
	Level   string
	GroupID string
	// Params are _type, _since, _typeFilter and _outputFormat.
	Params url.Values
	// URL is the request's URL, which the manifest repeats.
	URL string
}

// export is an export's job payload.
type export struct {
	Caller      principal.Credentials `json:"caller"`
	Level       string                `json:"level"`
	GroupID     string                `json:"group,omitempty"`
	Types       []string              `json:"types,omitempty"`
	Since       string                `json:"since,omitempty"`
	TypeFilters map[string][]string   `json:"typeFilters,omitempty"`
}

// Start checks an export and accepts it as a job, whose id it answers.
func (s *Service) Start(ctx context.Context, p *principal.Principal, req Request) (string, error) {
	e := export{Caller: principal.CredentialsOf(p), Level: req.Level, GroupID: req.GroupID}
	switch req.Level {
	case System, Patient:
	case Group:
		if !fhir.ValidID(req.GroupID) {
			return "", fhir.ErrNotFound
		}
		if _, err := s.cfg.FHIR.Read(ctx, p, "Group", req.GroupID); err != nil {
			return "", err
		}
	default:
		return "", fhir.Invalid("Unknown export level", "level")
	}
	for name := range req.Params {
		switch name {
		case "_type", "_since", "_typeFilter", "_outputFormat":
		default:
			return "", fhir.Invalid("Unsupported $export parameter: "+name, name)
		}
	}
	if f := req.Params.Get("_outputFormat"); f != "" && f != "application/fhir+ndjson" && f != "application/ndjson" && f != "ndjson" {
		return "", fhir.Invalid("Unsupported _outputFormat: "+f+" (application/fhir+ndjson)", "_outputFormat")
	}
	for _, list := range req.Params["_type"] {
		for _, t := range strings.Split(list, ",") {
			t = strings.TrimSpace(t)
			if !exportable(t) {
				return "", fhir.Invalid("_type: "+t+" is not a type this server exports", "_type")
			}
			if !slices.Contains(e.Types, t) {
				e.Types = append(e.Types, t)
			}
		}
	}
	if since := req.Params.Get("_since"); since != "" {
		if _, err := time.Parse(time.RFC3339Nano, since); err != nil {
			return "", fhir.Invalid("_since must be an instant, such as 2026-01-01T00:00:00Z", "_since")
		}
		e.Since = since
	}
	for _, f := range req.Params["_typeFilter"] {
		typ, query, ok := strings.Cut(f, "?")
		if !ok || !exportable(typ) {
			return "", fhir.Invalid("_typeFilter must be Type?search, such as Observation?code=8302-2", "_typeFilter")
		}
		sreq, err := fhir.ParseSearch(typ, query)
		if err != nil {
			return "", err
		}
		if len(sreq.Includes) > 0 || len(sreq.Sort) > 0 || req.Params.Has("_count") {
			return "", fhir.Invalid("_typeFilter may only filter", "_typeFilter")
		}
		if e.TypeFilters == nil {
			e.TypeFilters = map[string][]string{}
		}
		e.TypeFilters[typ] = append(e.TypeFilters[typ], query)
	}
	payload, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	job, err := s.cfg.Jobs.Submit(ctx, p, jobKind, req.URL, payload)
	if err != nil {
		return "", err
	}
	return job.ID, nil
}

// exportable reports whether typ is a type exports include: a stored type
// (not the definitions, served from the binary), not one only super admins
// see, and not Binary (files, not records; exports are written as Binaries).
func exportable(typ string) bool {
	return fhir.KnownType(typ) && !definitions.Serves(typ) && !fhirservice.SuperAdminOnly(typ) && typ != "Binary" &&
		typ != "Bundle" && typ != "Parameters" && typ != "OperationOutcome" && typ != "CapabilityStatement"
}

// patientTypes are the types of a Patient-level export: Patient, and every
// type with a patient search parameter that may point to a Patient.
func patientTypes() []string {
	out := []string{"Patient"}
	for _, t := range fhir.KnownTypeNames() {
		if p := fhir.LookupParam(t, "patient"); p != nil && p.Type == fhir.ReferenceParam && t != "Patient" && exportable(t) &&
			(len(p.Target) == 0 || slices.Contains(p.Target, "Patient")) {
			out = append(out, t)
		}
	}
	return out
}

// run is the job: every type of the export, page by page, into files.
func (s *Service) run(ctx context.Context, job *jobs.Job) (jobs.Outcome, error) {
	var e export
	if err := json.Unmarshal(job.Payload, &e); err != nil {
		return jobs.ErrorOutcome(fhir.Invalid("The export's request cannot be read")), nil
	}
	p, err := s.cfg.Resume(ctx, e.Caller)
	if err != nil {
		if fhir.IsCode(err, fhir.EUnauthorized) {
			return jobs.ErrorOutcome(fhir.Errorf(fhir.EUnauthorized, "The export's requester is no longer authorized")), nil
		}
		return jobs.Outcome{}, err
	}
	types := e.Types
	if len(types) == 0 {
		if e.Level == System {
			for _, t := range fhir.KnownTypeNames() {
				if exportable(t) {
					types = append(types, t)
				}
			}
		} else {
			types = patientTypes()
		}
	} else if e.Level != System {
		allowed := patientTypes()
		types = slices.DeleteFunc(slices.Clone(types), func(t string) bool { return !slices.Contains(allowed, t) })
	}
	sort.Strings(types)
	// The patients of a Group export.
	var members []string
	if e.Level == Group {
		g, err := s.cfg.FHIR.Read(ctx, p, "Group", e.GroupID)
		if err != nil {
			return jobs.ErrorOutcome(err), nil
		}
		res, err := g.Resource()
		if err != nil {
			return jobs.Outcome{}, err
		}
		members = groupPatients(res)
	}
	w := &writer{s: s, ctx: ctx, p: p}
	for _, typ := range types {
		var queries []string
		switch {
		case e.Level == Group && typ == "Patient":
			for _, ids := range chunks(members) {
				queries = append(queries, "_id="+strings.Join(ids, ","))
			}
		case e.Level == Group:
			for _, ids := range chunks(members) {
				refs := make([]string, len(ids))
				for i, id := range ids {
					refs[i] = "Patient/" + id
				}
				queries = append(queries, "patient="+strings.Join(refs, ","))
			}
		case e.Level == Patient && typ != "Patient":
			queries = []string{"patient:missing=false"}
		default:
			queries = []string{""}
		}
		if filters := e.TypeFilters[typ]; len(filters) > 0 {
			var combined []string
			for _, q := range queries {
				for _, f := range filters {
					combined = append(combined, strings.Trim(q+"&"+f, "&"))
				}
			}
			queries = combined
		}
		if err := w.export(typ, queries, e.Since); err != nil {
			if ctx.Err() != nil {
				return jobs.Outcome{}, ctx.Err()
			}
			if fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) {
				return jobs.Outcome{}, err
			}
			w.errors = append(w.errors, fmt.Sprintf("%s: %s", typ, err.Error()))
		}
	}
	if err := w.flush(); err != nil {
		return jobs.Outcome{}, err
	}
	return jobs.Outcome{Status: jobs.StatusCompleted, Output: w.manifest()}, nil
}

// groupPatients are the Patients a Group's members name.
func groupPatients(g fhir.Resource) []string {
	var out []string
	members, _ := g["member"].([]any)
	for _, m := range members {
		mm, _ := m.(map[string]any)
		entity, _ := mm["entity"].(map[string]any)
		ref, _ := entity["reference"].(string)
		if typ, id, ok := fhir.SplitReference(ref); ok && typ == "Patient" && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func chunks(ids []string) [][]string {
	var out [][]string
	for len(ids) > 0 {
		n := min(chunk, len(ids))
		out = append(out, ids[:n])
		ids = ids[n:]
	}
	return out
}

// writer gathers a type's resources into files.
type writer struct {
	s      *Service
	ctx    context.Context
	p      *principal.Principal
	typ    string
	buf    bytes.Buffer
	n      int
	output []file
	errors []string
}

type file struct {
	typ, url string
	count    int
}

// export writes every resource of typ that one of the queries finds (each
// resource once), modified at or after since when it is set, by pages in
// the order of their lastUpdated (the next page starts at the last one's
// time, leaving out what it already wrote).
func (w *writer) export(typ string, queries []string, since string) error {
	if w.typ != typ {
		if err := w.flush(); err != nil {
			return err
		}
		w.typ = typ
	}
	written := map[string]bool{}
	for _, q := range queries {
		cursor := since
		for {
			query := q + "&_sort=_lastUpdated&_count=" + strconv.Itoa(pageSize)
			if cursor != "" {
				query += "&_lastUpdated=ge" + url.QueryEscape(cursor)
			}
			req, err := fhir.ParseSearch(typ, strings.TrimPrefix(query, "&"))
			if err != nil {
				return err
			}
			res, err := w.s.cfg.FHIR.Search(w.ctx, w.p, req)
			if fhir.IsCode(err, fhir.EForbidden) {
				return nil // a type the caller may not read exports nothing
			}
			if err != nil {
				return err
			}
			fresh := 0
			for i := range res.Records {
				rec := &res.Records[i]
				cursor = rec.LastUpdated.UTC().Format(time.RFC3339Nano)
				if written[rec.ID] {
					continue
				}
				written[rec.ID] = true
				fresh++
				if err := w.add(rec.JSON); err != nil {
					return err
				}
			}
			if !res.More || fresh == 0 {
				break
			}
		}
	}
	return nil
}

func (w *writer) add(resource []byte) error {
	var compact bytes.Buffer
	if err := json.Compact(&compact, resource); err != nil {
		return err
	}
	w.buf.Write(compact.Bytes())
	w.buf.WriteByte('\n')
	w.n++
	if w.n >= FileResources || w.buf.Len() >= FileBytes {
		return w.flush()
	}
	return nil
}

// flush writes the file gathered so far as a Binary of the caller's project,
// authored by the caller.
func (w *writer) flush() error {
	if w.n == 0 {
		return nil
	}
	sys := principal.System(w.p.ProjectID, fhir.Reference{Reference: w.p.Profile})
	bin := fhir.Resource{"resourceType": "Binary", "contentType": "application/fhir+ndjson",
		"data": base64.StdEncoding.EncodeToString(w.buf.Bytes())}
	rec, err := w.s.cfg.FHIR.Create(w.ctx, sys, bin)
	if err != nil {
		return err
	}
	w.output = append(w.output, file{typ: w.typ, url: w.s.cfg.FHIR.BaseURL() + "Binary/" + rec.ID, count: w.n})
	w.buf.Reset()
	w.n = 0
	return nil
}

// manifest is the job's output: a Parameters with an "output" parameter
// per file (type, url, count) and an "error" per type that failed, the
// shape the reference keeps in its AsyncJob.
func (w *writer) manifest() fhir.Resource {
	var params []any
	for _, f := range w.output {
		params = append(params, map[string]any{"name": "output", "part": []any{
			map[string]any{"name": "type", "valueCode": f.typ},
			map[string]any{"name": "url", "valueUri": f.url},
			map[string]any{"name": "count", "valueInteger": f.count},
		}})
	}
	for _, e := range w.errors {
		params = append(params, map[string]any{"name": "error", "part": []any{
			map[string]any{"name": "type", "valueCode": "OperationOutcome"},
			map[string]any{"name": "diagnostics", "valueString": e},
		}})
	}
	return fhir.Resource{"resourceType": "Parameters", "parameter": params}
}

// Status is what an export's status answers: Done false while it runs (with
// Progress), or its manifest (Bulk Data's completion document) when done.
type Status struct {
	Done     bool
	Progress string
	// Failed is why the export ended in error.
	Failed   error
	Manifest map[string]any
}

// StatusOf reads an export's status as p (its requester or a project
// admin, as any job's): a cancelled export is not found.
func (s *Service) StatusOf(ctx context.Context, p *principal.Principal, id string) (*Status, error) {
	job, err := s.cfg.Jobs.Get(ctx, p, id)
	if err != nil {
		return nil, err
	}
	switch job.String("status") {
	case "accepted", "active":
		return &Status{Progress: job.String("status")}, nil
	case "cancelled":
		return nil, fhir.ErrNotFound
	case "error":
		return &Status{Done: true, Failed: failure(job)}, nil
	}
	manifest := map[string]any{
		"transactionTime":     job.String("transactionTime"),
		"request":             job.String("request"),
		"requiresAccessToken": true,
		"output":              []any{},
		"error":               []any{},
	}
	out, _ := job["output"].(map[string]any)
	params, _ := out["parameter"].([]any)
	for _, prm := range params {
		m, _ := prm.(map[string]any)
		entry := map[string]any{}
		parts, _ := m["part"].([]any)
		for _, part := range parts {
			pm, _ := part.(map[string]any)
			name, _ := pm["name"].(string)
			for k, v := range pm {
				if strings.HasPrefix(k, "value") {
					entry[name] = v
				}
			}
		}
		switch m["name"] {
		case "output":
			manifest["output"] = append(manifest["output"].([]any), entry)
		case "error":
			manifest["error"] = append(manifest["error"].([]any), entry)
		}
	}
	return &Status{Done: true, Manifest: manifest}, nil
}

// failure is the error of a failed export's AsyncJob: the outcome its
// output holds.
func failure(job fhir.Resource) error {
	out, _ := job["output"].(map[string]any)
	params, _ := out["parameter"].([]any)
	for _, prm := range params {
		m, _ := prm.(map[string]any)
		oo, _ := m["resource"].(map[string]any)
		issues, _ := oo["issue"].([]any)
		for _, i := range issues {
			im, _ := i.(map[string]any)
			details, _ := im["details"].(map[string]any)
			if text, _ := details["text"].(string); text != "" {
				return fhir.Invalid("The export failed: " + text)
			}
		}
	}
	return fhir.Invalid("The export failed")
}

// Cancel cancels an export (DELETE of its status URL).
func (s *Service) Cancel(ctx context.Context, p *principal.Principal, id string) error {
	return s.cfg.Jobs.Cancel(ctx, p, id)
}
