package httpx_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
)

type tracedOutcome struct {
	ResourceType string `json:"resourceType"`
	ID           string `json:"id"`
	Issue        []struct {
		Severity, Code string
		Details        struct{ Text string }
		Diagnostics    string
	} `json:"issue"`
	Extension []struct {
		URL       string `json:"url"`
		Extension []struct {
			URL     string `json:"url"`
			ValueID string `json:"valueId"`
		} `json:"extension"`
	} `json:"extension"`
}

func (o *tracedOutcome) tracing() map[string]string {
	out := map[string]string{}
	for _, e := range o.Extension {
		if e.URL != fhir.TracingExtensionURL {
			continue
		}
		for _, x := range e.Extension {
			out[x.URL] = x.ValueID
		}
	}
	return out
}

const panicText = "secret internal detail: password=hunter2"

func newRouter(t *testing.T, logs io.Writer) (*mux.Router, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r := mux.NewRouter()
	r.Use(httpx.Middleware(slog.New(slog.NewTextHandler(logs, nil)), httpx.NewMetrics(reg)))
	r.HandleFunc("/panic/{id}", func(w http.ResponseWriter, r *http.Request) { panic(panicText) })
	r.HandleFunc("/panic-after-write", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		panic(panicText)
	})
	r.HandleFunc("/internal", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, r, slog.New(slog.DiscardHandler), errors.New(panicText))
	})
	r.HandleFunc("/ok/{id}", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, "application/json", map[string]any{"requestId": httpx.RequestID(r.Context()), "traceId": httpx.TraceID(r.Context())})
	})
	r.HandleFunc("/body", func(w http.ResponseWriter, r *http.Request) {
		b, err := httpx.ReadBody(r, 10)
		if err != nil {
			httpx.WriteError(w, r, slog.New(slog.DiscardHandler), err)
			return
		}
		w.Write(b)
	})
	return r, reg
}

func TestPanicIsGeneric500(t *testing.T) {
	var logs bytes.Buffer
	h, reg := newRouter(t, &logs)
	for _, path := range []string{"/panic/123", "/internal"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 500 {
			t.Fatalf("%s: status %d", path, rec.Code)
		}
		if ct := rec.Header().Get("Content-Type"); ct != httpx.FHIRJSON {
			t.Errorf("%s: Content-Type %q", path, ct)
		}
		body := rec.Body.String()
		if strings.Contains(body, "hunter2") || strings.Contains(body, "secret internal") || strings.Contains(body, "goroutine") {
			t.Errorf("%s: body leaks the panic: %s", path, body)
		}
		var o tracedOutcome
		if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
		if o.ResourceType != "OperationOutcome" || len(o.Issue) != 1 || o.Issue[0].Severity != "error" || o.Issue[0].Code != "exception" ||
			o.Issue[0].Details.Text != "Internal server error" || o.Issue[0].Diagnostics != "" {
			t.Errorf("%s: outcome %s", path, body)
		}
		reqID := rec.Header().Get("X-Request-Id")
		if reqID == "" || o.tracing()["requestId"] != reqID {
			t.Errorf("%s: X-Request-Id %q, outcome requestId %q", path, reqID, o.tracing()["requestId"])
		}
		if o.tracing()["traceId"] == "" {
			t.Errorf("%s: no traceId", path)
		}
	}
	// The panic is logged (with the request id), not sent.
	if !strings.Contains(logs.String(), "hunter2") || !strings.Contains(logs.String(), "panic") {
		t.Errorf("panic not logged: %s", logs.String())
	}
	// The panic counts as a 500 of the route template.
	if n := testutil.CollectAndCount(reg, "sandbot_http_request_duration_seconds"); n == 0 {
		t.Error("no request metrics")
	}
	want := `route="/panic/{id}"`
	if !strings.Contains(gather(t, reg), want) || !strings.Contains(gather(t, reg), `code="500"`) {
		t.Errorf("metrics lack %s with code 500:\n%s", want, gather(t, reg))
	}
	if strings.Contains(gather(t, reg), "/panic/123") {
		t.Error("metrics carry a raw path")
	}
}

func TestPanicAfterHeadersKeepsStatus(t *testing.T) {
	h, _ := newRouter(t, io.Discard)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/panic-after-write", nil))
	if rec.Code != http.StatusAccepted || strings.Contains(rec.Body.String(), "hunter2") {
		t.Errorf("status %d body %q", rec.Code, rec.Body.String())
	}
}

func TestRequestAndTraceIDs(t *testing.T) {
	h, _ := newRouter(t, io.Discard)
	const trace = "0af7651916cd43dd8448eb211c80319c"
	for _, tc := range []struct {
		what      string
		header    map[string]string
		wantTrace string
	}{
		{"X-Trace-Id UUID", map[string]string{"X-Trace-Id": "3b7e1f64-3d5c-4f0a-9a55-9a7c2b1e0f11"}, "3b7e1f64-3d5c-4f0a-9a55-9a7c2b1e0f11"},
		{"traceparent", map[string]string{"traceparent": "00-" + trace + "-b7ad6b7169203331-01"}, trace},
		{"bad X-Trace-Id is replaced", map[string]string{"X-Trace-Id": "<script>"}, ""},
		{"bad traceparent is replaced", map[string]string{"traceparent": "00-xyz-01"}, ""},
	} {
		req := httptest.NewRequest("GET", "/ok/1", nil)
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var got map[string]string
		json.Unmarshal(rec.Body.Bytes(), &got)
		if got["requestId"] == "" || got["requestId"] != rec.Header().Get("X-Request-Id") {
			t.Errorf("%s: requestId %q, header %q", tc.what, got["requestId"], rec.Header().Get("X-Request-Id"))
		}
		if tc.wantTrace != "" && got["traceId"] != tc.wantTrace {
			t.Errorf("%s: traceId %q, want %q", tc.what, got["traceId"], tc.wantTrace)
		}
		if tc.wantTrace == "" && (got["traceId"] == "" || strings.ContainsAny(got["traceId"], "<>")) {
			t.Errorf("%s: traceId %q", tc.what, got["traceId"])
		}
	}
	// Two requests never share a request id.
	a, b := httptest.NewRecorder(), httptest.NewRecorder()
	h.ServeHTTP(a, httptest.NewRequest("GET", "/ok/1", nil))
	h.ServeHTTP(b, httptest.NewRequest("GET", "/ok/1", nil))
	if a.Header().Get("X-Request-Id") == b.Header().Get("X-Request-Id") {
		t.Error("request ids repeat")
	}
}

func TestReadBodyLimit(t *testing.T) {
	h, _ := newRouter(t, io.Discard)
	for _, tc := range []struct {
		body    string
		chunked bool
		status  int
	}{
		{"0123456789", false, 200},
		{"0123456789x", false, 413},
		{"0123456789", true, 200},
		{"0123456789x", true, 413}, // no Content-Length: the reader stops at the limit
	} {
		req := httptest.NewRequest("POST", "/body", strings.NewReader(tc.body))
		if tc.chunked {
			req.ContentLength = -1
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("%d bytes (chunked %v): %d, want %d", len(tc.body), tc.chunked, rec.Code, tc.status)
		}
		if tc.status == 413 {
			var o tracedOutcome
			json.Unmarshal(rec.Body.Bytes(), &o)
			if o.ID != "content-too-large" || len(o.Issue) == 0 || o.Issue[0].Code != "too-long" {
				t.Errorf("413 outcome: %s", rec.Body.String())
			}
		}
	}
}

func TestErrorStatuses(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		id     string
		code   string
	}{
		{fhir.Invalid("x"), 400, "", "invalid"},
		{fhir.ErrUnauthorized, 401, "unauthorized", "login"},
		{fhir.ErrForbidden, 403, "forbidden", "forbidden"},
		{fhir.ErrNotFound, 404, "not-found", "not-found"},
		{fhir.Errorf(fhir.EConflict, "c"), 409, "conflict", "conflict"},
		{fhir.ErrGone, 410, "gone", "deleted"},
		{fhir.Errorf(fhir.EPrecondition, "p"), 412, "precondition-failed", "processing"},
		{fhir.Errorf(fhir.EMultipleMatches, "m"), 412, "multiple-matches", "multiple-matches"},
		{fhir.Errorf(fhir.ETooLarge, "big"), 413, "content-too-large", "too-long"},
		{fhir.Errorf(fhir.EUnsupportedMedia, "u"), 415, "unsupported-media-type", "not-supported"},
		{fhir.Errorf(fhir.EBusinessRule, "b"), 422, "business-rule", "business-rule"},
		{fhir.Errorf(fhir.EThrottled, "t"), 429, "too-many-requests", "throttled"},
		{errors.New("boom"), 500, "", "exception"},
	} {
		req := httptest.NewRequest("GET", "/", nil)
		rec := httptest.NewRecorder()
		httpx.WriteError(rec, req, slog.New(slog.DiscardHandler), tc.err)
		var o tracedOutcome
		json.Unmarshal(rec.Body.Bytes(), &o)
		if rec.Code != tc.status || o.ID != tc.id || len(o.Issue) != 1 || o.Issue[0].Code != tc.code {
			t.Errorf("%v: %d %s, want %d id %q code %q", tc.err, rec.Code, rec.Body.String(), tc.status, tc.id, tc.code)
		}
	}
}

func gather(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			for _, l := range m.GetLabel() {
				b.WriteString(" " + l.GetName() + "=\"" + l.GetValue() + "\"")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
