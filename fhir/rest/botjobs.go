package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/internal/jobs"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// Asynchronous execution (medplum-wire-behaviour 7.10): $execute with
// Prefer: respond-async is checked as a synchronous one would be (the
// caller may read the Bot, bots are enabled, the input parses), then
// accepted as a job (internal/jobs) and answered 202 with Content-Location
// <base>fhir/R4/job/<id>/status; a runner in some server process executes it
// later as the caller, through runBot like any execution.

// executeJobKind is the kind of the jobs of asynchronous executions.
const executeJobKind = "bot-execute"

// executionJob is an asynchronous execution's job payload: who asked (to be
// resolved again when it runs), which Bot, and the call.
type executionJob struct {
	Caller      principal.Credentials `json:"caller"`
	Bot         string                `json:"bot"`
	ContentType string                `json:"contentType,omitempty"`
	Input       json.RawMessage       `json:"input"`
	Headers     map[string]string     `json:"headers,omitempty"`
	TraceID     string                `json:"traceId,omitempty"`
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

// submitExecution accepts an execution as a job.
func (h *Handler) submitExecution(w http.ResponseWriter, r *http.Request, p *principal.Principal, rec *store.Record, call botCall) {
	payload, err := json.Marshal(executionJob{Caller: principal.CredentialsOf(p), Bot: rec.ID, ContentType: call.mediaType,
		Input: call.input, Headers: call.headers, TraceID: call.traceID})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	request := strings.TrimSuffix(h.cfg.BaseURL, "/") + r.URL.RequestURI()
	job, err := h.jobs.Submit(r.Context(), p, executeJobKind, request, payload)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := h.jobStatusURL(job.ID)
	w.Header().Set("Content-Location", status)
	httpx.WriteOutcome(w, r, http.StatusAccepted, fhir.Accepted(status))
}

// runExecutionJob runs an asynchronous execution (a jobs.Handler). The
// caller is resolved again, so a revoked login, a removed member or a
// deleted client fails the job; the Bot is read again as the caller. What
// the bot did becomes the job's output as the reference shapes it; a job
// that could not run ends in error with the reason as its outcome; a full
// execution budget sends the job back to the queue to wait for capacity.
func (h *Handler) runExecutionJob(ctx context.Context, job *store.Job) (jobs.Outcome, error) {
	var in executionJob
	if err := json.Unmarshal(job.Payload, &in); err != nil {
		return jobs.ErrorOutcome(fhir.Invalid("The job's request cannot be read")), nil
	}
	p, err := h.cfg.Auth.Resume(ctx, in.Caller)
	if err != nil {
		if fhir.IsCode(err, fhir.EUnauthorized) {
			return jobs.ErrorOutcome(fhir.Errorf(fhir.EUnauthorized, "The job's submitter is no longer authorized: its login, client or membership was revoked since the job was accepted")), nil
		}
		return jobOutcomeOrRetry(err)
	}
	rec, err := h.svc.Load(ctx, p, "Bot", in.Bot)
	if err != nil {
		return jobOutcomeOrRetry(err)
	}
	bot, err := h.parsed.resource(rec)
	if err != nil {
		return jobs.Outcome{}, err
	}
	project, err := h.botProject(ctx, rec.Project, bot)
	if err != nil {
		return jobOutcomeOrRetry(err)
	}
	call := botCall{mediaType: in.ContentType, input: in.Input, headers: in.Headers, traceID: in.TraceID}
	res, err := h.runBot(ctx, p, rec, bot, project, call)
	var busy *runtime.BusyError
	var failure *runtime.Failure
	switch {
	case errors.As(err, &busy):
		return jobs.Outcome{}, &jobs.RetryError{After: busy.RetryAfter, Reason: busy.Reason}
	case errors.As(err, &failure):
		// As the reference: the bot ran and failed; the job completed,
		// with the failure as its outcome.
		return jobs.Outcome{Status: jobs.StatusCompleted, Output: jobs.OutcomeParameters(fhir.OutcomeFor(fhir.Invalid(failure.Message)))}, nil
	case err != nil && ctx.Err() != nil:
		return jobs.Outcome{}, err
	case err != nil:
		return jobOutcomeOrRetry(err)
	}
	return jobs.Outcome{Status: jobs.StatusCompleted, Output: executionParameters(&res.Envelope)}, nil
}

// jobOutcomeOrRetry ends a job in error with err as its outcome when err is
// the caller's (a 4xx: the Bot is gone, bots are off, no code); anything else
// (the database unavailable) is returned for the runner to try again.
func jobOutcomeOrRetry(err error) (jobs.Outcome, error) {
	switch fhir.ErrorCodeOf(err) {
	case fhir.EInternal, fhir.EUnavailable:
		return jobs.Outcome{}, err
	}
	return jobs.ErrorOutcome(err), nil
}

// executionParameters is an execution's result as an AsyncJob's output, as
// the reference shapes it: a string, a number (as text), an object or an
// array (as JSON text) is responseBody's valueString; a boolean its
// valueBoolean; an OperationOutcome, or the bot's error, or All OK when
// there is no result, is the outcome parameter's resource.
func executionParameters(env *runtime.Envelope) fhir.Resource {
	param := func(p map[string]any) fhir.Resource {
		return fhir.Resource{"resourceType": "Parameters", "parameter": []any{p}}
	}
	if len(env.Error) > 0 {
		var oo map[string]any
		if json.Unmarshal(env.Error, &oo) == nil && oo["resourceType"] == "OperationOutcome" {
			if res, err := fhir.ParseResource(env.Error); err == nil {
				return param(map[string]any{"name": "outcome", "resource": map[string]any(res)})
			}
		}
		return jobs.OutcomeParameters(fhir.OutcomeFor(fhir.Invalid(envelopeErrorText(env.Error))))
	}
	result := bytes.TrimSpace(env.Result)
	if len(result) == 0 {
		return jobs.OutcomeParameters(fhir.AllOK())
	}
	switch result[0] {
	case '"':
		var s string
		if json.Unmarshal(result, &s) == nil {
			return param(map[string]any{"name": "responseBody", "valueString": s})
		}
	case 't', 'f':
		var b bool
		if json.Unmarshal(result, &b) == nil {
			return param(map[string]any{"name": "responseBody", "valueBoolean": b})
		}
	case '{':
		var head struct {
			ResourceType string `json:"resourceType"`
		}
		if json.Unmarshal(result, &head) == nil && head.ResourceType == "OperationOutcome" {
			if res, err := fhir.ParseResource(result); err == nil {
				return param(map[string]any{"name": "outcome", "resource": map[string]any(res)})
			}
		}
	}
	var compact bytes.Buffer
	if json.Compact(&compact, result) != nil {
		compact.Reset()
		compact.Write(result)
	}
	return param(map[string]any{"name": "responseBody", "valueString": compact.String()})
}

// registerJobs adds the job status routes (the reference's
// /fhir/R4/job/<id>/status, and AsyncJob/<id>/$cancel).
func (h *Handler) registerJobs(r *mux.Router) {
	if h.jobs == nil {
		return
	}
	r.HandleFunc("/job/{id}/status", h.jobStatus).Methods(http.MethodGet)
	r.HandleFunc("/job/{id}/status", h.jobCancel).Methods(http.MethodDelete)
	r.HandleFunc("/AsyncJob/{id}/$cancel", h.jobCancel).Methods(http.MethodPost)
}

// jobStatus answers a job's AsyncJob: 202 while it waits (accepted) or runs
// (active), 200 once it completed, failed or was cancelled.
func (h *Handler) jobStatus(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	job, err := h.jobs.Get(r.Context(), p, mux.Vars(r)["id"])
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
	if st := job.String("status"); st == jobs.StatusAccepted || st == jobs.StatusActive {
		status = http.StatusAccepted
		w.Header().Set("Content-Location", h.jobStatusURL(job.ID()))
	}
	httpx.WriteJSON(w, status, httpx.FHIRJSON, body)
}

// jobCancel cancels a job: DELETE on its status answers 202 as the
// reference does (the FHIR asynchronous pattern), POST AsyncJob/<id>/$cancel
// 200 All OK.
func (h *Handler) jobCancel(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	if err := h.jobs.Cancel(r.Context(), p, mux.Vars(r)["id"]); err != nil {
		h.fail(w, r, err)
		return
	}
	if r.Method == http.MethodDelete {
		httpx.WriteOutcome(w, r, http.StatusAccepted, fhir.Accepted(""))
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}
