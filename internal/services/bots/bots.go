// Package bots is the one place that runs a bot. Every trigger of a bot (a
// $execute request, an asynchronous job, and later a subscription, a
// schedule or an HL7 message) hands a typed request to Service.Execute; the
// local `sandbot bot run` uses the same execution path through RunLocal.
// The service owns what an execution is: finding the Bot as the caller may
// read it, its project and secrets, the timeout policy, loading and caching
// the compiled module (and compiling it in the background when a Bot
// changes on any replica), the event, the runtime's limits and admission,
// the bot's own FHIR calls (through the FHIR service, as the bot's
// membership), the AuditEvent, and asynchronous execution as a job. It also
// deploys code ($deploy). Errors are *fhir.Error; it knows nothing of HTTP.
package bots

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// Trigger names what started an execution: it is in the server log's audit
// line and in the metrics.
type Trigger string

// Triggers.
const (
	TriggerRequest Trigger = "request" // $execute answered in the request
	TriggerJob     Trigger = "job"     // $execute with Prefer: respond-async, run by a job
	TriggerLocal   Trigger = "local"   // sandbot bot run
	// TriggerSubscription: a Subscription's delivery (internal/services/subscriptions).
	TriggerSubscription Trigger = "subscription"
	// TriggerCron: a tick of a Bot's or a Cron's schedule (internal/services/schedules).
	TriggerCron Trigger = "cron"
	// TriggerWebhook: POST /webhook/{membership} without a token (Webhook).
	TriggerWebhook Trigger = "webhook"
	// TriggerHL7: an HL7 v2 message received over MLLP (internal/services/hl7feed).
	TriggerHL7 Trigger = "hl7"
)

// Execute asks for one execution of a Bot.
type Execute struct {
	// BotID names the Bot, or else Identifier ("system|value" or a value)
	// finds it among the Bots the caller may read, its own project's first
	// (docs/decisions.md 10).
	BotID, Identifier string
	// Caller asks; it must be able to read the Bot. The bot's own FHIR
	// calls act as the Bot's membership, never as the caller.
	Caller *principal.Principal
	// Input is the request's body, of media type ContentType; a GET has
	// none, and its Query is the input (an object of its parameters).
	Input       []byte
	ContentType string
	Query       url.Values
	// Headers are the request's headers as the event carries them
	// (lower-cased; never the credentials).
	Headers map[string]string
	TraceID string
	Trigger Trigger
	// Entities are more references the AuditEvent names (the Subscription
	// that triggered the execution).
	Entities []string
	// Attempt is the attempt of a trigger that tries again (a
	// Subscription's delivery), from 1; its AuditEvent records it. 0 for
	// one that does not.
	Attempt int
	// Details describe the first of Entities in the AuditEvent
	// (entity.detail: an HL7 message's control id and acknowledgement).
	Details []Detail
	// Async accepts the execution as a job (Prefer: respond-async) that
	// RequestURL, the URL of the request, names in its AsyncJob.
	Async      bool
	RequestURL string
}

// Detail is an AuditEvent entity.detail: a type and a string value.
type Detail struct{ Type, Value string }

// Result is what an execution answered, in the shape of an HTTP answer
// (sdk/ABI.md §3, docs/decisions.md 7-8).
type Result struct {
	// Job is the id of the AsyncJob of an asynchronous execution, which
	// has no other field.
	Job    string
	Status int
	// Outcome, when set, is the answer (the bot returned an error, or
	// nothing); otherwise Body, of ContentType.
	Outcome     *fhir.OperationOutcome
	ContentType string
	Body        []byte
	// Thrown says that the bot answered an error without a status of its
	// own choosing (a JavaScript exception, an SDK error): a failure, where
	// an error with the bot's status is its answer.
	Thrown bool
}

// Config configures the service.
type Config struct {
	Store store.Store
	// FHIR answers the bots' FHIR calls and every read and write the
	// service makes as a caller.
	FHIR    *fhirservice.Service
	Runtime *runtime.Runtime
	// Limits bound inputs, modules and the log kept in AuditEvents; zero
	// fields take the defaults. Execution limits are the Runtime's.
	Limits limits.Limits
	// Jobs runs asynchronous executions; nil runs every execution at once.
	Jobs *jobs.Engine
	// Resume resolves the submitter of an asynchronous execution again
	// when its job runs, so that a revoked login or membership fails it.
	Resume func(context.Context, principal.Credentials) (*principal.Principal, error)
	// AuditTo receives each execution's AuditEvent when there is no Store
	// (sandbot bot run); with a store they are written there.
	AuditTo func(fhir.Resource)
	// ArtifactKey authenticates the compiled modules that replicas share
	// through the store (docs/decisions.md 41), 32 bytes or more; empty
	// uses a key kept in the store.
	ArtifactKey []byte
	// AuditJournalDir holds the audit journal (journal.go): with it, an
	// execution answers once its AuditEvent is on disk; without it, once
	// its event is queued in memory.
	AuditJournalDir string
	Log             *slog.Logger
	Registerer      prometheus.Registerer
}

// Service runs bots.
type Service struct {
	cfg     Config
	store   store.Store
	fhir    *fhirservice.Service
	rt      *runtime.Runtime
	log     *slog.Logger
	metrics *metrics
	audits  *auditWriter
	parsed  parsedCache
	warmer  *moduleWarmer
	// presence tells the other replicas which modules this one holds, and
	// lets a deploy wait for them; nil when the store has no replicas.
	presence *replicaPresence
	// artifacts shares compiled modules between replicas; nil when the
	// store cannot.
	artifacts *artifacts
}

// New builds the service and registers its job handler with cfg.Jobs.
func New(cfg Config) (*Service, error) {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, store: cfg.Store, fhir: cfg.FHIR, rt: cfg.Runtime, log: cfg.Log, metrics: newMetrics(cfg.Registerer)}
	if st, ok := cfg.Store.(store.ModuleArtifacts); ok && cfg.Runtime != nil {
		s.artifacts = &artifacts{st: st, base: cfg.Store}
		if len(cfg.ArtifactKey) >= 32 {
			s.artifacts.key = cfg.ArtifactKey
		}
	}
	var journal *auditJournal
	if cfg.AuditJournalDir != "" && cfg.Store != nil {
		// What a process that died had journaled is stored by the writer,
		// before what this one journals (runJournal).
		var err error
		if journal, err = openAuditJournal(cfg.AuditJournalDir, s.metrics); err != nil {
			return nil, fmt.Errorf("bots: audit journal: %w", err)
		}
	}
	s.audits = newAuditWriter(cfg.Store, cfg.AuditTo, cfg.Log, s.metrics, auditQueue, journal)
	if st, ok := cfg.Store.(store.Replicas); ok && cfg.Runtime != nil {
		s.presence = newReplicaPresence(st, cfg.Log, cfg.Registerer)
	}
	s.warmer = newModuleWarmer(s, cfg.Registerer)
	if cfg.Jobs != nil {
		cfg.Jobs.Handle(executeJobKind, executeQueue, s.runJob)
	}
	return s, nil
}

// Changed acts on changes the store announces (store.Store.Subscribe), made
// by this process or another replica: a changed Bot has its module compiled
// in the background. A change of store.CachedTypes, which executions read
// through the store's cache (ReadCached), is recorded as seen by this
// replica (the store dropped its copy before announcing it); one committed
// here holds its write until every other live replica has seen it, so that
// the next execution anywhere reads the new Bot or Project (decision 58).
func (s *Service) Changed(changes []store.Change) {
	var bots []string
	var seen, committed int64
	for _, c := range changes {
		if c.ResourceType == "Bot" {
			bots = append(bots, c.ID)
		}
		if c.ResourceType == "" || store.CachedTypes[c.ResourceType] {
			if c.Local {
				committed = max(committed, c.Seq)
			} else {
				seen = max(seen, c.Seq)
			}
		}
	}
	if len(bots) > 0 {
		s.warmer.add(bots)
	}
	if s.presence != nil {
		if seen > 0 {
			s.presence.saw(seen)
		}
		if committed > 0 {
			s.presence.awaitSeen(committed)
		}
	}
}

// Close writes the audit events still queued and stops the background
// compiler. Stop the job engine first: its executions are audited.
func (s *Service) Close() {
	s.audits.close()
	s.warmer.close()
	if s.presence != nil {
		s.presence.close()
	}
}

// AuthorizeExecute decides, before anything of the request is read,
// whether p may run bots at all (fhirservice.Operations); which Bots it may
// run is which it may read.
func (s *Service) AuthorizeExecute(p *principal.Principal) error {
	return fhirservice.AuthorizeOperation(p, "Bot", fhirservice.OpExecute)
}

// AuthorizeDeploy decides, before the code is read, whether p may deploy
// bots at all; which Bots is which it may update.
func (s *Service) AuthorizeDeploy(p *principal.Principal) error {
	return fhirservice.AuthorizeOperation(p, "Bot", fhirservice.OpDeploy)
}

// InputLimit is the largest input of a media type (JSON types have the JSON
// body limit, every other the text limit).
func (s *Service) InputLimit(mediaType string) int64 {
	if isJSON(mediaType) {
		return s.cfg.Limits.JSONBodyBytes
	}
	return s.cfg.Limits.TextBodyBytes
}

// DeployLimit is the largest $deploy body of a media type: a module or
// code, or the reference's JSON {code, filename}, whose base64 or escaped
// text may take twice the code's size.
func (s *Service) DeployLimit(mediaType string) int64 {
	if isJSON(mediaType) {
		return 2*s.cfg.Limits.ModuleBytes + 4<<10
	}
	return s.cfg.Limits.ModuleBytes
}

// parsedOf decodes a record through the cache of decoded versions.
func (s *Service) parsedOf(rec *fhir.Record) (fhir.Resource, error) { return s.parsed.resource(rec) }

// seconds reads a positive JSON number of seconds.
func seconds(v any) (time.Duration, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	secs, err := n.Float64()
	if err != nil || secs <= 0 {
		return 0, false
	}
	const maxSecs = float64(1<<63-1) / float64(time.Second) // beyond it a Duration overflows
	return time.Duration(min(secs, maxSecs) * float64(time.Second)), true
}
