// Package fhirapi serves the FHIR R4 REST API under /fhir/R4: it decodes HTTP
// requests, hands the REST interactions (create, read, vread, update, patch,
// delete, history, search) to the FHIR service (internal/services/fhirservice), which
// decides everything about them, and encodes its answers. It also serves
// metadata, GraphQL, the definitions' operations, and the Bot operations
// ($deploy, $execute, with the job status endpoints), which it hands to the
// bots service (internal/services/bots) in the same way.
package fhirapi

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/auth"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/internal/services/bulkexport"
	"github.com/sandbot/sandbot/internal/services/fhirgraphql"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/limits"
)

// Config configures the FHIR API.
type Config struct {
	// FHIR is the service every interaction goes through.
	FHIR *fhirservice.Service
	// GraphQL answers $graphql; nil answers it 404.
	GraphQL *fhirgraphql.Engine
	// Auth resolves a job's submitter again when the job runs.
	Auth *auth.Authenticator
	// Require authenticates every /fhir/R4 route (authapi's middleware).
	Require func(http.Handler) http.Handler
	// BaseURL is the server's public base URL, ending in "/".
	BaseURL string
	Log     *slog.Logger
	// Limits bound request bodies; zero fields take the defaults.
	Limits limits.Limits
	// Bots runs the Bot operations; nil leaves them out.
	Bots *bots.Service
	// Export runs Bulk Data exports; nil leaves $export out.
	Export *bulkexport.Service
	// Jobs serves the status of asynchronous jobs and cancels them; nil
	// answers every $execute synchronously.
	Jobs Jobs
	// HL7 runs failed HL7 messages again (AsyncJob/{id}/$rerun); nil
	// leaves the operation out.
	HL7 HL7
}

// Jobs is what the job status endpoints need of the job engine.
type Jobs interface {
	Get(ctx context.Context, p *principal.Principal, id string) (fhir.Resource, error)
	Cancel(ctx context.Context, p *principal.Principal, id string) error
}

// Handler serves /fhir/R4.
type Handler struct {
	cfg   Config
	svc   *fhirservice.Service
	log   *slog.Logger
	extra []func(*mux.Router)
	bots  *bots.Service
	jobs  Jobs
}

// New builds the handler.
func New(cfg Config) *Handler {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg, svc: cfg.FHIR, log: cfg.Log, bots: cfg.Bots, jobs: cfg.Jobs}
}

// AddRoutes registers extra authenticated routes under /fhir/R4 before the
// generic resource routes (operations such as $execute).
func (h *Handler) AddRoutes(fn func(r *mux.Router)) { h.extra = append(h.extra, fn) }

// restRoutes are the REST interactions' routes: they name the interaction
// for the metrics; the FHIR service's dispatcher serves them all.
var restRoutes = []struct {
	path    string
	methods []string
}{
	// PUT, PATCH and DELETE on a type are conditional: "?<query>" names the resource.
	{"/{type}", []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}},
	{"/{type}/_search", []string{http.MethodPost}},
	{"/{type}/{id}", []string{http.MethodGet, http.MethodPut, http.MethodPatch, http.MethodDelete}},
	{"/{type}/{id}/_history", []string{http.MethodGet}},
	{"/{type}/{id}/_history/{vid}", []string{http.MethodGet}},
}

// Register mounts the API on r.
func (h *Handler) Register(r *mux.Router) {
	r.HandleFunc("/fhir/R4/metadata", h.metadata).Methods(http.MethodGet)
	api := r.PathPrefix("/fhir/R4").Subrouter()
	api.Use(h.cfg.Require)
	for _, fn := range h.extra {
		fn(api)
	}
	h.registerBots(api)
	h.registerHL7(api)
	h.registerExport(api)
	h.definitionRoutes(api)
	h.validateRoutes(api)
	api.HandleFunc("/$graphql", h.graphql).Methods(http.MethodGet, http.MethodPost)
	api.HandleFunc("", h.bundle).Methods(http.MethodPost)
	api.HandleFunc("/", h.bundle).Methods(http.MethodPost)
	for _, rt := range restRoutes {
		api.HandleFunc(rt.path, h.serve).Methods(rt.methods...)
	}
	api.PathPrefix("/").HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, fhir.ErrNotFound)
	})
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpx.WriteError(w, r, h.log, err)
}

// serve answers a REST interaction through the FHIR service.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	rel := strings.TrimPrefix(r.URL.EscapedPath(), "/fhir/R4/")
	if r.URL.RawQuery != "" {
		rel += "?" + r.URL.RawQuery
	}
	req := &fhirservice.Request{Method: r.Method, URL: rel, ContentType: r.Header.Get("Content-Type"),
		IfMatch: r.Header.Get("If-Match"), IfNoneExist: r.Header.Get("If-None-Exist"), Accept: r.Header.Get("Accept")}
	if op := bodyOp(r); op != 0 && fhirservice.Stored(mux.Vars(r)["type"]) {
		// A caller who may not act never has its body read.
		if err := fhirservice.Authorize(p, mux.Vars(r)["type"], op); err != nil {
			h.fail(w, r, err)
			return
		}
		body, err := httpx.ReadBody(r, h.svc.BodyLimit(r.Method, rel, req.ContentType))
		if err != nil {
			h.fail(w, r, err)
			return
		}
		req.Body = body
	}
	h.write(w, r, h.svc.Do(r.Context(), p, req))
}

// bodyOp is the interaction of a request that carries a body (0: none).
func bodyOp(r *http.Request) fhirservice.Op {
	switch r.Method {
	case http.MethodPost:
		if strings.HasSuffix(r.URL.Path, "/_search") {
			return fhirservice.OpRead
		}
		return fhirservice.OpCreate
	case http.MethodPut, http.MethodPatch:
		return fhirservice.OpUpdate
	}
	return 0
}

// write sends the service's answer.
func (h *Handler) write(w http.ResponseWriter, r *http.Request, resp *fhirservice.Response) {
	if resp.Err != nil {
		h.fail(w, r, resp.Err)
		return
	}
	if resp.Outcome != nil {
		httpx.WriteOutcome(w, r, resp.Status, resp.Outcome)
		return
	}
	hd := w.Header()
	if resp.ETag != "" {
		hd.Set("ETag", resp.ETag)
	}
	if resp.LastModified != "" {
		hd.Set("Last-Modified", resp.LastModified)
	}
	if resp.Location != "" {
		hd.Set("Location", resp.Location)
	}
	httpx.WriteJSON(w, resp.Status, resp.ContentType, resp.Body)
}
