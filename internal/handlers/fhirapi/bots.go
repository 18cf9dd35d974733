package fhirapi

import (
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/bots"
)

// registerBots adds the Bot operations. Paths are matched after
// percent-decoding, so "%24execute" reaches the same routes as "$execute";
// anything after the operation name is accepted, as the reference does.
func (h *Handler) registerBots(r *mux.Router) {
	if h.bots == nil {
		return
	}
	r.HandleFunc("/Bot/{id}/$deploy", h.deploy).Methods(http.MethodPost)
	r.HandleFunc("/Bot/$execute{rest:(?:/.*)?}", h.execute).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/Bot/{id}/$execute{rest:(?:/.*)?}", h.execute).Methods(http.MethodGet, http.MethodPost)
	if h.jobs != nil {
		r.HandleFunc("/job/{id}/status", h.jobStatus).Methods(http.MethodGet)
		r.HandleFunc("/job/{id}/status", h.jobCancel).Methods(http.MethodDelete)
		r.HandleFunc("/AsyncJob/{id}/$cancel", h.jobCancel).Methods(http.MethodPost)
	}
}

// deploy decodes a $deploy: the body is read only once the caller may
// deploy bots at all.
func (h *Handler) deploy(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	if err := h.bots.AuthorizeDeploy(p); err != nil {
		h.fail(w, r, err)
		return
	}
	mt := httpx.MediaType(r)
	body, err := httpx.ReadBody(r, h.bots.DeployLimit(mt))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	err = h.bots.Deploy(r.Context(), bots.Deploy{BotID: mux.Vars(r)["id"], Caller: p, Body: body, ContentType: mt,
		Filename: r.URL.Query().Get("filename")})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

// execute decodes a $execute (a GET's query or a POST's body, the headers,
// Prefer: respond-async) and encodes what the bots service answered.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := principal.FromContext(ctx)
	if err := h.bots.AuthorizeExecute(p); err != nil {
		h.fail(w, r, err)
		return
	}
	query := r.URL.Query()
	ex := bots.Execute{BotID: mux.Vars(r)["id"], Identifier: query.Get("identifier"), Caller: p,
		Headers: eventHeaders(r), TraceID: httpx.TraceID(ctx), Trigger: bots.TriggerRequest,
		Async: h.jobs != nil && preferAsync(r), RequestURL: strings.TrimSuffix(h.cfg.BaseURL, "/") + r.URL.RequestURI()}
	if r.Method == http.MethodGet {
		ex.Query = query
	} else {
		ex.ContentType = httpx.MediaType(r)
		body, err := httpx.ReadBody(r, h.bots.InputLimit(ex.ContentType))
		if err != nil {
			h.fail(w, r, err)
			return
		}
		ex.Input = body
	}
	res, err := h.bots.Execute(ctx, ex)
	switch {
	case err != nil && ctx.Err() != nil:
		return // the caller went away
	case err != nil:
		h.fail(w, r, err)
	case res.Job != "":
		status := h.jobStatusURL(res.Job)
		w.Header().Set("Content-Location", status)
		httpx.WriteOutcome(w, r, http.StatusAccepted, fhir.Accepted(status))
	case res.Outcome != nil:
		httpx.WriteOutcome(w, r, res.Status, res.Outcome)
	default:
		httpx.WriteJSON(w, res.Status, res.ContentType, res.Body)
	}
}

// eventHeaders are the request's headers as the event carries them:
// lower-cased, without the caller's credentials.
func eventHeaders(r *http.Request) map[string]string {
	headers := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		lk := strings.ToLower(k)
		if lk == "authorization" || lk == "cookie" {
			continue
		}
		headers[lk] = strings.Join(v, ", ")
	}
	return headers
}

// preferAsync reports whether the request asks to be answered
// asynchronously: a Prefer header with the respond-async preference (alone,
// as @medplum/core sends it, or among others as RFC 7240 allows).
func preferAsync(r *http.Request) bool {
	for _, v := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(pref, ";")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// jobStatusURL is where a job's status is polled.
func (h *Handler) jobStatusURL(id string) string {
	return h.cfg.BaseURL + "fhir/R4/job/" + id + "/status"
}

// jobStatus answers a job's AsyncJob: 202 while it waits (accepted) or runs
// (active), 200 once it completed, failed or was cancelled.
func (h *Handler) jobStatus(w http.ResponseWriter, r *http.Request) {
	job, err := h.jobs.Get(r.Context(), principal.FromContext(r.Context()), mux.Vars(r)["id"])
	if err != nil {
		h.fail(w, r, err)
		return
	}
	body, err := job.Marshal()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if st := job.String("status"); st == "accepted" || st == "active" {
		status = http.StatusAccepted
		w.Header().Set("Content-Location", h.jobStatusURL(job.ID()))
	}
	httpx.WriteJSON(w, status, httpx.FHIRJSON, body)
}

// jobCancel cancels a job: DELETE on its status answers 202 as the
// reference does (the FHIR asynchronous pattern), POST AsyncJob/<id>/$cancel
// 200 All OK.
func (h *Handler) jobCancel(w http.ResponseWriter, r *http.Request) {
	if err := h.jobs.Cancel(r.Context(), principal.FromContext(r.Context()), mux.Vars(r)["id"]); err != nil {
		h.fail(w, r, err)
		return
	}
	if r.Method == http.MethodDelete {
		httpx.WriteOutcome(w, r, http.StatusAccepted, fhir.Accepted(""))
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}
