package subscriptions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/internal/webhook"
	"github.com/sandbot/sandbot/store"
)

// deliver runs a delivery task: the Subscription's Bot on the resource
// version, as the Subscription's author. A Subscription no longer active,
// or a version its author may not read (its access narrowed since), is
// skipped. A bot that failed (a timeout, a trap, out of memory, a thrown
// error) is tried again; one that answered an error with a status of its
// choosing (4xx) is not.
func (s *Service) deliver(ctx context.Context, job *jobs.Job) error {
	var d delivery
	if err := json.Unmarshal(job.Payload, &d); err != nil {
		return jobs.Permanent(err)
	}
	srec, err := s.store.Read(ctx, store.ProjectScope(job.Project), "Subscription", d.Subscription)
	if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
		s.metrics.deliveries.WithLabelValues("skipped").Inc()
		return nil
	}
	if err != nil {
		return err
	}
	sub, err := srec.Resource()
	if err != nil {
		return err
	}
	parsed, err := fhir.ParseSubscription(sub)
	if err != nil || !parsed.Active || parsed.BotID == "" && (parsed.URL == "" || s.cfg.Webhooks == nil) {
		s.metrics.deliveries.WithLabelValues("skipped").Inc()
		return nil
	}
	author, err := s.author(ctx, sub, job.Project)
	if err != nil {
		return s.failed(ctx, job, d, err, true)
	}
	// The version as its author may read it now: a member whose access was
	// narrowed or removed since receives nothing.
	vrec, err := s.cfg.FHIR.VRead(ctx, author, d.Type, d.ID, d.Version)
	if err != nil {
		if fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) {
			return err
		}
		s.metrics.deliveries.WithLabelValues("not_readable").Inc()
		return nil
	}
	if d.Depth == 1 {
		s.metrics.lag.Observe(time.Since(d.Written).Seconds())
	}
	if parsed.URL != "" {
		return s.post(ctx, job, d, parsed, vrec.JSON)
	}
	input, contentType := vrec.JSON, "application/fhir+json"
	if d.Interaction == "delete" {
		input, _ = json.Marshal(map[string]json.RawMessage{"deletedResource": vrec.JSON})
		contentType = "application/json"
	}
	headers := map[string]string{
		"content-type":           contentType,
		"x-medplum-subscription": d.Subscription,
		"x-medplum-interaction":  d.Interaction,
	}
	if d.Interaction == "delete" {
		headers["x-medplum-deleted-resource"] = d.Type + "/" + d.ID
	}
	res, err := s.cfg.Bots.Execute(withDepth(ctx, d.Depth), bots.Execute{BotID: parsed.BotID, Caller: author, Input: input,
		ContentType: contentType, Headers: headers, Trigger: bots.TriggerSubscription, Attempt: job.Attempt,
		Entities: []string{"Subscription/" + d.Subscription, d.Type + "/" + d.ID + "/_history/" + d.Version}})
	switch {
	case err == nil && res.Thrown:
		// An error the bot did not give a status (a thrown exception): a
		// failure, tried again.
		return s.failed(ctx, job, d, fhir.Errorf(fhir.EInvalid, "the bot failed"), false)
	case err == nil && res.Status >= 400:
		// The bot answered an error of its own (a 4xx it chose): not tried
		// again.
		return s.failed(ctx, job, d, fhir.Errorf(fhir.EInvalid, "the bot answered %d", res.Status), true)
	case err == nil:
		s.metrics.deliveries.WithLabelValues("delivered").Inc()
		return nil
	case fhir.IsCode(err, fhir.EThrottled):
		var fe *fhir.Error
		after := time.Second
		if errors.As(err, &fe) && fe.RetryAfter > 0 {
			after = fe.RetryAfter
		}
		return &jobs.RetryError{After: after, Reason: err.Error()}
	case fhir.IsCode(err, fhir.EInvalid):
		// The bot failed (bots.Execute answers a failure as a 400).
		return s.failed(ctx, job, d, err, false)
	case fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) || ctx.Err() != nil:
		return err
	default:
		// The author may not run the Bot any more, or it is gone.
		return s.failed(ctx, job, d, err, true)
	}
}

// post delivers to an HTTP hook: the resource version as the reference
// sends it (an empty object for a delete, which a header names), signed
// when the Subscription has a secret. An answer outside the success codes
// is a failure, tried again; an address the server may not call is final.
// Each attempt leaves an AuditEvent.
func (s *Service) post(ctx context.Context, job *jobs.Job, d delivery, sub *fhir.Subscription, resource []byte) error {
	body := resource
	headers := []webhook.Header{
		{Name: "Content-Type", Value: "application/fhir+json"},
		{Name: "X-Medplum-Subscription", Value: d.Subscription},
		{Name: "X-Medplum-Interaction", Value: d.Interaction},
	}
	if d.Interaction == "delete" {
		body = []byte("{}")
		headers = append(headers, webhook.Header{Name: "X-Medplum-Deleted-Resource", Value: d.Type + "/" + d.ID})
	}
	if sub.Secret != "" {
		headers = append(headers, webhook.Header{Name: "X-Signature", Value: webhook.Sign(sub.Secret, body)})
	}
	for _, h := range sub.Headers {
		headers = append(headers, webhook.Header{Name: h[0], Value: h[1]})
	}
	start := time.Now()
	status, err := s.cfg.Webhooks.Post(ctx, sub.URL, body, headers)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var desc string
	ok := err == nil && sub.Delivered(status)
	switch {
	case errors.Is(err, webhook.ErrRefusedAddress):
		desc = "not sent: the endpoint's address is not a public one (the operator may allow it: SANDBOT_WEBHOOK_ALLOW)"
	case err != nil:
		desc = "not delivered: " + err.Error()
	default:
		desc = "POST answered " + strconv.Itoa(status)
	}
	s.auditAttempt(ctx, job, d, ok, desc, start)
	if ok {
		s.metrics.deliveries.WithLabelValues("delivered").Inc()
		return nil
	}
	return s.failed(ctx, job, d, errors.New(desc), errors.Is(err, webhook.ErrRefusedAddress))
}

// auditAttempt records one attempt of an HTTP hook's delivery (a bot's
// attempts are the bots service's AuditEvents).
func (s *Service) auditAttempt(ctx context.Context, job *jobs.Job, d delivery, ok bool, desc string, start time.Time) {
	outcome := "0"
	if !ok {
		outcome = "4"
	}
	end := time.Now().UTC()
	ev := fhir.Resource{
		"resourceType": "AuditEvent",
		"type":         map[string]any{"system": "https://medplum.com/CodeSystem/audit-event", "code": "transmit"},
		"recorded":     end.Format(fhir.TimeFormat),
		"period":       map[string]any{"start": start.UTC().Format(fhir.TimeFormat), "end": end.Format(fhir.TimeFormat)},
		"agent":        []any{map[string]any{"who": map[string]any{"reference": "Subscription/" + d.Subscription}, "requestor": true}},
		"source":       map[string]any{"observer": map[string]any{"reference": "Subscription/" + d.Subscription}},
		"entity": []any{
			map[string]any{"what": map[string]any{"reference": "Subscription/" + d.Subscription}, "role": map[string]any{"code": "9", "display": "Subscriber"},
				"detail": []any{map[string]any{"type": "attempt", "valueString": strconv.Itoa(job.Attempt)}}},
			map[string]any{"what": map[string]any{"reference": d.Type + "/" + d.ID + "/_history/" + d.Version}, "role": map[string]any{"code": "4", "display": "Domain"}},
		},
		"outcome":     outcome,
		"outcomeDesc": fmt.Sprintf("Attempt %d of %d: %s", job.Attempt, job.MaxAttempts, desc),
	}
	if _, err := s.store.Create(ctx, ev, store.Write{Project: job.Project, Author: fhir.Reference{Reference: "system"}}); err != nil {
		s.log.Warn("the AuditEvent of a delivery was not written", "subscription", d.Subscription, "err", err)
	}
}

// failed records a failed attempt: the task is tried again unless final is
// set or its attempts are used up; a Subscription that keeps failing is set
// to error.
func (s *Service) failed(ctx context.Context, job *jobs.Job, d delivery, err error, final bool) error {
	last := final || job.Attempt >= job.MaxAttempts
	if !last {
		s.metrics.deliveries.WithLabelValues("retried").Inc()
		return err
	}
	s.metrics.deliveries.WithLabelValues("failed").Inc()
	hits, _, cerr := s.store.CountHit(ctx, "subscription-failures "+d.Subscription, failureWindow)
	if cerr == nil && hits >= failureLimit {
		s.disable(ctx, job.Project, d.Subscription, err)
	}
	return jobs.Permanent(err)
}

// disable sets a Subscription whose deliveries keep failing to error.
func (s *Service) disable(ctx context.Context, project, id string, cause error) {
	sys := principal.System(project, fhir.Reference{Reference: "system"})
	_, err := s.cfg.FHIR.Modify(ctx, sys, "Subscription", id, func(r fhir.Resource) (fhir.Resource, error) {
		if r.String("status") != "active" {
			return r, nil
		}
		r["status"] = "error"
		r["error"] = "Set to error by the server: " + itoa(failureLimit) + " deliveries failed within an hour; the last: " + cause.Error() +
			". Set the status to active again to resume deliveries."
		return r, nil
	})
	if err != nil {
		s.log.Warn("subscription not set to error", "subscription", id, "err", err)
		return
	}
	s.metrics.disabled.Inc()
	s.log.Warn("subscription set to error after failed deliveries", "subscription", id, "project", project)
}

func itoa(n int) string { return strconv.Itoa(n) }

type metrics struct {
	deliveries *prometheus.CounterVec
	lag        prometheus.Histogram
	disabled   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_subscription_deliveries_total",
			Help: "Subscription deliveries by what became of them: enqueued (in the writing transaction), delivered, retried (a failed attempt tried again), failed (given up), skipped (the Subscription no longer active), not_readable (its author may not read the version), depth_limit (a chain too deep).",
		}, []string{"outcome"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_subscription_delivery_lag_seconds",
			Help:    "Time from a write's commit to the start of its first delivery attempt's execution.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}),
		disabled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_subscriptions_disabled_total",
			Help: "Subscriptions the server set to error because their deliveries kept failing.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.deliveries, m.lag, m.disabled)
	}
	return m
}
