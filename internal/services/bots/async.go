package bots

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/runtime"
)

// Asynchronous execution (medplum-wire-behaviour 7.10): an execution asked
// with Async is checked as a synchronous one would be (the caller may read
// the Bot, bots are enabled, the input parses), then accepted as a job of
// the job engine; a worker in some server process runs it later as the
// caller, through run like any execution.

// executeJobKind is the kind of the jobs of asynchronous executions, and
// executeQueue their queue.
const (
	executeJobKind = "bot-execute"
	executeQueue   = "bot_execute"
)

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

// submit accepts an execution as a job.
func (s *Service) submit(ctx context.Context, p *principal.Principal, rec *fhir.Record, c call, requestURL string) (*Result, error) {
	payload, err := json.Marshal(executionJob{Caller: principal.CredentialsOf(p), Bot: rec.ID, ContentType: c.mediaType,
		Input: c.input, Headers: c.headers, TraceID: c.traceID})
	if err != nil {
		return nil, err
	}
	job, err := s.cfg.Jobs.Submit(ctx, p, executeJobKind, requestURL, payload)
	if err != nil {
		return nil, err
	}
	return &Result{Job: job.ID, Status: 202}, nil
}

// runJob runs an asynchronous execution (a jobs.Handler). The caller is
// resolved again, so a revoked login, a removed member or a deleted client
// fails the job; the Bot is read again as the caller. What the bot did
// becomes the job's output as the reference shapes it; a job that could not
// run ends in error with the reason as its outcome; a full execution budget
// sends the job back to wait for capacity.
func (s *Service) runJob(ctx context.Context, job *jobs.Job) (jobs.Outcome, error) {
	var in executionJob
	if err := json.Unmarshal(job.Payload, &in); err != nil {
		return jobs.ErrorOutcome(fhir.Invalid("The job's request cannot be read")), nil
	}
	p, err := s.cfg.Resume(ctx, in.Caller)
	if err != nil {
		if fhir.IsCode(err, fhir.EUnauthorized) {
			return jobs.ErrorOutcome(fhir.Errorf(fhir.EUnauthorized, "The job's submitter is no longer authorized: its login, client or membership was revoked since the job was accepted")), nil
		}
		return jobOutcomeOrRetry(err)
	}
	if err := s.AuthorizeExecute(p); err != nil {
		return jobOutcomeOrRetry(err)
	}
	rec, err := s.fhir.Load(ctx, p, "Bot", in.Bot)
	if err != nil {
		return jobOutcomeOrRetry(err)
	}
	t, err := s.resolve(ctx, rec)
	if err != nil {
		return jobOutcomeOrRetry(err)
	}
	c := call{mediaType: in.ContentType, input: in.Input, headers: in.Headers, traceID: in.TraceID, trigger: TriggerJob}
	res, err := s.run(ctx, p, t, c)
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
// (the database unavailable) is returned for the engine to try again.
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
		var str string
		if json.Unmarshal(result, &str) == nil {
			return param(map[string]any{"name": "responseBody", "valueString": str})
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
