package rest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// botMetrics are the execution metrics that need the request (the runtime
// keeps the rest).
type botMetrics struct {
	inputBytes   *prometheus.HistogramVec
	auditDropped prometheus.Counter
}

func newBotMetrics(reg prometheus.Registerer) *botMetrics {
	m := &botMetrics{
		inputBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandbot_bot_input_bytes",
			Help:    "Size of bot inputs, by request content type.",
			Buckets: prometheus.ExponentialBuckets(64, 4, 10),
		}, []string{"content_type"}),
		auditDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_audit_events_dropped_total",
			Help: "Execution AuditEvents not written because the writer was saturated or failed.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.inputBytes, m.auditDropped)
	}
	return m
}

func (m *botMetrics) observeInput(contentType string, n int) {
	if contentType == "" {
		contentType = "query"
	}
	switch contentType {
	case mediaText, mediaJSON, mediaFHIR, mediaForm, mediaHL7, "query":
	default:
		contentType = "other+json"
	}
	m.inputBytes.WithLabelValues(contentType).Observe(float64(n))
}

// auditWriter writes one AuditEvent per execution off the request path: an
// execution answers without waiting for its audit row.
type auditWriter struct {
	store   store.Store
	log     *slog.Logger
	metrics *botMetrics
	ch      chan auditEntry
	done    chan struct{}
	once    sync.Once
}

// auditEntry is what an execution hands to the writer: the AuditEvent
// itself is built by the writer's goroutine, so that its allocations (and the
// garbage-collection work they bring) are not charged to the request.
type auditEntry struct {
	project    string
	bot        string // "Bot/<id>"
	requester  string
	outcome    string
	desc       string
	start, end time.Time
}

// event builds the AuditEvent of an execution, as the reference records it.
func (e *auditEntry) event() fhir.Resource {
	ev := fhir.Resource{
		"resourceType": "AuditEvent",
		"type":         map[string]any{"system": "https://medplum.com/CodeSystem/audit-event", "code": "execute"},
		"recorded":     e.end.Format(fhir.TimeFormat),
		"period":       map[string]any{"start": e.start.Format(fhir.TimeFormat), "end": e.end.Format(fhir.TimeFormat)},
		"agent": []any{
			map[string]any{"who": map[string]any{"reference": e.requester}, "requestor": true},
			map[string]any{"who": map[string]any{"reference": e.bot}, "requestor": false},
		},
		"source":  map[string]any{"observer": map[string]any{"reference": e.bot}},
		"entity":  []any{map[string]any{"what": map[string]any{"reference": e.bot}, "role": map[string]any{"code": "4"}}},
		"outcome": e.outcome,
	}
	if e.desc != "" {
		ev["outcomeDesc"] = e.desc
	}
	return ev
}

func newAuditWriter(s store.Store, log *slog.Logger, m *botMetrics) *auditWriter {
	a := &auditWriter{store: s, log: log, metrics: m, ch: make(chan auditEntry, 4096), done: make(chan struct{})}
	go a.run()
	return a
}

// auditBatch bounds how many events one transaction writes: batching keeps
// the writer from competing with executions for the database under load.
const auditBatch = 256

// auditWindow is how long a batch may wait for more events: under load the
// batches fill up, and a lone execution's event is written within it.
const auditWindow = 20 * time.Millisecond

func (a *auditWriter) run() {
	defer close(a.done)
	batch := make([]auditEntry, 0, auditBatch)
	for e := range a.ch {
		batch = append(batch[:0], e)
		window := time.NewTimer(auditWindow)
	fill:
		for len(batch) < auditBatch {
			select {
			case more, ok := <-a.ch:
				if !ok {
					break fill
				}
				batch = append(batch, more)
			case <-window.C:
				break fill
			}
		}
		window.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := a.store.InTx(ctx, func(tx store.Store) error {
			byProject := map[string][]fhir.Resource{}
			for i := range batch {
				byProject[batch[i].project] = append(byProject[batch[i].project], batch[i].event())
			}
			for project, events := range byProject {
				if err := tx.CreateMany(ctx, events, store.Write{Project: project, Author: fhir.Reference{Reference: "system"}}); err != nil {
					return err
				}
			}
			return nil
		})
		cancel()
		if err != nil {
			a.metrics.auditDropped.Add(float64(len(batch)))
			a.log.Warn("bot audit events not written", "count", len(batch), "err", err)
		}
	}
}

func (a *auditWriter) close() {
	a.once.Do(func() { close(a.ch) })
	<-a.done
}

func (a *auditWriter) add(e auditEntry) {
	select {
	case a.ch <- e:
	default:
		a.metrics.auditDropped.Inc()
	}
}

// audit records an execution as the reference does (Bot.auditEventTrigger:
// always (default), never, on-error, on-output).
func (h *Handler) audit(ctx context.Context, p *principal.Principal, rec *store.Record, bot fhir.Resource, res *runtime.Result, err error) {
	var logs strings.Builder
	if res != nil {
		for _, l := range res.Logs {
			logs.WriteString(l.Text)
			logs.WriteByte('\n')
		}
	}
	failed := err != nil || (res != nil && len(res.Envelope.Error) > 0)
	switch bot.String("auditEventTrigger") {
	case "never":
		return
	case "on-error":
		if !failed {
			return
		}
	case "on-output":
		if logs.Len() == 0 {
			return
		}
	}
	desc := logs.String()
	if err != nil {
		desc += err.Error()
	}
	keep := int(max(h.cfg.Limits.BotLogBytes, 0))
	if len(desc) > keep {
		desc = desc[len(desc)-keep:]
	}
	now := time.Now().UTC()
	start := now
	if res != nil {
		start = now.Add(-res.Duration)
	}
	outcome := "0"
	if failed {
		outcome = "4"
	}
	h.audits.add(auditEntry{project: rec.Project, bot: "Bot/" + rec.ID, requester: p.Profile,
		outcome: outcome, desc: desc, start: start, end: now})
}
