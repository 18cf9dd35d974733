package fhirapi_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/sandbot/sandbot/internal/servertest"
)

// gatherMetric is the series of the metric name in s's registry (none when
// it has not been observed).
func gatherMetric(t testing.TB, s *servertest.Server, name string) []*dto.Metric {
	t.Helper()
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// outcome is the decoded OperationOutcome of a response.
type outcome struct {
	ResourceType string `json:"resourceType"`
	ID           string `json:"id"`
	Issue        []struct {
		Severity string `json:"severity"`
		Code     string `json:"code"`
		Details  struct {
			Text string `json:"text"`
		} `json:"details"`
	} `json:"issue"`
}

// wantOutcome checks that r is an OperationOutcome with the status, issue
// code and (when text is not empty) details.text given.
func wantOutcome(t *testing.T, what string, r *servertest.Response, status int, code, text string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("%s: status %d, want %d: %s", what, r.Status, status, r.Body)
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/fhir+json") {
		t.Errorf("%s: Content-Type %q, want application/fhir+json", what, ct)
	}
	var o outcome
	if err := json.Unmarshal(r.Body, &o); err != nil || o.ResourceType != "OperationOutcome" || len(o.Issue) == 0 {
		t.Errorf("%s: not an OperationOutcome: %s", what, r.Body)
		return
	}
	if code != "" && o.Issue[0].Code != code {
		t.Errorf("%s: issue code %q, want %q: %s", what, o.Issue[0].Code, code, r.Body)
	}
	if text != "" && o.Issue[0].Details.Text != text {
		t.Errorf("%s: issue text %q, want %q", what, o.Issue[0].Details.Text, text)
	}
}

// entries returns the entry list of a Bundle response.
func entries(t *testing.T, r *servertest.Response) []map[string]any {
	t.Helper()
	var b struct {
		Entry []map[string]any `json:"entry"`
	}
	if err := json.Unmarshal(r.Body, &b); err != nil {
		t.Fatalf("bundle: %v: %s", err, r.Body)
	}
	return b.Entry
}

// entryIDs returns the ids of the entries' resources, in order.
func entryIDs(t *testing.T, r *servertest.Response) []string {
	t.Helper()
	var out []string
	for _, e := range entries(t, r) {
		res, _ := e["resource"].(map[string]any)
		id, _ := res["id"].(string)
		out = append(out, id)
	}
	return out
}

// links returns the Bundle links by relation.
func links(t *testing.T, r *servertest.Response) map[string]string {
	t.Helper()
	var b struct {
		Link []struct{ Relation, URL string } `json:"link"`
	}
	if err := json.Unmarshal(r.Body, &b); err != nil {
		t.Fatalf("bundle: %v", err)
	}
	out := map[string]string{}
	for _, l := range b.Link {
		if _, dup := out[l.Relation]; dup {
			t.Errorf("duplicate link %q", l.Relation)
		}
		out[l.Relation] = l.URL
	}
	return out
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func equalSets(a, b []string) bool { return slices.Equal(sorted(a), sorted(b)) }

// get is servertest.Field, the nested field of a decoded JSON object.
var get = servertest.Field

func str(v any, path ...string) string { s, _ := get(v, path...).(string); return s }

// jsonOf is v encoded as JSON.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
