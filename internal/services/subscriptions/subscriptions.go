// Package subscriptions runs bots for FHIR Subscriptions: a Subscription of
// a project, active, whose channel is a rest-hook to Bot/<id>, runs that bot
// for each write of a resource its criteria matches. The match is made in
// the writing transaction (the store's write hook), which enqueues the
// delivery as a task of the job engine: a write that rolls back delivers
// nothing, and one that commits is delivered even if its process dies right
// after. Deliveries of one Subscription for one resource run in the order
// of its versions. The delivery runs the bot through the bots service as the
// Subscription's author, who must still be able to run the Bot and to read
// the resource version; failures are tried again with backoff, and a
// Subscription whose deliveries keep failing is set to error. It knows
// nothing of HTTP.
package subscriptions

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/internal/webhook"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// The delivery task's kind and queue.
const (
	deliveryKind  = "subscription-delivery"
	deliveryQueue = "subscriptions"
)

// MaxDepth is how deep a chain of deliveries may go: a bot whose write
// triggers a delivery whose bot writes... stops here, with an AuditEvent
// that says so, so that a bot that updates the resource it watches cannot
// loop forever.
const MaxDepth = 5

// Failure tracking: a Subscription whose deliveries failed failureLimit
// times within failureWindow is set to error (the reference's failure
// tracker has the same shape).
const (
	failureLimit  = 10
	failureWindow = time.Hour
)

// Config configures the service.
type Config struct {
	Store *sqlstore.Store
	FHIR  *fhirservice.Service
	Bots  *bots.Service
	Jobs  *jobs.Engine
	// Webhooks posts to the HTTP hooks; nil delivers to bots only.
	Webhooks *webhook.Client
	Log      *slog.Logger
	// Registerer receives the delivery metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Service matches writes against Subscriptions and delivers them.
type Service struct {
	cfg     Config
	store   *sqlstore.Store
	log     *slog.Logger
	metrics *metrics

	mu    sync.Mutex
	cache map[string]*fhir.Subscription // by id/version
}

// New builds the service: it becomes the store's write hook and registers
// its task with the job engine.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, store: cfg.Store, log: cfg.Log, metrics: newMetrics(cfg.Registerer), cache: map[string]*fhir.Subscription{}}
	cfg.Jobs.HandleTasks(deliveryKind, deliveryQueue, s.deliver)
	cfg.Store.SetWriteHook(s.onWrite)
	return s
}

// delivery is a delivery task's payload.
type delivery struct {
	Subscription string `json:"subscription"`
	Interaction  string `json:"interaction"`
	Type         string `json:"type"`
	ID           string `json:"id"`
	// Version is the version written; for a delete, the version deleted.
	Version string `json:"version"`
	// Written is when the write committed (for the lag metric).
	Written time.Time `json:"written"`
	// Depth counts the deliveries that led to this write.
	Depth int `json:"depth,omitempty"`
}

type depthKey struct{}

// depthOf is how many deliveries led to the writes made under ctx.
func depthOf(ctx context.Context) int { d, _ := ctx.Value(depthKey{}).(int); return d }

// onWrite is the store's write hook: it enqueues, in the writing
// transaction, a delivery for each active Subscription of the written
// resource's project that matches the write. AuditEvents never trigger.
func (s *Service) onWrite(ctx context.Context, tx store.Store, writes []store.Written) error {
	byProject := map[string][]store.Written{}
	for _, w := range writes {
		if w.Record.ResourceType != "AuditEvent" {
			byProject[w.Record.Project] = append(byProject[w.Record.Project], w)
		}
	}
	depth := depthOf(ctx)
	for project, ws := range byProject {
		subs, err := s.active(ctx, tx, project)
		if err != nil {
			return err
		}
		if len(subs) == 0 {
			continue
		}
		for _, w := range ws {
			var res, previous fhir.Resource
			var values []fhir.IndexValue
			var version string
			previousRead := false
			for _, sub := range subs {
				if !sub.Wants(w.Interaction, w.Record.ResourceType) {
					continue
				}
				if res == nil {
					// As the store decoded and indexed it; or, for a
					// delete, decoded and indexed once per write, for the
					// subscriptions that want its type.
					res, values, version = w.Resource, w.Values, w.Record.VersionID
					if res == nil {
						var err error
						if res, version, err = versionOf(w); err != nil {
							return err
						}
						values = fhir.Extract(res)
					}
				}
				if sub.FHIRPath != nil && !previousRead && w.Interaction == "update" && len(w.Previous) > 0 {
					// %previous, decoded only for a FHIRPath criteria. One
					// that does not decode is no %previous.
					previous, _ = fhir.ParseResource(w.Previous)
					previousRead = true
				}
				if !sub.Matches(w.Interaction, res, values, previous) {
					continue
				}
				if depth >= MaxDepth {
					s.metrics.deliveries.WithLabelValues("depth_limit").Inc()
					if err := s.auditDepth(ctx, tx, project, sub.ID, w); err != nil {
						return err
					}
					continue
				}
				payload, _ := json.Marshal(delivery{Subscription: sub.ID, Interaction: w.Interaction, Type: w.Record.ResourceType,
					ID: w.Record.ID, Version: version, Written: time.Now(), Depth: depth + 1})
				if err := s.cfg.Jobs.Enqueue(ctx, tx, jobs.Task{Kind: deliveryKind, Project: project, Payload: payload,
					MaxAttempts: sub.MaxAttempts, Partition: "subscription " + sub.ID + " " + w.Record.ResourceType + "/" + w.Record.ID}); err != nil {
					return err
				}
				s.metrics.deliveries.WithLabelValues("enqueued").Inc()
			}
		}
	}
	return nil
}

// versionOf is the resource a write delivers and its version: the version
// written, or for a delete the version deleted.
func versionOf(w store.Written) (fhir.Resource, string, error) {
	if w.Interaction == "delete" {
		prev, err := fhir.ParseResource(w.Previous)
		if err != nil {
			return nil, "", err
		}
		return prev, prev.MetaVersion(), nil
	}
	res, err := w.Record.Resource()
	return res, w.Record.VersionID, err
}

// active reads the project's active Subscriptions, in the transaction (so
// that one created a moment ago on another replica is seen), decoding each
// version once (parsed). One that does not parse any more (written before a
// rule it breaks) is skipped.
func (s *Service) active(ctx context.Context, tx store.Store, project string) ([]*fhir.Subscription, error) {
	req, err := activeSearch()
	if err != nil {
		return nil, err
	}
	res, err := tx.Search(ctx, store.ProjectScope(project), req)
	if err != nil {
		return nil, err
	}
	subs := make([]*fhir.Subscription, 0, len(res.Records))
	for i := range res.Records {
		if sub := s.parsed(&res.Records[i]); sub != nil {
			subs = append(subs, sub)
		}
	}
	return subs, nil
}

// activeSearch is the search of a project's active Subscriptions, parsed
// once (every write makes it).
var activeSearch = sync.OnceValues(func() (*fhir.SearchRequest, error) {
	return fhir.ParseSearch("Subscription", "status=active&_count=1000")
})

// parsed is a Subscription version decoded, from the cache when it was
// decoded before (nil when it does not parse).
func (s *Service) parsed(rec *fhir.Record) *fhir.Subscription {
	key := rec.ID + "/" + rec.VersionID
	s.mu.Lock()
	sub, ok := s.cache[key]
	s.mu.Unlock()
	if ok {
		return sub
	}
	if r, err := rec.Resource(); err == nil {
		sub, _ = fhir.ParseSubscription(r)
	}
	s.mu.Lock()
	if len(s.cache) >= 10_000 {
		s.cache = map[string]*fhir.Subscription{}
	}
	s.cache[key] = sub
	s.mu.Unlock()
	return sub
}

// auditDepth records, in the writing transaction, a delivery not made
// because its chain was too deep.
func (s *Service) auditDepth(ctx context.Context, tx store.Store, project, sub string, w store.Written) error {
	now := time.Now().UTC().Format(fhir.TimeFormat)
	ev := fhir.Resource{
		"resourceType": "AuditEvent",
		"type":         map[string]any{"system": "https://medplum.com/CodeSystem/audit-event", "code": "execute"},
		"recorded":     now,
		"period":       map[string]any{"start": now, "end": now},
		"agent":        []any{map[string]any{"who": map[string]any{"reference": "Subscription/" + sub}, "requestor": true}},
		"source":       map[string]any{"observer": map[string]any{"reference": "Subscription/" + sub}},
		"entity": []any{
			map[string]any{"what": map[string]any{"reference": "Subscription/" + sub}, "role": map[string]any{"code": "9", "display": "Subscriber"}},
			map[string]any{"what": map[string]any{"reference": w.Record.ResourceType + "/" + w.Record.ID}, "role": map[string]any{"code": "4", "display": "Domain"}},
		},
		"outcome":     "4",
		"outcomeDesc": fmt.Sprintf("Not delivered: a chain of %d subscription deliveries is the most one write may start (a bot that writes what it watches)", MaxDepth),
	}
	_, err := tx.Create(ctx, ev, store.Write{Project: project, Author: fhir.Reference{Reference: "system"}})
	return err
}

// withDepth marks ctx as a delivery's at depth d.
func withDepth(ctx context.Context, d int) context.Context {
	return context.WithValue(ctx, depthKey{}, d)
}

// author is the principal of a Subscription's author: its membership (in
// the Subscription's project first).
func (s *Service) author(ctx context.Context, sub fhir.Resource, project string) (*principal.Principal, error) {
	ref := sub.MetaAuthor()
	if ref == "" {
		return nil, fhir.Errorf(fhir.EForbidden, "The Subscription has no author")
	}
	for _, scope := range []store.Scope{store.ProjectScope(project), store.AllProjects} {
		found, err := store.SearchResources(ctx, s.store, scope, "ProjectMembership", "profile="+ref+"&_count=2")
		if err != nil {
			return nil, err
		}
		for _, m := range found {
			if active, ok := m["active"].(bool); ok && !active {
				continue
			}
			return principal.ForMembership(ctx, s.store, m.ID())
		}
	}
	return nil, fhir.Errorf(fhir.EForbidden, "The Subscription's author %s has no membership any more", ref)
}
