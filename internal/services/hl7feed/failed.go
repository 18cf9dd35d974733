package hl7feed

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/store"
)

// A message whose bot failed for good (its attempts used up, or an answer
// of the bot's own with an error status) is written as an AsyncJob of its
// project: type FailedType, status error, request naming the Agent's
// channel, and output a Parameters with the message, its control id, the
// Agent, the Bot, the error and the attempts. AsyncJobs are the server's to
// write and, through /fhir/R4, only the project's admins read them
// (fhirservice.Rules), so `AsyncJob?type=hl7-message&status=error` lists a
// project's failed messages to its admins. Rerun runs one again: its task
// is enqueued again (its channel's partition, not deduplicated) and the
// AsyncJob becomes accepted, then completed when the bot succeeds, or error
// again.

// failed writes (or, for a message run again, updates) the failed message
// of t.
func (s *Service) failed(ctx context.Context, job *jobs.Job, t *task, cause error) (string, error) {
	now := time.Now().UTC().Format(fhir.TimeFormat)
	out := map[string]any{"resourceType": "Parameters", "parameter": []any{
		map[string]any{"name": "message", "valueString": t.Message},
		map[string]any{"name": "controlId", "valueString": t.Control},
		map[string]any{"name": "agent", "valueReference": map[string]any{"reference": "Agent/" + t.Agent}},
		map[string]any{"name": "channel", "valueString": t.Channel},
		map[string]any{"name": "bot", "valueReference": map[string]any{"reference": "Bot/" + t.Bot}},
		map[string]any{"name": "error", "valueString": cause.Error()},
		map[string]any{"name": "attempts", "valueInteger": job.Attempt},
		map[string]any{"name": "received", "valueInstant": t.Received.UTC().Format(fhir.TimeFormat)},
		map[string]any{"name": "ack", "valueString": t.Ack},
		map[string]any{"name": "partition", "valueString": t.Partition},
		map[string]any{"name": "remote", "valueString": t.Remote},
	}}
	scope := store.ProjectScope(job.Project)
	author := fhir.Reference{Reference: "Agent/" + t.Agent}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var id string
	err := s.store.InTx(ctx, func(tx store.Store) error {
		if t.Record != "" {
			id = t.Record
			_, err := tx.Update(ctx, scope, "AsyncJob", t.Record, store.Write{Author: author}, func(r fhir.Resource) (fhir.Resource, error) {
				r["status"] = jobs.StatusError
				r["transactionTime"] = now
				r["output"] = out
				delete(r, "extension")
				return r, nil
			})
			if !fhir.IsCode(err, fhir.ENotFound) && !fhir.IsCode(err, fhir.EGone) {
				return err
			}
			// Deleted meanwhile: written anew.
		}
		rec := fhir.Resource{"resourceType": "AsyncJob", "type": FailedType, "status": jobs.StatusError,
			"request":     "Agent/" + t.Agent + "/channel/" + url.PathEscape(t.Channel),
			"requestTime": t.Received.UTC().Format(fhir.TimeFormat), "transactionTime": now, "output": out}
		created, err := tx.Create(ctx, rec, store.Write{Project: job.Project, Author: author})
		if err == nil {
			id = created.ID
		}
		return err
	})
	return id, err
}

// rerunDone marks a failed message that was run again as completed.
func (s *Service) rerunDone(ctx context.Context, id string) error {
	_, err := s.store.Update(ctx, store.AllProjects, "AsyncJob", id, store.Write{}, func(r fhir.Resource) (fhir.Resource, error) {
		r["status"] = jobs.StatusCompleted
		r["transactionTime"] = time.Now().UTC().Format(fhir.TimeFormat)
		delete(r, "extension")
		return r, nil
	})
	if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
		return nil
	}
	return err
}

// Rerun runs a failed message (an AsyncJob of type FailedType, status
// error, or cancelled when its last run again was cancelled) again, for a project admin (or a super admin) of its project: its
// task is enqueued again, through the job engine, in the transaction that
// makes the AsyncJob accepted. Others get 403; an id outside the caller's
// projects, or not a failed message, 404; a message not failed (being run
// again, or done) 409. It answers the AsyncJob.
func (s *Service) Rerun(ctx context.Context, p *principal.Principal, id string) (fhir.Resource, error) {
	if p == nil || !p.Admin {
		return nil, fhir.Errorf(fhir.EForbidden, "Only the project's admins run a failed HL7 message again")
	}
	if !fhir.ValidID(id) {
		return nil, fhir.ErrNotFound
	}
	var answer fhir.Resource
	err := s.store.InTx(ctx, func(tx store.Store) error {
		rec, err := tx.Read(ctx, p.Scope(), "AsyncJob", id)
		if err != nil {
			return err
		}
		job, err := rec.Resource()
		if err != nil {
			return err
		}
		if job.String("type") != FailedType {
			return fhir.ErrNotFound
		}
		// error: failed; cancelled: a run again that was cancelled
		// (DELETE on its job status URL).
		if st := job.String("status"); st != jobs.StatusError && st != jobs.StatusCancelled {
			return fhir.Errorf(fhir.EConflict, "This HL7 message is %s, not failed: it is not run again", st)
		}
		t, err := taskOf(job)
		if err != nil {
			return err
		}
		t.Record = id
		payload, _ := json.Marshal(t)
		ids, err := s.cfg.Jobs.EnqueueManyIDs(ctx, tx, []jobs.Task{{Kind: taskKind, Project: rec.Project, Payload: payload,
			MaxAttempts: MaxAttempts, Partition: t.Partition}})
		if err != nil {
			return err
		}
		meta, _ := job["meta"].(map[string]any)
		author, _ := meta["author"].(map[string]any)
		ref, _ := author["reference"].(string)
		updated, err := tx.Update(ctx, p.Scope(), "AsyncJob", id, store.Write{Author: fhir.Reference{Reference: ref}, IfMatch: rec.VersionID},
			func(r fhir.Resource) (fhir.Resource, error) {
				r["status"] = jobs.StatusAccepted
				delete(r, "transactionTime")
				r["extension"] = []any{map[string]any{"url": jobs.TaskExtension, "valueString": strconv.FormatInt(ids[0], 10)}}
				return r, nil
			})
		if fhir.IsCode(err, fhir.EPrecondition) {
			return fhir.Errorf(fhir.EConflict, "This HL7 message is being run again already")
		}
		if err != nil {
			return err
		}
		answer, err = updated.Resource()
		return err
	})
	if err != nil {
		return nil, err
	}
	return answer, nil
}

// taskOf rebuilds the task of a failed message from its AsyncJob's output.
func taskOf(job fhir.Resource) (*task, error) {
	out, _ := job["output"].(map[string]any)
	params, _ := out["parameter"].([]any)
	t := &task{}
	for _, p := range params {
		m, _ := p.(map[string]any)
		str, _ := m["valueString"].(string)
		ref, _ := m["valueReference"].(map[string]any)
		refID := func(typ string) string {
			r, _ := ref["reference"].(string)
			got, id, _ := fhir.SplitReference(r)
			if got != typ {
				return ""
			}
			return id
		}
		switch m["name"] {
		case "message":
			t.Message = str
		case "controlId":
			t.Control = str
		case "agent":
			t.Agent = refID("Agent")
		case "channel":
			t.Channel = str
		case "bot":
			t.Bot = refID("Bot")
		case "ack":
			t.Ack = str
		case "partition":
			t.Partition = str
		case "remote":
			t.Remote = str
		case "received":
			s, _ := m["valueInstant"].(string)
			t.Received, _ = time.Parse(time.RFC3339Nano, s)
		}
	}
	if t.Message == "" || t.Bot == "" || t.Agent == "" {
		return nil, fhir.Errorf(fhir.EBusinessRule, "The failed message's AsyncJob lacks its message, Bot or Agent")
	}
	return t, nil
}
