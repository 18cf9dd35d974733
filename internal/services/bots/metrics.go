package bots

import "github.com/prometheus/client_golang/prometheus"

// metrics are the service's execution metrics (the runtime keeps those of
// the sandbox).
type metrics struct {
	inputBytes         *prometheus.HistogramVec
	executions         *prometheus.CounterVec
	auditDropped       prometheus.Counter
	auditLag           prometheus.Histogram
	auditWaits         prometheus.Counter
	auditJournalFailed prometheus.Counter
	auditJournalSync   prometheus.Histogram
	reg                prometheus.Registerer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		inputBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandbot_bot_input_bytes",
			Help:    "Size of bot inputs, by request content type.",
			Buckets: prometheus.ExponentialBuckets(64, 4, 10),
		}, []string{"content_type"}),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_bot_executions_by_trigger_total",
			Help: "Bot executions by what triggered them (request, job, local) and how they ended: ok, bot_error (the bot returned an error), failed (a trap, its deadline, a limit), refused (no capacity: 429 or tried again later), error (the server's).",
		}, []string{"trigger", "outcome"}),
		auditDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_audit_events_dropped_total",
			Help: "Execution AuditEvents not written because the database failed (the execution was answered all the same).",
		}),
		auditWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_audit_queue_full_total",
			Help: "Executions that found the audit writer's queue (or the audit journal's backlog) full and waited for room before answering.",
		}),
		auditJournalFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_audit_journal_failures_total",
			Help: "Execution AuditEvents the audit journal could not put on disk (each was stored at once instead, on its execution's goroutine).",
		}),
		auditJournalSync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_bot_audit_journal_sync_seconds",
			Help:    "Time the audit journal's appends took to reach the disk (write and fsync), which every execution that ended meanwhile waits for.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .004, .008, .016, .032, .064, .128},
		}),
		auditLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_bot_audit_write_lag_seconds",
			Help:    "Time from an execution's end to the commit of its AuditEvent (its count is the events written).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		reg: reg,
	}
	if reg != nil {
		reg.MustRegister(m.inputBytes, m.executions, m.auditDropped, m.auditLag, m.auditWaits, m.auditJournalFailed, m.auditJournalSync)
	}
	return m
}

// watchAuditQueue exports how many events wait for the audit writer, and
// how much room there is before executions wait: the in-memory queue's
// capacity, or the journal's bytes not stored yet against their limit.
func (m *metrics) watchAuditQueue(queued func() int, room ...prometheus.Collector) {
	if m.reg == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sandbot_bot_audit_queue_depth",
		Help: "Execution AuditEvents waiting for the audit writer.",
	}, func() float64 { return float64(queued()) }))
	m.reg.MustRegister(room...)
}

// gauge is a gauge of f's value.
func gauge(name, help string, f func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
}

func (m *metrics) observeInput(contentType string, n int) {
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
