// Package httpx is sandbot's HTTP plumbing: the one place where errors become
// statuses and OperationOutcomes (a database that cannot be reached is a 503
// with Retry-After), request ids, panic recovery, access logs (which never
// carry bodies: they are patient data), request metrics, body size limits,
// and the client's address behind trusted proxies.
package httpx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/mediatype"
	"github.com/sandbot/sandbot/internal/outage"
)

// FHIRJSON is the content type of FHIR answers.
const FHIRJSON = mediatype.FHIRJSON

type ctxKey int

const (
	requestIDKey ctxKey = iota
	traceIDKey
	clientIPKey
)

// RequestID is the id of the request being served.
func RequestID(ctx context.Context) string { s, _ := ctx.Value(requestIDKey).(string); return s }

// TraceID is the trace id of the request: X-Trace-Id when it is a UUID, else
// the trace id of a valid traceparent, else a new UUID.
func TraceID(ctx context.Context) string { s, _ := ctx.Value(traceIDKey).(string); return s }

var traceparent = regexp.MustCompile(`^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$`)

func traceIDOf(r *http.Request) string {
	if t := r.Header.Get("X-Trace-Id"); t != "" {
		if _, err := uuid.Parse(t); err == nil {
			return t
		}
	}
	if m := traceparent.FindStringSubmatch(r.Header.Get("traceparent")); m != nil {
		return m[1]
	}
	return uuid.NewString()
}

// RetryAfterUnavailable is the Retry-After of a 503 (seconds): a database
// restart takes a few seconds, and clients that retry should not all come
// back at once in the first.
const RetryAfterUnavailable = "2"

// WriteError answers err. An *fhir.Error becomes its status and outcome; a
// connection-level failure of the store (outage.Is: the database
// refused, dropped or is restarting) is a 503 with Retry-After, since the
// same request may succeed in a moment; any other error is logged and
// answered with a generic 500 that carries only the request id.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	code := fhir.ErrorCodeOf(err)
	if code == fhir.EInternal && outage.Is(err) {
		log.WarnContext(r.Context(), "store unavailable", "request_id", RequestID(r.Context()), "method", r.Method, "path", r.URL.Path, "err", err)
		err, code = fhir.ErrUnavailable, fhir.EUnavailable
	}
	status := code.Status()
	switch {
	case code == fhir.EUnavailable:
		w.Header().Set("Retry-After", RetryAfterUnavailable)
	case status >= 500:
		log.ErrorContext(r.Context(), "internal error", "request_id", RequestID(r.Context()), "method", r.Method, "path", r.URL.Path, "err", err)
	}
	var fe *fhir.Error
	if errors.As(err, &fe) && fe.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(fe.RetryAfter.Seconds()))))
	}
	out := fhir.OutcomeFor(err).WithTracing(RequestID(r.Context()), TraceID(r.Context()))
	WriteJSON(w, status, FHIRJSON, out)
}

// WriteOutcome answers with an outcome and an explicit status.
func WriteOutcome(w http.ResponseWriter, r *http.Request, status int, o *fhir.OperationOutcome) {
	WriteJSON(w, status, FHIRJSON, o.WithTracing(RequestID(r.Context()), TraceID(r.Context())))
}

// WriteJSON encodes v (or sends it as-is when it is []byte or json.RawMessage).
func WriteJSON(w http.ResponseWriter, status int, contentType string, v any) {
	var body []byte
	switch t := v.(type) {
	case []byte:
		body = t
	case json.RawMessage:
		body = t
	default:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			http.Error(w, `{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"exception"}]}`, http.StatusInternalServerError)
			return
		}
		body = bytes.TrimRight(buf.Bytes(), "\n")
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// ReadBody reads at most limit bytes; more is fhir.ETooLarge (413).
func ReadBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, fhir.Errorf(fhir.ETooLarge, "Request body too large (limit %d bytes)", limit)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fhir.Invalid("Could not read request body")
	}
	if int64(len(b)) > limit {
		return nil, fhir.Errorf(fhir.ETooLarge, "Request body too large (limit %d bytes)", limit)
	}
	return b, nil
}

// ReadJSON reads a body of a JSON media type (else 415), at most limit bytes.
func ReadJSON(r *http.Request, limit int64) ([]byte, error) {
	if !IsJSON(MediaType(r)) {
		return nil, fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type")
	}
	return ReadBody(r, limit)
}

// ReadJSONObject reads a JSON object body (ReadJSON); anything but an
// object is "Content could not be parsed".
func ReadJSONObject(r *http.Request, limit int64) (map[string]any, error) {
	b, err := ReadJSON(r, limit)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return nil, fhir.Invalid("Content could not be parsed")
	}
	return m, nil
}

// MediaType is the request's media type without parameters, lower-cased.
func MediaType(r *http.Request) string { return mediatype.Of(r.Header.Get("Content-Type")) }

// IsJSON reports whether a media type is JSON: application/json or any
// application/*+json.
func IsJSON(mt string) bool { return mediatype.IsJSON(mt) }

// statusRecorder remembers the status written.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// NoSniff sets X-Content-Type-Options: nosniff on every answer of next, so
// that no browser reads an answer as another type than the one it declares
// (a patient's uploaded Binary as HTML, say). Middleware applies it to the
// API; the ops listener is wrapped in it.
func NoSniff(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		next.ServeHTTP(w, r)
	})
}

// NoStore sets Cache-Control: no-store on the answers of next whose path
// starts with one of prefixes (all of them when there is none): answers to
// authenticated requests and those that carry tokens, codes or memberships
// must not be kept by a browser or a proxy.
func NoStore(prefixes ...string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if len(prefixes) == 0 {
				w.Header().Set("Cache-Control", "no-store")
			}
			for _, p := range prefixes {
				if strings.HasPrefix(r.URL.Path, p) {
					w.Header().Set("Cache-Control", "no-store")
					break
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// Metrics are the HTTP metrics of one listener.
type Metrics struct {
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
}

// NewMetrics registers the HTTP metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandbot_http_request_duration_seconds",
			Help:    "Time to answer HTTP requests, by method, route template and status code.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"method", "route", "code"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_http_requests_in_flight",
			Help: "HTTP requests being served.",
		}),
	}
	reg.MustRegister(m.duration, m.inFlight)
	return m
}

// Middleware wraps the API: request id and trace id, nosniff, panic
// recovery, access log and metrics. The route label is the mux route template, so that ids do
// not explode the label space.
func Middleware(log *slog.Logger, m *Metrics) mux.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			reqID := uuid.NewString()
			ctx := context.WithValue(r.Context(), requestIDKey, reqID)
			ctx = context.WithValue(ctx, traceIDKey, traceIDOf(r))
			r = r.WithContext(ctx)
			w.Header().Set("X-Request-Id", reqID)
			w.Header().Set("X-Content-Type-Options", "nosniff")
			rec := &statusRecorder{ResponseWriter: w}
			if m != nil {
				m.inFlight.Inc()
				defer m.inFlight.Dec()
			}
			defer func() {
				if p := recover(); p != nil {
					if p == http.ErrAbortHandler {
						panic(p)
					}
					log.ErrorContext(ctx, "panic", "request_id", reqID, "method", r.Method, "path", r.URL.Path, "panic", p)
					if rec.status == 0 {
						WriteError(rec, r, slog.New(slog.DiscardHandler), errors.New("panic"))
					}
				}
				route := "unmatched"
				if cur := mux.CurrentRoute(r); cur != nil {
					if tpl, err := cur.GetPathTemplate(); err == nil {
						route = tpl
					}
				}
				status := rec.status
				if status == 0 {
					status = http.StatusOK
				}
				d := time.Since(start)
				if m != nil {
					m.duration.WithLabelValues(r.Method, route, strconv.Itoa(status)).Observe(d.Seconds())
				}
				log.LogAttrs(ctx, slog.LevelInfo, "request",
					slog.String("request_id", reqID),
					slog.String("method", r.Method),
					slog.String("route", route),
					slog.String("path", r.URL.Path),
					slog.Int("status", status),
					slog.Duration("duration", d),
					slog.String("remote", r.RemoteAddr))
			}()
			next.ServeHTTP(rec, r)
		})
	}
}
