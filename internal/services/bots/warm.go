package bots

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// moduleWarmer compiles, in the background, the module of every Bot that
// changed (a deploy on this replica or on another: the store announces it,
// Changed), so that the first execution on any replica finds the module
// compiled instead of compiling it on the request's time: seconds for a Go
// bot. It works through the changed Bots one at a time, so that a burst of
// deploys costs one compilation's worth of CPU at a time (runtime.Compile
// bounds compilations further); the module is compiled only if the runtime
// does not hold it already (the deploying replica does).
type moduleWarmer struct {
	s       *Service
	mu      sync.Mutex
	pending map[string]bool // Bot ids
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	warmed  *prometheus.CounterVec
}

// warmTimeout bounds one background compilation.
const warmTimeout = 5 * time.Minute

func newModuleWarmer(s *Service, reg prometheus.Registerer) *moduleWarmer {
	w := &moduleWarmer{s: s, pending: map[string]bool{}, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		warmed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_bot_modules_warmed_total",
			Help: "Changed Bots whose module was looked at in the background, by result: compiled, held (already compiled), none (no code), busy (no compile slot: tried again later), failed.",
		}, []string{"result"})}
	if reg != nil {
		reg.MustRegister(w.warmed)
	}
	go w.run()
	return w
}

// add queues Bots to look at.
func (w *moduleWarmer) add(ids []string) {
	w.mu.Lock()
	for _, id := range ids {
		w.pending[id] = true
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *moduleWarmer) close() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

func (w *moduleWarmer) run() {
	defer close(w.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-w.stop
		cancel()
	}()
	for {
		select {
		case <-w.stop:
			return
		case <-w.wake:
		}
		for {
			w.mu.Lock()
			var id string
			for id = range w.pending {
				break
			}
			delete(w.pending, id)
			w.mu.Unlock()
			if id == "" {
				break
			}
			w.warmed.WithLabelValues(w.warm(ctx, id)).Inc()
		}
	}
}

// warm compiles the module of Bot id unless the runtime holds it.
func (w *moduleWarmer) warm(ctx context.Context, id string) string {
	ctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	s := w.s
	rec, err := s.store.Read(ctx, store.AllProjects, "Bot", id)
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return "none"
		}
		s.log.Warn("bot module warm-up: read bot", "bot", id, "err", err)
		return "failed"
	}
	bot, err := rec.Resource()
	if err != nil {
		return "failed"
	}
	if code, _ := bot["executableCode"].(map[string]any); code == nil {
		return "none"
	}
	if _, ok := s.heldModule(bot); ok {
		s.moduleReady(ctx, bot)
		return "held"
	}
	start := time.Now()
	if _, err := s.module(ctx, rec.Project, bot); err != nil {
		var busy *runtime.BusyError
		if errors.As(err, &busy) {
			// Every compile slot is taken (deploys, executions of cold
			// modules): try again when one may be free.
			time.AfterFunc(busy.RetryAfter, func() { w.add([]string{id}) })
			return "busy"
		}
		s.log.Warn("bot module warm-up: compile", "bot", id, "err", err)
		return "failed"
	}
	s.log.Info("bot module compiled in the background", "bot", id, "duration", time.Since(start))
	s.moduleReady(ctx, bot)
	return "compiled"
}

// moduleReady tells the other replicas that this one holds bot's module
// (a deploy elsewhere may be waiting for it).
func (s *Service) moduleReady(ctx context.Context, bot fhir.Resource) {
	if s.presence != nil {
		s.presence.ready(ctx, deployedHash(bot))
	}
}
