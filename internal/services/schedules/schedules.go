// Package schedules runs bots on schedules: a Bot's cronString or
// cronTiming, and Cron resources, in projects whose features include
// "cron". Each schedule is a chain of tick tasks of the job engine: the
// transaction that writes the Bot or the Cron enqueues the task of its next
// tick (the store's write hook), and each tick's task enqueues the one of
// the tick after before it runs the bot. Every task is unique by (schedule,
// what it says, tick time), so two replicas, or a write and a running tick,
// never enqueue a tick twice; a tick's task whose schedule changed or went
// away since drops itself, so a change takes effect by the next tick on
// every replica. The bot runs through the bots service: a Bot's schedule as
// the Bot itself with the Bot as input, a Cron on behalf of its onBehalfOf
// membership with the Cron as input. It knows nothing of HTTP.
package schedules

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// The tick task's kind and queue.
const (
	tickKind  = "schedule-tick"
	tickQueue = "schedules"
)

// MaxAttempts is how many times a tick's execution is tried when the bot
// fails (the reference tries a cron run 3 times); a bot that answers an
// error of its own is not tried again.
const MaxAttempts = 3

// Feature is the Project.features code that turns schedules on.
const Feature = "cron"

// Config configures the service.
type Config struct {
	Store *sqlstore.Store
	Bots  *bots.Service
	Jobs  *jobs.Engine
	// Limits: CronFields 6 accepts expressions with seconds (tests).
	Limits limits.Limits
	Log    *slog.Logger
	// Registerer receives the tick metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Service keeps the schedules' chains of ticks and runs them.
type Service struct {
	cfg      Config
	store    *sqlstore.Store
	log      *slog.Logger
	seconds  bool
	ticks    *prometheus.CounterVec
	lateness prometheus.Histogram
	stop     context.CancelFunc
}

// New builds the service: it becomes a write hook of the store and
// registers its task with the job engine.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, store: cfg.Store, log: cfg.Log, seconds: cfg.Limits.CronFields == 6,
		ticks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_schedule_ticks_total",
			Help: "Schedule ticks by what became of them: ran (the bot ran), failed (the bot failed, after its attempts), retried, stale (the schedule changed or went away: dropped), enqueued.",
		}, []string{"outcome"}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_schedule_tick_lateness_seconds",
			Help:    "Time from a tick's scheduled time to the start of its execution.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 14),
		}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.ticks, s.lateness)
	}
	cfg.Jobs.HandleTasks(tickKind, tickQueue, s.tick)
	cfg.Store.AddWriteHook(s.onWrite)
	return s
}

// tick is a tick task's payload: which schedule, what it said (its Key)
// and the tick's time. River's uniqueness covers all three.
type tick struct {
	Type string    `json:"type"` // Bot or Cron
	ID   string    `json:"id"`
	Key  string    `json:"key"`
	At   time.Time `json:"at"`
}

// plan is what a schedulable resource asks: its schedule, nil when it
// asks for none now (no cronString, a Cron not active or past its end, a
// project without the feature).
type plan struct {
	sched *fhir.Schedule
	end   time.Time
	// bot and membership: what a Cron runs and on whose behalf.
	bot, membership string
}

// planOf reads a Bot's or a Cron's schedule; project is its Project.
func (s *Service) planOf(res, project fhir.Resource) *plan {
	if !hasFeature(project) {
		return nil
	}
	switch res.Type() {
	case "Bot":
		sched, err := fhir.BotSchedule(res, s.seconds)
		if err != nil || sched == nil {
			return nil
		}
		return &plan{sched: sched, bot: res.ID()}
	case "Cron":
		c, err := fhir.ParseCron(res, s.seconds)
		if err != nil || !c.Active || (!c.End.IsZero() && !time.Now().Before(c.End)) {
			return nil
		}
		return &plan{sched: c.Schedule, end: c.End, bot: c.BotID, membership: c.Membership}
	}
	return nil
}

func hasFeature(project fhir.Resource) bool {
	list, _ := project["features"].([]any)
	for _, f := range list {
		if f == Feature {
			return true
		}
	}
	return false
}

// enqueue adds, in tx, the task of the first tick of p after t (none when
// it would be past the plan's end).
func (s *Service) enqueue(ctx context.Context, tx store.Store, project, typ, id string, p *plan, after time.Time) error {
	at := p.sched.Next(after)
	if at.IsZero() || (!p.end.IsZero() && !at.Before(p.end)) {
		return nil
	}
	payload, _ := json.Marshal(tick{Type: typ, ID: id, Key: p.sched.Key(), At: at.UTC()})
	if err := s.cfg.Jobs.Enqueue(ctx, tx, jobs.Task{Kind: tickKind, Project: project, Payload: payload,
		MaxAttempts: MaxAttempts, At: at, Unique: true}); err != nil {
		return err
	}
	s.ticks.WithLabelValues("enqueued").Inc()
	return nil
}

// onWrite is the store's write hook: a Bot or a Cron written with a
// schedule gets the task of its next tick, in the writing transaction; a
// Project whose features now include cron gets them for its Bots and
// Crons. A schedule removed needs nothing: its waiting tick drops itself.
func (s *Service) onWrite(ctx context.Context, tx store.Store, writes []store.Written) error {
	for _, w := range writes {
		if w.Interaction == "delete" {
			continue
		}
		switch w.Record.ResourceType {
		case "Bot", "Cron":
			res, err := w.Record.Resource()
			if err != nil {
				return err
			}
			project, err := projectOf(ctx, tx, w.Record.Project)
			if err != nil {
				return err
			}
			if p := s.planOf(res, project); p != nil {
				if err := s.enqueue(ctx, tx, w.Record.Project, res.Type(), res.ID(), p, time.Now()); err != nil {
					return err
				}
			}
		case "Project":
			res, err := w.Record.Resource()
			if err != nil {
				return err
			}
			var prev fhir.Resource
			if w.Previous != nil {
				prev, _ = fhir.ParseResource(w.Previous)
			}
			if hasFeature(res) && !hasFeature(prev) {
				if err := s.scheduleProject(ctx, tx, res); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func projectOf(ctx context.Context, st store.Store, id string) (fhir.Resource, error) {
	rec, err := st.Read(ctx, store.AllProjects, "Project", id)
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return fhir.Resource{}, nil
		}
		return nil, err
	}
	return rec.Resource()
}

// scheduleProject enqueues the next ticks of a project's scheduled Bots
// and Crons (its features just turned cron on, or the server starts).
func (s *Service) scheduleProject(ctx context.Context, tx store.Store, project fhir.Resource) error {
	for _, typ := range []string{"Bot", "Cron"} {
		for offset := 0; ; offset += 500 {
			found, err := store.SearchResources(ctx, tx, store.ProjectScope(project.ID()), typ, "_count=500&_offset="+itoa(offset))
			if err != nil {
				return err
			}
			for _, res := range found {
				if p := s.planOf(res, project); p != nil {
					if err := s.enqueue(ctx, tx, project.ID(), typ, res.ID(), p, time.Now()); err != nil {
						return err
					}
				}
			}
			if len(found) < 500 {
				break
			}
		}
	}
	return nil
}

// Start makes sure, in the background, that every schedule of every
// project with the feature has the task of its next tick: schedules written
// before this server version, or whose chain was lost, resume. Every
// replica does it at start; the tasks' uniqueness makes the second a
// no-op.
func (s *Service) Start(ctx context.Context) {
	ctx, s.stop = context.WithCancel(ctx)
	go func() {
		if err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("schedules not resumed", "err", err)
		}
	}()
}

// Close stops what Start began.
func (s *Service) Close() {
	if s.stop != nil {
		s.stop()
	}
}

func (s *Service) reconcile(ctx context.Context) error {
	for offset := 0; ; offset += 100 {
		projects, err := store.SearchResources(ctx, s.store, store.AllProjects, "Project", "_count=100&_offset="+itoa(offset))
		if err != nil {
			return err
		}
		for _, pr := range projects {
			if !hasFeature(pr) {
				continue
			}
			if err := s.store.InTx(ctx, func(tx store.Store) error { return s.scheduleProject(ctx, tx, pr) }); err != nil {
				return err
			}
		}
		if len(projects) < 100 {
			return nil
		}
	}
}

// tick runs a tick task: if its schedule still says what it said when the
// tick was enqueued, the next tick is enqueued (in a transaction of its own,
// committed before the bot runs, so that a bot that fails or a process that
// dies does not end the chain) and the bot runs. A tick that comes late
// (no replica ran at its time) runs once, and the next is the first after
// now: missed ticks are not run one by one.
func (s *Service) tick(ctx context.Context, job *jobs.Job) error {
	var t tick
	if err := json.Unmarshal(job.Payload, &t); err != nil {
		return jobs.Permanent(err)
	}
	rec, err := s.store.Read(ctx, store.ProjectScope(job.Project), t.Type, t.ID)
	if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
		s.ticks.WithLabelValues("stale").Inc()
		return nil
	}
	if err != nil {
		return err
	}
	res, err := rec.Resource()
	if err != nil {
		return jobs.Permanent(err)
	}
	project, err := projectOf(ctx, s.store, job.Project)
	if err != nil {
		return err
	}
	p := s.planOf(res, project)
	if p == nil || p.sched.Key() != t.Key {
		s.ticks.WithLabelValues("stale").Inc()
		return nil
	}
	if job.Attempt == 1 {
		s.lateness.Observe(time.Since(t.At).Seconds())
	}
	now := time.Now()
	after := t.At
	if now.After(after) {
		after = now
	}
	if err := s.store.InTx(ctx, func(tx store.Store) error {
		return s.enqueue(ctx, tx, job.Project, t.Type, t.ID, p, after)
	}); err != nil {
		return err
	}
	return s.run(ctx, job, t, rec, p)
}

// run runs the bot of a tick through the bots service.
func (s *Service) run(ctx context.Context, job *jobs.Job, t tick, rec *fhir.Record, p *plan) error {
	ex := bots.Execute{BotID: p.bot, Input: rec.JSON, ContentType: "application/fhir+json", Trigger: bots.TriggerCron,
		Headers: map[string]string{"content-type": "application/fhir+json", "x-sandbot-schedule-tick": t.At.Format(time.RFC3339)}}
	if t.Type == "Cron" {
		caller, err := principal.ForMembership(ctx, s.store, p.membership)
		if err != nil || caller.ProjectID != job.Project {
			s.ticks.WithLabelValues("failed").Inc()
			s.log.Warn("scheduled bot not run: its Cron's onBehalfOf membership is gone or inactive", "cron", t.ID, "project", job.Project)
			return jobs.Permanent(fhir.Errorf(fhir.EForbidden, "Cron.onBehalfOf is not an active membership of the project"))
		}
		ex.Caller = caller
		ex.Entities = []string{"Cron/" + t.ID}
	} else {
		ex.Caller = bots.AsBot(job.Project, p.bot)
	}
	res, err := s.cfg.Bots.Execute(ctx, ex)
	final := func(err error) error {
		s.ticks.WithLabelValues("failed").Inc()
		return jobs.Permanent(err)
	}
	retry := func(err error) error {
		if job.Attempt >= job.MaxAttempts {
			return final(err)
		}
		s.ticks.WithLabelValues("retried").Inc()
		return err
	}
	switch {
	case err == nil && res.Thrown:
		return retry(fhir.Errorf(fhir.EInvalid, "the bot failed"))
	case err == nil && res.Status >= 400:
		return final(fhir.Errorf(fhir.EInvalid, "the bot answered %d", res.Status))
	case err == nil:
		s.ticks.WithLabelValues("ran").Inc()
		return nil
	case fhir.IsCode(err, fhir.EThrottled):
		var fe *fhir.Error
		after := time.Second
		if errors.As(err, &fe) && fe.RetryAfter > 0 {
			after = fe.RetryAfter
		}
		return &jobs.RetryError{After: after, Reason: err.Error()}
	case fhir.IsCode(err, fhir.EInvalid):
		return retry(err)
	case fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) || ctx.Err() != nil:
		return err
	default:
		// The Bot is gone, or the caller may not run it.
		return final(err)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
