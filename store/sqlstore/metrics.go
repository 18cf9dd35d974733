package sqlstore

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"modernc.org/sqlite"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// The operations whose time and errors the store reports. A read or a
// search inside a transaction counts in the transaction's time only.
const (
	opRead        = "read"        // Read, ReadVersion
	opHistory     = "history"     // History
	opSearch      = "search"      // Search, its count included
	opTransaction = "transaction" // InTx: every write, from BEGIN (SQLite's write lock included) to COMMIT
	// opBegin is the start of InTx's transaction alone: the wait for a
	// pooled connection and, on SQLite, for the write lock, which a writer
	// that finds it taken waits for in SQLite's busy handler, sleeping 1,
	// 2, 5, 10, 15, 20, 25 ms and so on between tries (docs/performance.md).
	opBegin = "begin"
)

// storeMetrics say how long the database takes and when it fails, apart
// from what a request does with the answer.
type storeMetrics struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

func newStoreMetrics(reg prometheus.Registerer, dialect Dialect) *storeMetrics {
	if reg == nil {
		return nil
	}
	labels := prometheus.Labels{"store": string(dialect)}
	m := &storeMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "sandbot_store_operation_duration_seconds",
			Help:        "Time of store operations outside transactions (read, history, search) and of whole transactions (transaction: every write, from BEGIN to COMMIT; begin: the wait for a connection and, on SQLite, for the write lock, before the transaction's first statement), whatever their outcome.",
			Buckets:     []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
			ConstLabels: labels,
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "sandbot_store_errors_total",
			Help:        "Store operations that failed because of the database, by operation and kind: unavailable (unreachable, restarting, out of connections, a deadlock broken: answered 503), timeout, database (any other error the database returned: SQLite busy past its timeout, a constraint, a disk error). A caller's error (not found, a conflict, an invalid resource) is not counted.",
			ConstLabels: labels,
		}, []string{"op", "kind"}),
	}
	reg.MustRegister(m.duration, m.errors)
	// Every error series exists from the start, so that the first error is
	// an increase that rate() sees.
	for _, op := range []string{opRead, opHistory, opSearch, opTransaction} {
		for _, kind := range []string{"unavailable", "timeout", "database"} {
			m.errors.WithLabelValues(op, kind)
		}
	}
	return m
}

// observe records an operation of s that began at start and ended with
// err, unless it ran inside a transaction (whose own time covers it).
func (s *Store) observe(op string, start time.Time, err error) {
	m := s.metrics
	if m == nil || s.tx != nil {
		return
	}
	m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if kind := errorKind(err); kind != "" {
		m.errors.WithLabelValues(op, kind).Inc()
	}
}

// errorKind tells the database's failures from the caller's: "" for no
// error, a canceled request and an error the store or its caller chose (a
// *fhir.Error: not found, conflict, invalid).
func errorKind(err error) string {
	if err == nil || errors.Is(err, context.Canceled) {
		return ""
	}
	if store.IsUnavailable(err) {
		return "unavailable"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	var fe *fhir.Error
	if errors.As(err, &fe) {
		return ""
	}
	var pgErr interface{ SQLState() string }
	var liteErr *sqlite.Error
	if errors.As(err, &pgErr) || errors.As(err, &liteErr) {
		return "database"
	}
	return ""
}
