// Package rest serves the FHIR R4 REST API under /fhir/R4: create, read,
// vread, update, patch, delete, history, search and metadata, each within the
// caller's project, plus the Bot operations ($deploy, $execute).
package rest

import (
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/auth"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// Config configures the FHIR API.
type Config struct {
	Store store.Store
	Auth  *auth.Authenticator
	// BaseURL is the server's public base URL, ending in "/".
	BaseURL string
	Log     *slog.Logger
	// Limits bound request bodies (JSON, text, raw Binary and modules) and
	// the execution log kept in AuditEvents; zero fields take the defaults.
	// Execution limits are the Runtime's.
	Limits limits.Limits
	// Runtime runs bots; nil leaves the Bot operations out.
	Runtime *runtime.Runtime
	// Registerer receives the bot input metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Handler serves /fhir/R4.
type Handler struct {
	cfg   Config
	store store.Store
	log   *slog.Logger
	base  string // BaseURL + "fhir/R4/"
	extra []func(*mux.Router)
	// internal serves bots' in-process FHIR calls: the same routes, with the
	// principal already in the request context instead of a token.
	internal *mux.Router
	metrics  *botMetrics
	audits   *auditWriter
	parsed   parsedCache
	// warmer compiles changed Bots' modules in the background (nil
	// without a runtime).
	warmer *moduleWarmer
}

// New builds the handler.
func New(cfg Config) *Handler {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, store: cfg.Store, log: cfg.Log, base: cfg.BaseURL + "fhir/R4/", metrics: newBotMetrics(cfg.Registerer)}
	h.audits = newAuditWriter(cfg.Store, cfg.Log, h.metrics)
	if cfg.Runtime != nil {
		h.warmer = newModuleWarmer(h, cfg.Registerer)
	}
	return h
}

// Changed acts on changes the store announces (store.Store.Subscribe), made
// by this process or another replica: a changed Bot has its module compiled
// in the background.
func (h *Handler) Changed(changes []store.Change) {
	var bots []string
	for _, c := range changes {
		if c.ResourceType == "Bot" {
			bots = append(bots, c.ID)
		}
	}
	if len(bots) > 0 && h.warmer != nil {
		h.warmer.add(bots)
	}
}

// Close flushes pending audit events and stops the background compiler.
func (h *Handler) Close() {
	h.audits.close()
	if h.warmer != nil {
		h.warmer.close()
	}
}

// AddRoutes registers extra authenticated routes under /fhir/R4 before the
// generic resource routes (operations such as $execute).
func (h *Handler) AddRoutes(fn func(r *mux.Router)) { h.extra = append(h.extra, fn) }

// Register mounts the API on r.
func (h *Handler) Register(r *mux.Router) {
	r.HandleFunc("/fhir/R4/metadata", h.metadata).Methods(http.MethodGet)
	api := r.PathPrefix("/fhir/R4").Subrouter()
	api.Use(h.cfg.Auth.Require)
	for _, fn := range h.extra {
		fn(api)
	}
	h.registerBots(api)
	h.resourceRoutes(api)

	// Bots' own FHIR calls skip token checks but run every other rule. Bot
	// operations are left out so that a bot cannot start another bot.
	h.internal = mux.NewRouter()
	in := h.internal.PathPrefix("/fhir/R4").Subrouter()
	in.Use(requirePrincipal)
	h.resourceRoutes(in)
}

func requirePrincipal(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if auth.FromContext(r.Context()) == nil {
			httpx.WriteError(w, r, slog.New(slog.DiscardHandler), fhir.ErrUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (h *Handler) resourceRoutes(api *mux.Router) {
	h.definitionRoutes(api)
	api.HandleFunc("/{type}", h.search).Methods(http.MethodGet)
	api.HandleFunc("/{type}/_search", h.searchPost).Methods(http.MethodPost)
	api.HandleFunc("/{type}", h.create).Methods(http.MethodPost)
	api.HandleFunc("/{type}/{id}", h.read).Methods(http.MethodGet)
	api.HandleFunc("/{type}/{id}", h.update).Methods(http.MethodPut)
	api.HandleFunc("/{type}/{id}", h.patch).Methods(http.MethodPatch)
	api.HandleFunc("/{type}/{id}", h.delete).Methods(http.MethodDelete)
	api.HandleFunc("/{type}/{id}/_history", h.history).Methods(http.MethodGet)
	api.HandleFunc("/{type}/{id}/_history/{vid}", h.vread).Methods(http.MethodGet)
	api.PathPrefix("/").HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, fhir.ErrNotFound)
	})
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpx.WriteError(w, r, h.log, err)
}

// begin starts a resource handler: the caller, the {type} of the path and
// the type-level authorization of the action. On failure it has answered.
func (h *Handler) begin(w http.ResponseWriter, r *http.Request, a action) (*auth.Principal, string, bool) {
	p := auth.FromContext(r.Context())
	typ, err := resourceType(r)
	if err == nil {
		err = authorize(p, typ, a)
	}
	if err != nil {
		h.fail(w, r, err)
		return nil, "", false
	}
	return p, typ, true
}

// resourceType validates the {type} path segment.
func resourceType(r *http.Request) (string, error) {
	t := mux.Vars(r)["type"]
	if !fhir.KnownType(t) {
		return "", fhir.Errorf(fhir.ENotFound, "Unknown resource type: %s", t)
	}
	return t, nil
}

// writeRecord answers with a stored resource and its version headers.
func (h *Handler) writeRecord(w http.ResponseWriter, status int, rec *store.Record, p *auth.Principal) {
	w.Header().Set("ETag", `W/"`+rec.VersionID+`"`)
	w.Header().Set("Last-Modified", rec.LastUpdated.UTC().Format(http.TimeFormat))
	if status == http.StatusCreated {
		w.Header().Set("Location", h.base+rec.ResourceType+"/"+rec.ID+"/_history/"+rec.VersionID)
	}
	httpx.WriteJSON(w, status, httpx.FHIRJSON, present(rec, p))
}

// hiddenFields are never sent to anyone.
var hiddenFields = map[string][]string{
	"User":  {"passwordHash", "mfaSecret"},
	"Login": {"codeChallenge", "refreshSecret", "code"},
}

// present returns the JSON a caller sees: hidden fields are removed.
func present(rec *store.Record, p *auth.Principal) json.RawMessage {
	fields := hiddenFields[rec.ResourceType]
	if rec.ResourceType == "ClientApplication" && (p == nil || !p.Admin) {
		fields = []string{"secret"}
	}
	if rec.ResourceType == "Project" && (p == nil || !p.SuperAdmin) {
		fields = projectHidden
	}
	if len(fields) == 0 {
		return rec.JSON
	}
	r, err := rec.Resource()
	if err != nil {
		return rec.JSON
	}
	for _, f := range fields {
		delete(r, f)
	}
	b, err := r.Marshal()
	if err != nil {
		return rec.JSON
	}
	return b
}

// readJSONResource reads a FHIR JSON body for resource type typ.
func (h *Handler) readJSONResource(r *http.Request, typ string) (fhir.Resource, error) {
	if !httpx.IsJSON(httpx.MediaType(r)) {
		return nil, fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type")
	}
	body, err := httpx.ReadBody(r, h.cfg.Limits.JSONBodyBytes)
	if err != nil {
		return nil, err
	}
	res, err := fhir.ParseResource(body)
	if err != nil {
		return nil, err
	}
	if res.Type() != typ {
		return nil, fhir.Invalid("Incorrect resource type: expected "+typ+", but found "+res.Type(), "resourceType")
	}
	return res, nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	p, typ, ok := h.begin(w, r, actionCreate)
	if !ok {
		return
	}
	var res fhir.Resource
	var err error
	if typ == "Binary" && !httpx.IsJSON(httpx.MediaType(r)) {
		res, err = h.rawBinary(r)
	} else {
		res, err = h.readJSONResource(r, typ)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	delete(res, "id")
	project := p.ProjectID
	if p.SuperAdmin {
		// A super admin may create into another project by naming it.
		if mp := res.MetaProject(); mp != "" {
			if _, err := h.store.Read(r.Context(), store.AllProjects, "Project", mp); err != nil {
				h.fail(w, r, fhir.Invalid("Unknown meta.project: "+mp, "meta.project"))
				return
			}
			project = mp
		}
	}
	var rec *store.Record
	if typ == "Project" {
		// A project belongs to itself: its id is its meta.project.
		id := newID()
		rec, err = h.store.Create(r.Context(), res, store.Write{Project: id, Author: p.Author(), ID: id})
	} else if typ == "Binary" {
		// The reference answers Binary uploads with a url the CLI copies into
		// Bot.sourceCode; the id is needed for it, so it is chosen here.
		id := newID()
		res["url"] = "Binary/" + id
		rec, err = h.guardWrite(r.Context(), p, typ, "", func(st store.Store) (*store.Record, error) {
			return st.Create(r.Context(), res, store.Write{Project: project, Author: p.Author(), ID: id, CheckReferences: !p.SuperAdmin})
		})
	} else {
		rec, err = h.guardWrite(r.Context(), p, typ, "", func(st store.Store) (*store.Record, error) {
			return st.Create(r.Context(), res, store.Write{Project: project, Author: p.Author(), CheckReferences: !p.SuperAdmin})
		})
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.writeRecord(w, http.StatusCreated, rec, p)
}

// rawBinary wraps a non-JSON upload in a Binary resource.
func (h *Handler) rawBinary(r *http.Request) (fhir.Resource, error) {
	body, err := httpx.ReadBody(r, h.cfg.Limits.ModuleBytes)
	if err != nil {
		return nil, err
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/octet-stream"
	}
	res := fhir.Resource{"resourceType": "Binary", "contentType": ct, "data": base64.StdEncoding.EncodeToString(body)}
	if fn := r.URL.Query().Get("_filename"); fn != "" {
		res["meta"] = map[string]any{"tag": []any{map[string]any{"system": "https://sandbot.dev/filename", "code": fn}}}
	}
	return res, nil
}

func (h *Handler) read(w http.ResponseWriter, r *http.Request) {
	p, typ, ok := h.begin(w, r, actionRead)
	if !ok {
		return
	}
	rec, err := h.store.Read(r.Context(), p.Scope(), typ, mux.Vars(r)["id"])
	if err == nil {
		err = h.checkPolicy(r.Context(), p, typ, rec.ID, false)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if typ == "Binary" && !wantsFHIR(r) {
		h.writeBinaryContent(w, r, rec)
		return
	}
	h.writeRecord(w, http.StatusOK, rec, p)
}

// wantsFHIR reports whether the caller asked for the FHIR JSON of a Binary
// rather than its content.
func wantsFHIR(r *http.Request) bool {
	a := r.Header.Get("Accept")
	return strings.Contains(a, "fhir+json") || strings.Contains(a, "application/json")
}

func (h *Handler) writeBinaryContent(w http.ResponseWriter, r *http.Request, rec *store.Record) {
	res, err := rec.Resource()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	data, err := base64.StdEncoding.DecodeString(res.String("data"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ct := res.String("contentType")
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Header().Set("ETag", `W/"`+rec.VersionID+`"`)
	w.Write(data)
}

func (h *Handler) vread(w http.ResponseWriter, r *http.Request) {
	p, typ, ok := h.begin(w, r, actionRead)
	if !ok {
		return
	}
	v := mux.Vars(r)
	rec, err := h.store.ReadVersion(r.Context(), p.Scope(), typ, v["id"], v["vid"])
	if err == nil {
		err = h.checkPolicy(r.Context(), p, typ, v["id"], false)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.writeRecord(w, http.StatusOK, rec, p)
}

// ifMatch extracts the version id of an If-Match header (W/"vid" or "vid").
func ifMatch(r *http.Request) string {
	v := strings.TrimSpace(r.Header.Get("If-Match"))
	v = strings.TrimPrefix(v, "W/")
	return strings.Trim(v, `"`)
}

func (h *Handler) update(w http.ResponseWriter, r *http.Request) {
	p, typ, ok := h.begin(w, r, actionUpdate)
	if !ok {
		return
	}
	id := mux.Vars(r)["id"]
	body, err := h.readJSONResource(r, typ)
	if err != nil {
		if fhir.IsCode(err, fhir.EInvalid) && strings.HasPrefix(fhir.OutcomeFor(err).Issue[0].Details.Text, "Incorrect resource type") {
			err = fhir.Invalid("Incorrect resource type", "resourceType")
		}
		h.fail(w, r, err)
		return
	}
	if body.ID() != id {
		h.fail(w, r, fhir.Invalid("Incorrect resource ID", "id"))
		return
	}
	rec, err := h.guardWrite(r.Context(), p, typ, id, func(st store.Store) (*store.Record, error) {
		return st.Update(r.Context(), p.Scope(), typ, id, store.Write{Author: p.Author(), IfMatch: ifMatch(r), CheckReferences: !p.SuperAdmin},
			func(cur fhir.Resource) (fhir.Resource, error) {
				next := keepServerFields(cur, body)
				if typ == "Project" {
					return next, protectProject(p, cur, next, true)
				}
				return next, nil
			})
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.writeRecord(w, http.StatusOK, rec, p)
}

// keepServerFields carries over the fields a client may not change with a
// plain update (Binary's url, secrets the client cannot see).
func keepServerFields(cur, next fhir.Resource) fhir.Resource {
	if cur.Type() == "Binary" {
		next["url"] = cur["url"]
	}
	if cur.Type() == "ClientApplication" {
		if _, ok := next["secret"]; !ok {
			next["secret"] = cur["secret"]
		}
	}
	return next
}

func (h *Handler) patch(w http.ResponseWriter, r *http.Request) {
	p, typ, ok := h.begin(w, r, actionUpdate)
	if !ok {
		return
	}
	if httpx.MediaType(r) != "application/json-patch+json" {
		h.fail(w, r, fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type"))
		return
	}
	body, err := httpx.ReadBody(r, h.cfg.Limits.JSONBodyBytes)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		h.fail(w, r, fhir.Invalid("Empty patch body"))
		return
	}
	ops, err := jsonpatch.DecodePatch(body)
	if err != nil {
		h.fail(w, r, fhir.Invalid("Invalid patch body"))
		return
	}
	id := mux.Vars(r)["id"]
	rec, err := h.guardWrite(r.Context(), p, typ, id, func(st store.Store) (*store.Record, error) {
		return st.Update(r.Context(), p.Scope(), typ, id, store.Write{Author: p.Author(), IfMatch: ifMatch(r), CheckReferences: !p.SuperAdmin},
			func(cur fhir.Resource) (fhir.Resource, error) {
				if typ != "Project" {
					return applyPatch(cur, ops)
				}
				// The patch sees what the caller may see: a hidden field
				// can be neither tested, copied nor moved.
				next, err := applyPatch(projectView(p, cur.Clone()), ops)
				if err != nil {
					return nil, err
				}
				return next, protectProject(p, cur, next, false)
			})
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.writeRecord(w, http.StatusOK, rec, p)
}

// applyPatch applies a JSON Patch; the result must keep its type and id.
func applyPatch(cur fhir.Resource, ops jsonpatch.Patch) (fhir.Resource, error) {
	doc, err := cur.Marshal()
	if err != nil {
		return nil, err
	}
	out, err := ops.ApplyWithOptions(doc, &jsonpatch.ApplyOptions{SupportNegativeIndices: true, EnsurePathExistsOnAdd: true})
	if err != nil {
		return nil, fhir.Invalid("Invalid patch: " + err.Error())
	}
	next, err := fhir.ParseResource(out)
	if err != nil {
		return nil, err
	}
	if next.Type() != cur.Type() {
		return nil, fhir.Invalid("Incorrect resource type", "resourceType")
	}
	if next.ID() != cur.ID() {
		return nil, fhir.Invalid("Incorrect resource ID", "id")
	}
	return next, nil
}

func (h *Handler) delete(w http.ResponseWriter, r *http.Request) {
	p, typ, ok := h.begin(w, r, actionDelete)
	if !ok {
		return
	}
	if _, err := h.guardWrite(r.Context(), p, typ, mux.Vars(r)["id"], func(st store.Store) (*store.Record, error) {
		return nil, st.Delete(r.Context(), p.Scope(), typ, mux.Vars(r)["id"], store.Write{Author: p.Author(), IfMatch: ifMatch(r)})
	}); err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

func (h *Handler) history(w http.ResponseWriter, r *http.Request) {
	p, typ, ok := h.begin(w, r, actionRead)
	if !ok {
		return
	}
	req, err := fhir.ParseSearch(typ, "")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	if c := q.Get("_count"); c != "" {
		if err := setPaging(req, c, q.Get("_offset")); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	recs, err := h.store.History(r.Context(), p.Scope(), typ, mux.Vars(r)["id"], req.Count, req.Offset)
	if err == nil {
		err = h.checkPolicy(r.Context(), p, typ, mux.Vars(r)["id"], false)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b := fhir.Bundle{ResourceType: "Bundle", Type: "history",
		Link: []fhir.BundleLink{{Relation: "self", URL: h.base + typ + "/" + mux.Vars(r)["id"] + "/_history"}}}
	for i := range recs {
		rec := &recs[i]
		e := fhir.BundleEntry{FullURL: h.base + typ + "/" + rec.ID,
			Response: &fhir.EntryResponse{Status: "200", LastModified: rec.LastUpdated.Format(fhir.TimeFormat), Etag: `W/"` + rec.VersionID + `"`}}
		if rec.Deleted {
			e.Request = &fhir.EntryRequest{Method: "DELETE", URL: typ + "/" + rec.ID}
			e.Response.Status = "410"
		} else {
			e.Resource = present(rec, p)
		}
		b.Entry = append(b.Entry, e)
	}
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, b)
}

func setPaging(req *fhir.SearchRequest, count, offset string) error {
	q := "_count=" + count
	if offset != "" {
		q += "&_offset=" + offset
	}
	parsed, err := fhir.ParseSearch(req.ResourceType, q)
	if err != nil {
		return err
	}
	req.Count, req.Offset = parsed.Count, parsed.Offset
	return nil
}
