// Package server assembles sandbot's HTTP surface from its parts: the API
// router (auth, FHIR, admin) and the ops router (metrics, liveness,
// readiness). cmd/sandbot and the HTTP tests build the server the same way,
// so what is tested is what runs.
package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/adminapi"
	"github.com/sandbot/sandbot/internal/handlers/authapi"
	"github.com/sandbot/sandbot/internal/handlers/fhirapi"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/mail"
	"github.com/sandbot/sandbot/internal/services/admin"
	"github.com/sandbot/sandbot/internal/services/auth"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/internal/services/bulkexport"
	"github.com/sandbot/sandbot/internal/services/fhirgraphql"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/internal/services/hl7feed"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/internal/services/schedules"
	"github.com/sandbot/sandbot/internal/services/subscriptions"
	"github.com/sandbot/sandbot/internal/webhook"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// Config configures the server.
type Config struct {
	// BaseURL is the public base URL, ending in "/".
	BaseURL           string
	AdminClientID     string
	AdminClientSecret string
	TokenTTL          time.Duration
	// Limits bound request bodies, bot executions and the auth endpoints;
	// zero fields take the defaults. The bot runtime is given the same
	// limits by whoever builds it.
	Limits  limits.Limits
	Version string
	// Dialect names the store's database for /healthcheck.
	Dialect string
	// Runtime runs bots; nil serves no Bot operations.
	Runtime *runtime.Runtime
	// ModuleArtifactKey authenticates the compiled bot modules replicas
	// share through the store (SANDBOT_MODULE_ARTIFACT_KEY); empty uses a
	// key kept in the store (docs/decisions.md 41).
	ModuleArtifactKey []byte
	// SMTPURL sends invitation e-mails (smtp://[user:pass@]host[:port]?from=…,
	// smtps://…); empty logs them instead (SANDBOT_SMTP_URL).
	SMTPURL string
	// AppBaseURL is where the web app is served, ending in "/": invitation
	// and password-reset links point at its set-password page, and its
	// origin may call the API from a browser. Empty means BaseURL.
	AppBaseURL string
	// CORSOrigins are the other origins whose browser applications may call
	// the API (SANDBOT_CORS_ORIGINS).
	CORSOrigins []string
	// TrustedProxies are the load balancers whose forwarded-for headers give
	// the client address (SANDBOT_TRUSTED_PROXIES); empty trusts none.
	TrustedProxies httpx.TrustedProxies
	// WebhookAllow are the ranges that Subscriptions' HTTP hooks may call
	// although they are not public (SANDBOT_WEBHOOK_ALLOW).
	WebhookAllow []netip.Prefix
	// MLLP are the HL7 listeners (SANDBOT_MLLP_ADDRS); they need a runtime
	// and the job engine.
	MLLP []hl7feed.Listener
	// AuditJournalDir holds the bot audit journal: an execution answers
	// once its AuditEvent is on disk there (internal/services/bots,
	// journal.go). Empty keeps the events in memory until they are stored.
	AuditJournalDir string
	// Pprof serves Go's profiles under /debug/pprof/ on the ops listener,
	// which only the operator reaches (SANDBOT_PPROF).
	Pprof bool
}

// Server is the assembled server.
type Server struct {
	API  http.Handler
	Ops  http.Handler
	Auth *auth.Authenticator
	FHIR *fhirapi.Handler
	// Service is the FHIR service every resource read and write goes through.
	Service *fhirservice.Service
	Store   store.Store
	// Bootstrap says what the first-start bootstrap did.
	Bootstrap *admin.BootstrapResult
	// Admin runs the user-management use-cases.
	Admin *admin.Service
	// Bots runs bots, whatever triggers them; nil without a runtime.
	Bots *bots.Service
	// Jobs runs the background jobs of this process (asynchronous
	// executions, subscription deliveries); nil on a store that is not SQL.
	Jobs *jobs.Engine
	// Subscriptions delivers writes to the bots that Subscriptions name;
	// nil without a runtime or a job engine.
	Subscriptions *subscriptions.Service
	// Schedules runs bots on their schedules (Bot.cronString, Cron); nil
	// without a runtime or a job engine.
	Schedules *schedules.Service
	// HL7 receives HL7 messages over MLLP; nil without listeners.
	HL7 *hl7feed.Service

	ready atomic.Bool
	log   *slog.Logger
	// unsubscribe ends the subscription to the store's changes.
	unsubscribe func()
}

// New builds the server: bootstrap, tokens, routers.
func New(ctx context.Context, cfg Config, st store.Store, reg *prometheus.Registry, log *slog.Logger) (*Server, error) {
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = time.Hour
	}
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.AppBaseURL == "" {
		cfg.AppBaseURL = cfg.BaseURL
	}
	boot, err := admin.Bootstrap(ctx, st, cfg.AdminClientID, cfg.AdminClientSecret)
	if err != nil {
		return nil, err
	}
	tokens, err := auth.NewTokens(ctx, st, strings.TrimSuffix(cfg.BaseURL, "/"), cfg.TokenTTL)
	if err != nil {
		return nil, err
	}
	s := &Server{Store: st, Bootstrap: boot, log: log}
	s.Service = fhirservice.New(fhirservice.Config{Store: st, BaseURL: cfg.BaseURL, Limits: cfg.Limits})
	s.Auth = auth.NewAuthenticator(st, s.Service, tokens)
	authAPI := authapi.New(s.Auth, cfg.Limits, log)
	if sq, ok := st.(*sqlstore.Store); ok {
		s.Jobs = jobs.New(jobs.Config{Store: sq, Workers: int(cfg.Limits.JobWorkers), QueuePerProject: int(cfg.Limits.JobQueue),
			RescueAfter: time.Duration(cfg.Limits.JobRescueSeconds) * time.Second, Log: log, Registerer: reg})
	}
	fhirCfg := fhirapi.Config{FHIR: s.Service, GraphQL: fhirgraphql.New(s.Service, cfg.Limits), Auth: s.Auth, Require: authAPI.Require,
		BaseURL: cfg.BaseURL, Log: log, Limits: cfg.Limits}
	if s.Jobs != nil {
		// Bulk Data exports run as jobs, as their caller.
		fhirCfg.Export = bulkexport.New(bulkexport.Config{FHIR: s.Service, Jobs: s.Jobs, Resume: s.Auth.Resume, Log: log})
	}
	if cfg.Runtime != nil {
		s.Bots, err = bots.New(bots.Config{Store: st, FHIR: s.Service, Runtime: cfg.Runtime, Limits: cfg.Limits, Jobs: s.Jobs,
			Resume: s.Auth.Resume, ArtifactKey: cfg.ModuleArtifactKey, AuditJournalDir: cfg.AuditJournalDir, Log: log, Registerer: reg})
		if err != nil {
			return nil, err
		}
		fhirCfg.Bots = s.Bots
		if s.Jobs != nil {
			fhirCfg.Jobs = s.Jobs
			// Subscriptions run bots from the store's write hook, through
			// the job engine.
			s.Subscriptions = subscriptions.New(subscriptions.Config{Store: st.(*sqlstore.Store), FHIR: s.Service, Bots: s.Bots,
				Jobs: s.Jobs, Log: log, Registerer: reg,
				Webhooks: webhook.New(webhook.Config{Allow: cfg.WebhookAllow, Timeout: time.Duration(cfg.Limits.WebhookSeconds) * time.Second})})
			// Schedules keep a chain of tick tasks per schedule, started
			// from the store's write hook.
			s.Schedules = schedules.New(schedules.Config{Store: st.(*sqlstore.Store), Bots: s.Bots, Jobs: s.Jobs,
				Limits: cfg.Limits, Log: log, Registerer: reg})
			if len(cfg.MLLP) > 0 {
				s.HL7 = hl7feed.New(hl7feed.Config{Listeners: cfg.MLLP, Store: st.(*sqlstore.Store), Bots: s.Bots, Jobs: s.Jobs,
					Principal: s.Auth.PrincipalForUser, Limits: cfg.Limits, Log: log, Registerer: reg})
				fhirCfg.HL7 = s.HL7
			}
		}
	}
	// The GraphQL schema is generated from the embedded definitions once per
	// process, in the background from here.
	s.FHIR = fhirapi.New(fhirCfg)
	// Every cache of the server hears of every change to what it keeps,
	// whoever made it: this process (at commit, before the write returns)
	// or another replica on the database (moments later).
	s.unsubscribe = st.Subscribe(func(changes []store.Change) {
		s.Auth.Changed(changes)
		if s.Bots != nil {
			s.Bots.Changed(changes)
		}
	})

	metrics := httpx.NewMetrics(reg)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "sandbot_build_info",
		Help:        "Build information and the store (sqlite, postgres); always 1.",
		ConstLabels: prometheus.Labels{"version": cfg.Version, "store": cfg.Dialect},
	}, func() float64 { return 1 }))

	mailer, err := mail.New(cfg.SMTPURL, log)
	if err != nil {
		return nil, err
	}
	inviteMailFailures := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandbot_invite_email_failures_total",
		Help: "Invitation e-mails that could not be sent (the memberships were kept).",
	})
	reg.MustRegister(inviteMailFailures)
	s.Admin = &admin.Service{Store: st, FHIR: s.Service, Mail: mailer, BaseURL: cfg.AppBaseURL, Log: log, SuperProjectID: boot.ProjectID,
		MailFailed: inviteMailFailures.Inc}
	adminAPI := adminapi.New(s.Admin, authAPI.Require, cfg.BaseURL, cfg.Limits, log)
	s.FHIR.AddRoutes(adminAPI.RegisterFHIR)

	// Paths are not cleaned: a cleaned path would be answered with a
	// redirect to it ("/fhir/R4/Patient/..%2F..%2F.." to "/"), where a 4xx
	// is due; ids are checked where they are used.
	api := mux.NewRouter().SkipClean(true)
	api.Use(httpx.Middleware(log, metrics))
	// Answers that are one caller's (every authenticated route) or carry
	// tokens, login codes or memberships are never cached.
	api.Use(httpx.NoStore("/fhir/R4/", "/admin/", "/auth/", "/oauth2/", "/webhook/"))
	// Preflights are answered before the rate limit and authentication.
	api.Use(httpx.NewCORS(append([]string{httpx.OriginOf(cfg.AppBaseURL)}, cfg.CORSOrigins...)).Middleware)
	api.Use(s.closeWhileDraining)
	api.Use(httpx.ClientAddress(cfg.TrustedProxies))
	api.Use(authapi.RateLimit(auth.NewRateLimiter(st, cfg.Limits), log))
	api.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, "application/json", map[string]any{"ok": true})
	}).Methods(http.MethodGet)
	api.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		ok := st.Ping(r.Context()) == nil
		status := http.StatusOK
		if !ok {
			status = http.StatusServiceUnavailable
		}
		httpx.WriteJSON(w, status, "application/json", map[string]any{"ok": ok, "version": cfg.Version, cfg.Dialect: ok})
	}).Methods(http.MethodGet)
	authAPI.Register(api)
	adminAPI.Register(api)
	s.FHIR.Register(api)
	s.FHIR.RegisterWebhooks(api, auth.NewNamedRateLimiter(st, "webhook", cfg.Limits.WebhookRequestsPerMinute))
	// Last: anything unmatched is a 404 OperationOutcome, through the same
	// middleware (request id, access log, metrics) as every other route.
	api.PathPrefix("/").HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, r, log, fhir.ErrNotFound)
	})
	s.API = api

	ops := http.NewServeMux()
	ops.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ops.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	readyz := func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		switch {
		case !s.ready.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case st.Ping(ctx) != nil:
			http.Error(w, "store unreachable", http.StatusServiceUnavailable)
		default:
			w.Write([]byte("ok\n"))
		}
	}
	ops.HandleFunc("/readyz", readyz)
	if cfg.Pprof {
		ops.HandleFunc("/debug/pprof/", pprof.Index)
		ops.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		ops.HandleFunc("/debug/pprof/profile", pprof.Profile)
		ops.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		ops.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	ops.HandleFunc("/healthz", readyz)
	s.Ops = httpx.NoSniff(ops)
	s.ready.Store(true)
	if s.Jobs != nil {
		if err := s.Jobs.Start(ctx); err != nil {
			return nil, err
		}
	}
	if s.Schedules != nil {
		s.Schedules.Start(context.WithoutCancel(ctx))
	}
	if len(cfg.MLLP) > 0 {
		if s.HL7 == nil {
			return nil, errors.New("SANDBOT_MLLP_ADDRS needs the bot runtime and the job engine")
		}
		if err := s.HL7.Start(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// StopJobs stops taking background jobs and waits for the running ones
// until ctx ends; those still running then are cancelled and handed back to
// the queue, to run again in another process or after the restart.
func (s *Server) StopJobs(ctx context.Context) {
	if s.Jobs != nil {
		s.Jobs.Stop(ctx)
	}
}

// Close stops the job engine (handing back what still runs), stops
// listening to the store's changes and flushes what the server writes in
// the background (bot audit events).
func (s *Server) Close() {
	if s.HL7 != nil {
		s.HL7.Close()
	}
	now, cancel := context.WithCancel(context.Background())
	cancel()
	if s.Schedules != nil {
		s.Schedules.Close()
	}
	s.StopJobs(now)
	s.unsubscribe()
	if s.Bots != nil {
		s.Bots.Close()
	}
}

// SetReady flips readiness. Shutdown sets it false first: /readyz answers
// 503 so that load balancers stop sending new requests, while the listener
// keeps serving what still arrives (the drain).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// closeWhileDraining asks clients to close their connection after each
// answer once the server is no longer ready, so that no keep-alive
// connection is left for a load balancer to reuse at the moment the server
// closes it.
func (s *Server) closeWhileDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}
