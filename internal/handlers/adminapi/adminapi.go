// Package adminapi is the HTTP layer of the admin use-cases: /admin/Project,
// /admin/projects/:id/... and FHIR Project/$init. It decodes requests (JSON
// bodies within limits.Limits.JSONBodyBytes, Project/$init's Parameters),
// turns the authenticated principal into an admin.Caller and writes answers.
// Who may do what is decided by package admin: the use-cases check it, and
// this layer asks admin's own rules (admin.Caller's May* methods) before it
// reads a body, so that a caller who may not act never has it read. Answers
// show what the FHIR service's table lets the caller see (never a User's
// password hash or MFA secret), but for Project/$init's: the Project as the
// server created it for its caller.
package adminapi

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/admin"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/limits"
)

// Handler serves the admin API.
type Handler struct {
	svc *admin.Service
	// require authenticates the /admin routes (authapi's Require).
	require func(http.Handler) http.Handler
	log     *slog.Logger
	base    string
	maxJSON int64
}

// New builds the handler; require is the middleware that authenticates a
// route and puts its principal in the context. baseURL ends in "/"; bodies
// are bounded by lim.JSONBodyBytes (zero: the default).
func New(svc *admin.Service, require func(http.Handler) http.Handler, baseURL string, lim limits.Limits, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{svc: svc, require: require, log: log, base: baseURL, maxJSON: lim.WithDefaults().JSONBodyBytes}
}

// Register mounts /admin/... and POST /auth/resetpassword (which mails a
// set-password link, as invitations do) on r.
func (h *Handler) Register(r *mux.Router) {
	r.HandleFunc("/auth/resetpassword", h.resetPassword).Methods(http.MethodPost)
	ad := r.PathPrefix("/admin").Subrouter()
	ad.Use(h.require)
	ad.HandleFunc("/Project", h.createProject).Methods(http.MethodPost)
	ad.HandleFunc("/Project/", h.createProject).Methods(http.MethodPost)
	// Every /admin/projects route is for administrators: others get 403
	// before their body is read (the use-cases check it again).
	pr := ad.PathPrefix("/projects/{pid}").Subrouter()
	pr.Use(h.requireAdmin)
	pr.HandleFunc("", h.project).Methods(http.MethodGet)
	pr.HandleFunc("/secrets", h.replaceList("secret")).Methods(http.MethodPost)
	pr.HandleFunc("/settings", h.replaceList("setting")).Methods(http.MethodPost)
	pr.HandleFunc("/sites", h.replaceList("site")).Methods(http.MethodPost)
	pr.HandleFunc("/client", h.createClient).Methods(http.MethodPost)
	pr.HandleFunc("/bot", h.createBot).Methods(http.MethodPost)
	pr.HandleFunc("/invite", h.invite).Methods(http.MethodPost)
	pr.HandleFunc("/members/{mid}", h.getMember).Methods(http.MethodGet)
	pr.HandleFunc("/members/{mid}", h.updateMember).Methods(http.MethodPost, http.MethodPut)
	pr.HandleFunc("/members/{mid}", h.patchMember).Methods(http.MethodPatch)
	pr.HandleFunc("/members/{mid}", h.deleteMember).Methods(http.MethodDelete)
	ad.PathPrefix("/").HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.fail(w, r, fhir.ErrNotFound) })
}

// RegisterFHIR mounts Project/$init; r is the authenticated /fhir/R4 router.
func (h *Handler) RegisterFHIR(r *mux.Router) {
	r.HandleFunc("/Project/$init", h.initProject).Methods(http.MethodPost)
}

func caller(r *http.Request) admin.Caller {
	return admin.Caller{Principal: principal.FromContext(r.Context())}
}

func (h *Handler) requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := caller(r).MayAdminister(); err != nil {
			h.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpx.WriteError(w, r, h.log, err)
}

func (h *Handler) body(r *http.Request) ([]byte, error) { return httpx.ReadJSON(r, h.maxJSON) }

func (h *Handler) object(r *http.Request) (map[string]any, error) {
	return httpx.ReadJSONObject(r, h.maxJSON)
}

// writeRecord answers with a record as the caller may see it (the FHIR
// service's table decides what is hidden).
func (h *Handler) writeRecord(w http.ResponseWriter, r *http.Request, status int, rec *fhir.Record) {
	body, err := fhirservice.Present(principal.FromContext(r.Context()), rec)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.writeBody(w, status, rec, body)
}

func (h *Handler) writeBody(w http.ResponseWriter, status int, rec *fhir.Record, body []byte) {
	w.Header().Set("ETag", `W/"`+rec.VersionID+`"`)
	w.Header().Set("Last-Modified", rec.LastUpdated.UTC().Format(http.TimeFormat))
	if status == http.StatusCreated {
		w.Header().Set("Location", h.base+"fhir/R4/"+rec.ResourceType+"/"+rec.ID)
	}
	httpx.WriteJSON(w, status, httpx.FHIRJSON, body)
}

// answer writes what a use-case returned: rec with status, or its error.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, status int, rec *fhir.Record, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.writeRecord(w, r, status, rec)
}

func (h *Handler) createProject(w http.ResponseWriter, r *http.Request) {
	if err := caller(r).MayCreateProject(); err != nil {
		h.fail(w, r, err)
		return
	}
	b, err := h.body(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := fhir.ParseResource(b)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rec, err := h.svc.CreateProject(r.Context(), caller(r), res)
	h.answer(w, r, http.StatusCreated, rec, err)
}

func (h *Handler) initProject(w http.ResponseWriter, r *http.Request) {
	c := caller(r)
	if err := c.MayInitProject(); err != nil {
		h.fail(w, r, err)
		return
	}
	m, err := h.object(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if rt, _ := m["resourceType"].(string); rt != "Parameters" {
		h.fail(w, r, fhir.Invalid("Expected a Parameters resource", "resourceType"))
		return
	}
	var name, owner string
	params, _ := m["parameter"].([]any)
	for _, x := range params {
		p, _ := x.(map[string]any)
		switch p["name"] {
		case "name":
			name, _ = p["valueString"].(string)
		case "owner":
			ref, _ := p["valueReference"].(map[string]any)
			owner, _ = ref["reference"].(string)
		}
	}
	rec, err := h.svc.InitProject(r.Context(), c, name, owner)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The answer is the Project as the server created it for the caller,
	// strictMode included, as the reference answers it (its createProject
	// returns what its system repository wrote): the caller chose nothing of
	// it but the name, and learns what it now administers. The fields
	// hidden from project admins are hidden in what they read back later
	// (docs/decisions.md 22).
	h.writeBody(w, http.StatusCreated, rec, rec.JSON)
}

func (h *Handler) project(w http.ResponseWriter, r *http.Request) {
	out, err := h.svc.ProjectDetails(r.Context(), caller(r), mux.Vars(r)["pid"])
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", out)
}

func (h *Handler) replaceList(field string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := caller(r)
		b, err := h.body(r)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		var list []any
		if err := json.Unmarshal(b, &list); err != nil {
			h.fail(w, r, fhir.Invalid("Expected an array", field))
			return
		}
		rec, err := h.svc.ReplaceProjectList(r.Context(), c, mux.Vars(r)["pid"], field, list)
		h.answer(w, r, http.StatusOK, rec, err)
	}
}

func (h *Handler) createClient(w http.ResponseWriter, r *http.Request) {
	h.createWith(w, r, h.svc.CreateClient)
}

func (h *Handler) createBot(w http.ResponseWriter, r *http.Request) {
	h.createWith(w, r, h.svc.CreateBot)
}

func (h *Handler) createWith(w http.ResponseWriter, r *http.Request, fn func(context.Context, admin.Caller, string, map[string]any) (*fhir.Record, error)) {
	c := caller(r)
	m, err := h.object(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rec, err := fn(r.Context(), c, mux.Vars(r)["pid"], m)
	h.answer(w, r, http.StatusCreated, rec, err)
}

func (h *Handler) invite(w http.ResponseWriter, r *http.Request) {
	c := caller(r)
	m, err := h.object(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	req, err := admin.ParseInvite(m)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rec, err := h.svc.Invite(r.Context(), c, mux.Vars(r)["pid"], req)
	h.answer(w, r, http.StatusOK, rec, err)
}

func (h *Handler) getMember(w http.ResponseWriter, r *http.Request) {
	v := mux.Vars(r)
	rec, err := h.svc.Member(r.Context(), caller(r), v["pid"], v["mid"])
	h.answer(w, r, http.StatusOK, rec, err)
}

func (h *Handler) updateMember(w http.ResponseWriter, r *http.Request) {
	c := caller(r)
	b, err := h.body(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := fhir.ParseResource(b)
	if err != nil {
		if fhir.IsCode(err, fhir.EInvalid) && len(b) > 0 && b[0] == '{' {
			// A body that is not a membership is refused like a wrong one.
			err = fhir.ErrForbidden
		}
		h.fail(w, r, err)
		return
	}
	v := mux.Vars(r)
	rec, err := h.svc.UpdateMember(r.Context(), c, v["pid"], v["mid"], res)
	h.answer(w, r, http.StatusOK, rec, err)
}

func (h *Handler) patchMember(w http.ResponseWriter, r *http.Request) {
	c := caller(r)
	if httpx.MediaType(r) != "application/json-patch+json" {
		h.fail(w, r, fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type: use application/json-patch+json"))
		return
	}
	b, err := httpx.ReadBody(r, h.maxJSON)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	v := mux.Vars(r)
	rec, err := h.svc.PatchMember(r.Context(), c, v["pid"], v["mid"], b)
	h.answer(w, r, http.StatusOK, rec, err)
}

func (h *Handler) deleteMember(w http.ResponseWriter, r *http.Request) {
	v := mux.Vars(r)
	if err := h.svc.DeleteMember(r.Context(), caller(r), v["pid"], v["mid"]); err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}
