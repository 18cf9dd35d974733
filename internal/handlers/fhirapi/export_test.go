package fhirapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
)

// runExport starts an export and waits for its manifest: the types and
// counts of its files, and the resources of each file by type.
func runExport(t *testing.T, c *servertest.Client, path string) (map[string]any, map[string][]map[string]any) {
	t.Helper()
	r := c.DoWith("POST", "fhir/R4/"+path, nil, "", map[string]string{"Prefer": "respond-async"})
	if r.Status != 202 {
		t.Fatalf("%s: %d %s", path, r.Status, r.Body)
	}
	status := r.Header.Get("Content-Location")
	if !strings.HasPrefix(status, c.Base()+"fhir/R4/bulkdata/export/") {
		t.Fatalf("Content-Location %q", status)
	}
	deadline := time.Now().Add(30 * time.Second)
	var manifest map[string]any
	for {
		r := c.Do("GET", strings.TrimPrefix(status, c.Base()), nil, "")
		if r.Status == 200 {
			manifest = r.JSON()
			break
		}
		if r.Status != 202 || time.Now().After(deadline) {
			t.Fatalf("status: %d %s", r.Status, r.Body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	files := map[string][]map[string]any{}
	for _, o := range manifest["output"].([]any) {
		typ := servertest.Field(o, "type").(string)
		u := servertest.Field(o, "url").(string)
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Authorization", "Bearer "+c.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("file %s: %d %s", u, resp.StatusCode, body)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
			var res map[string]any
			if err := json.Unmarshal([]byte(line), &res); err != nil || res["resourceType"] != typ {
				t.Fatalf("file %s: line %q", u, line)
			}
			files[typ] = append(files[typ], res)
		}
	}
	return manifest, files
}

func typeCounts(files map[string][]map[string]any) string {
	var out []string
	for typ, list := range files {
		out = append(out, fmt.Sprintf("%s:%d", typ, len(list)))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// TestBulkExport: $export at each level, with _type, _since and
// _typeFilter, answered asynchronously with NDJSON files of the caller's
// resources, bounded by the caller's access like a search; cancellation.
func TestBulkExport(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "export")
		var pats []string
		for i := range 2 {
			pats = append(pats, c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": fmt.Sprint("p", i)}}})["id"].(string))
		}
		for i, pat := range []string{pats[0], pats[0], pats[1]} {
			c.Create(map[string]any{"resourceType": "Observation", "status": "final",
				"code":    map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": fmt.Sprint("code-", i)}}},
				"subject": map[string]any{"reference": "Patient/" + pat}})
		}
		c.Create(map[string]any{"resourceType": "Organization", "name": "Clinic"})
		group := c.Create(map[string]any{"resourceType": "Group", "type": "person", "actual": true,
			"member": []any{map[string]any{"entity": map[string]any{"reference": "Patient/" + pats[0]}}}})["id"].(string)

		if r := c.Do("GET", "fhir/R4/$export", nil, ""); r.Status != 400 {
			t.Errorf("without Prefer: %d", r.Status)
		}
		for _, bad := range []string{"$export?_type=Nothing", "$export?_since=yesterday", "$export?_outputFormat=text/csv",
			"$export?_typeFilter=Observation", "$export?_elements=id", "Group/nope/$export"} {
			r := c.DoWith("POST", "fhir/R4/"+bad, nil, "", map[string]string{"Prefer": "respond-async"})
			if r.Status != 400 && r.Status != 404 {
				t.Errorf("%s: %d %s", bad, r.Status, r.Body)
			}
		}

		manifest, files := runExport(t, c, "$export?_type=Patient,Observation")
		if got := typeCounts(files); got != "Observation:3 Patient:2" {
			t.Errorf("system export: %s", got)
		}
		if manifest["requiresAccessToken"] != true || !strings.Contains(manifest["request"].(string), "$export") {
			t.Errorf("manifest %s", mustJSON(manifest))
		}
		if _, files := runExport(t, c, "$export"); files["Organization"] == nil || files["Group"] == nil || files["Patient"] == nil {
			t.Errorf("every type: %s", typeCounts(files))
		}
		if _, files := runExport(t, c, "Patient/$export"); typeCounts(files) != "Observation:3 Patient:2" {
			t.Errorf("Patient export: %s", typeCounts(files))
		}
		if _, files := runExport(t, c, "Group/"+group+"/$export"); typeCounts(files) != "Observation:2 Patient:1" {
			t.Errorf("Group export: %s", typeCounts(files))
		}
		future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
		if _, files := runExport(t, c, "$export?_type=Patient&_since="+future); len(files) != 0 {
			t.Errorf("_since in the future: %s", typeCounts(files))
		}
		if _, files := runExport(t, c, "$export?_type=Observation&_typeFilter=Observation%3Fcode%3Dcode-1"); typeCounts(files) != "Observation:1" {
			t.Errorf("_typeFilter: %s", typeCounts(files))
		}
		// A member who may read Patients only exports Patients.
		m := memberWithPolicy(t, s, c, "Patient", "Binary")
		if _, files := runExport(t, m, "$export"); typeCounts(files) != "Patient:2" {
			t.Errorf("a member with Patients only: %s", typeCounts(files))
		}
		// Another project exports none of these.
		other := s.NewProject(t, "not mine")
		if _, files := runExport(t, other, "$export?_type=Patient"); len(files) != 0 {
			t.Errorf("another project: %s", typeCounts(files))
		}
		// Cancelled: its status is gone.
		r := c.DoWith("POST", "fhir/R4/$export", nil, "", map[string]string{"Prefer": "respond-async"})
		status := strings.TrimPrefix(r.Header.Get("Content-Location"), c.Base())
		if r := c.Do("DELETE", status, nil, ""); r.Status != 202 {
			t.Errorf("cancel: %d %s", r.Status, r.Body)
		}
		if r := c.Do("GET", status, nil, ""); r.Status != 404 && r.Status != 200 {
			t.Errorf("after cancel: %d %s", r.Status, r.Body)
		}
	})
}
