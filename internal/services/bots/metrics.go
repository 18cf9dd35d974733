package bots

import "github.com/prometheus/client_golang/prometheus"

// metrics are the service's execution metrics (the runtime keeps those of
// the sandbox).
type metrics struct {
	inputBytes   *prometheus.HistogramVec
	executions   *prometheus.CounterVec
	auditDropped prometheus.Counter
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
			Help: "Execution AuditEvents not written because the writer was saturated or failed.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.inputBytes, m.executions, m.auditDropped)
	}
	return m
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
