package fhirapi_test

import (
	"net/http"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/servertest"
)

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// checkVersionHeaders checks ETag and Last-Modified against the body's meta.
func checkVersionHeaders(t *testing.T, what string, r *servertest.Response) {
	t.Helper()
	body := r.JSON()
	vid := str(body, "meta", "versionId")
	if got, want := r.Header.Get("ETag"), `W/"`+vid+`"`; got != want || vid == "" {
		t.Errorf("%s: ETag %q, want %q", what, got, want)
	}
	lu, err := time.Parse(fhir.TimeFormat, str(body, "meta", "lastUpdated"))
	if err != nil {
		t.Errorf("%s: meta.lastUpdated %q is not an instant: %v", what, str(body, "meta", "lastUpdated"), err)
		return
	}
	lm, err := http.ParseTime(r.Header.Get("Last-Modified"))
	if err != nil || !lm.Equal(lu.Truncate(time.Second)) {
		t.Errorf("%s: Last-Modified %q, want %s", what, r.Header.Get("Last-Modified"), lu.Truncate(time.Second).Format(http.TimeFormat))
	}
}

func TestCreateReadVread(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "crud")
		before := time.Now().Add(-time.Second)
		r := c.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient", "id": "client-chosen", "gender": "female",
			"meta": map[string]any{"tag": []any{map[string]any{"system": "urn:t", "code": "kept"}}}}, "")
		if r.Status != 201 {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		body := r.JSON()
		id, vid := str(body, "id"), str(body, "meta", "versionId")
		if !uuidRE.MatchString(id) || id == "client-chosen" {
			t.Errorf("id %q: want a server-assigned UUID", id)
		}
		if vid == "" || vid == id {
			t.Errorf("versionId %q", vid)
		}
		if got, want := r.Header.Get("Location"), s.URL+"fhir/R4/Patient/"+id+"/_history/"+vid; got != want {
			t.Errorf("Location %q, want %q", got, want)
		}
		checkVersionHeaders(t, "create", r)
		if ct := r.Header.Get("Content-Type"); ct != "application/fhir+json; charset=utf-8" {
			t.Errorf("Content-Type %q", ct)
		}
		lu, _ := time.Parse(fhir.TimeFormat, str(body, "meta", "lastUpdated"))
		if lu.Before(before) || lu.After(time.Now().Add(time.Second)) {
			t.Errorf("lastUpdated %v is not now", lu)
		}
		if got := str(body, "meta", "project"); got != c.ProjectID {
			t.Errorf("meta.project %q, want %q", got, c.ProjectID)
		}
		if got := str(body, "meta", "author", "reference"); got != c.Profile {
			t.Errorf("meta.author %q, want %q", got, c.Profile)
		}
		if str(body, "gender") != "female" || get(body, "meta", "tag") == nil {
			t.Errorf("client fields lost: %s", r.Body)
		}

		read := c.Do("GET", "fhir/R4/Patient/"+id, nil, "")
		if read.Status != 200 || str(read.JSON(), "id") != id || str(read.JSON(), "meta", "versionId") != vid || str(read.JSON(), "gender") != "female" {
			t.Fatalf("read: %d %s", read.Status, read.Body)
		}
		checkVersionHeaders(t, "read", read)
		if read.Header.Get("Location") != "" {
			t.Errorf("read has a Location header")
		}

		vr := c.Do("GET", "fhir/R4/Patient/"+id+"/_history/"+vid, nil, "")
		if vr.Status != 200 || str(vr.JSON(), "meta", "versionId") != vid {
			t.Errorf("vread: %d %s", vr.Status, vr.Body)
		}
		checkVersionHeaders(t, "vread", vr)

		for _, tc := range []struct{ what, path string }{
			{"unknown id", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000"},
			{"invalid id", "fhir/R4/Patient/not%20an%20id"},
			{"unknown version", "fhir/R4/Patient/" + id + "/_history/00000000-0000-0000-0000-000000000000"},
			{"id of another type", "fhir/R4/Practitioner/" + id},
		} {
			wantOutcome(t, tc.what, c.Do("GET", tc.path, nil, ""), 404, "not-found", "")
		}
	})
}

func TestUpdate(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "update")
		p := c.Create(map[string]any{"resourceType": "Patient", "gender": "female"})
		id, v1 := str(p, "id"), str(p, "meta", "versionId")
		path := "fhir/R4/Patient/" + id

		r := c.Do("PUT", path, map[string]any{"resourceType": "Patient", "id": id, "gender": "male"}, "")
		if r.Status != 200 {
			t.Fatalf("update: %d %s", r.Status, r.Body)
		}
		v2 := str(r.JSON(), "meta", "versionId")
		if v2 == "" || v2 == v1 || str(r.JSON(), "gender") != "male" || str(r.JSON(), "meta", "project") != c.ProjectID {
			t.Errorf("update body: %s", r.Body)
		}
		checkVersionHeaders(t, "update", r)
		if got := c.Do("GET", path, nil, ""); str(got.JSON(), "gender") != "male" {
			t.Errorf("read after update: %s", got.Body)
		}
		if got := c.Do("GET", path+"/_history/"+v1, nil, ""); got.Status != 200 || str(got.JSON(), "gender") != "female" {
			t.Errorf("vread of the first version: %d %s", got.Status, got.Body)
		}

		for _, tc := range []struct {
			what    string
			body    any
			ifMatch string
			status  int
			code    string
			text    string
		}{
			{"type mismatch", map[string]any{"resourceType": "Practitioner", "id": id}, "", 400, "invalid", "Incorrect resource type"},
			{"id mismatch", map[string]any{"resourceType": "Patient", "id": "00000000-0000-0000-0000-000000000000"}, "", 400, "invalid", "Incorrect resource ID"},
			{"missing id", map[string]any{"resourceType": "Patient"}, "", 400, "invalid", "Incorrect resource ID"},
			{"stale If-Match", map[string]any{"resourceType": "Patient", "id": id, "gender": "other"}, `W/"` + v1 + `"`, 412, "processing", ""},
		} {
			r := c.DoWith("PUT", path, tc.body, "", map[string]string{"If-Match": tc.ifMatch})
			wantOutcome(t, tc.what, r, tc.status, tc.code, tc.text)
		}
		if got := c.Do("GET", path, nil, ""); str(got.JSON(), "meta", "versionId") != v2 {
			t.Errorf("a refused update changed the resource: %s", got.Body)
		}
		r = c.DoWith("PUT", path, map[string]any{"resourceType": "Patient", "id": id, "gender": "other"}, "", map[string]string{"If-Match": `W/"` + v2 + `"`})
		if r.Status != 200 || str(r.JSON(), "gender") != "other" {
			t.Errorf("update with current If-Match: %d %s", r.Status, r.Body)
		}
		wantOutcome(t, "update of a missing resource", c.Do("PUT", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000",
			map[string]any{"resourceType": "Patient", "id": "00000000-0000-0000-0000-000000000000"}, ""), 404, "not-found", "")
	})
}

func TestDelete(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "delete")
		id := str(c.Create(map[string]any{"resourceType": "Patient"}), "id")
		path := "fhir/R4/Patient/" + id
		for i := range 2 { // deleting again is still 200
			r := c.Do("DELETE", path, nil, "")
			wantOutcome(t, "delete", r, 200, "informational", "All OK")
			if o := r.JSON(); o["id"] != "ok" {
				t.Errorf("delete %d: outcome id %v, want ok", i, o["id"])
			}
		}
		r := c.Do("GET", path, nil, "")
		wantOutcome(t, "read after delete", r, 410, "deleted", "Gone")
		if r.JSON()["id"] != "gone" {
			t.Errorf("outcome id %v, want gone", r.JSON()["id"])
		}
		wantOutcome(t, "update after delete", c.Do("PUT", path, map[string]any{"resourceType": "Patient", "id": id}, ""), 410, "deleted", "")
		wantOutcome(t, "delete of a missing resource", c.Do("DELETE", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000", nil, ""), 404, "not-found", "")
		if got := entryIDs(t, c.Do("GET", "fhir/R4/Patient?_id="+id, nil, "")); len(got) != 0 {
			t.Errorf("search finds a deleted resource: %v", got)
		}
	})
}

func TestPatch(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "patch")
		p := c.Create(map[string]any{"resourceType": "Patient", "gender": "female", "name": []any{map[string]any{"family": "Before"}}})
		id, v1 := str(p, "id"), str(p, "meta", "versionId")
		path := "fhir/R4/Patient/" + id
		const jp = "application/json-patch+json"

		r := c.Do("PATCH", path, `[{"op":"replace","path":"/gender","value":"male"},{"op":"add","path":"/name/0/given","value":["G"]},{"op":"test","path":"/id","value":"`+id+`"}]`, jp)
		if r.Status != 200 {
			t.Fatalf("patch: %d %s", r.Status, r.Body)
		}
		b := r.JSON()
		if str(b, "gender") != "male" || str(b, "meta", "versionId") == v1 || str(b, "id") != id {
			t.Errorf("patched: %s", r.Body)
		}
		checkVersionHeaders(t, "patch", r)
		if got := c.Do("GET", path+"?name=x", nil, ""); got.Status != 200 || str(got.JSON(), "gender") != "male" {
			t.Errorf("read after patch: %s", got.Body)
		}
		if got := entryIDs(t, c.Do("GET", "fhir/R4/Patient?given=g", nil, "")); !slices.Equal(got, []string{id}) {
			t.Errorf("patch did not reindex: given=g finds %v", got)
		}

		for _, tc := range []struct {
			what, body, ct string
			status         int
			code, text     string
		}{
			{"empty body", "", jp, 400, "invalid", "Empty patch body"},
			{"blank body", "  \n", jp, 400, "invalid", "Empty patch body"},
			{"garbage", "{not json", jp, 400, "invalid", "Invalid patch body"},
			{"object instead of array", `{"op":"replace","path":"/gender","value":"x"}`, jp, 400, "invalid", "Invalid patch body"},
			{"changes id", `[{"op":"replace","path":"/id","value":"other"}]`, jp, 400, "invalid", "Incorrect resource ID"},
			{"changes resourceType", `[{"op":"replace","path":"/resourceType","value":"Practitioner"}]`, jp, 400, "invalid", ""},
			{"removes resourceType", `[{"op":"remove","path":"/resourceType"}]`, jp, 400, "invalid", ""},
			{"failing test op", `[{"op":"test","path":"/gender","value":"female"}]`, jp, 400, "invalid", ""},
			{"path that is not there", `[{"op":"remove","path":"/nothing/here"}]`, jp, 400, "invalid", ""},
			{"JSON content type", `[{"op":"replace","path":"/gender","value":"x"}]`, "application/json", 415, "not-supported", ""},
		} {
			var body any
			if tc.body != "" {
				body = tc.body
			}
			r := c.Do("PATCH", path, body, tc.ct)
			if tc.body == "" {
				r = c.DoWith("PATCH", path, nil, "", map[string]string{"Content-Type": jp})
			}
			wantOutcome(t, tc.what, r, tc.status, tc.code, tc.text)
		}
		if got := c.Do("GET", path, nil, ""); str(got.JSON(), "gender") != "male" || str(got.JSON(), "resourceType") != "Patient" {
			t.Errorf("a refused patch changed the resource: %s", got.Body)
		}
		wantOutcome(t, "patch of a missing resource", c.Do("PATCH", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000", `[]`, jp), 404, "not-found", "")
	})
}

func TestHistory(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "history")
		p := c.Create(map[string]any{"resourceType": "Patient", "gender": "female"})
		id, v1 := str(p, "id"), str(p, "meta", "versionId")
		path := "fhir/R4/Patient/" + id
		v2 := str(c.Do("PUT", path, map[string]any{"resourceType": "Patient", "id": id, "gender": "male"}, "").JSON(), "meta", "versionId")
		if r := c.Do("DELETE", path, nil, ""); r.Status != 200 {
			t.Fatalf("delete: %d", r.Status)
		}
		r := c.Do("GET", path+"/_history", nil, "")
		if r.Status != 200 {
			t.Fatalf("history: %d %s", r.Status, r.Body)
		}
		b := r.JSON()
		if b["resourceType"] != "Bundle" || b["type"] != "history" || b["id"] != nil || b["meta"] != nil {
			t.Errorf("history bundle: %s", r.Body)
		}
		es := entries(t, r)
		if len(es) != 3 {
			t.Fatalf("history has %d entries, want 3: %s", len(es), r.Body)
		}
		// Newest first: the deletion, then v2, then v1.
		if str(es[0], "request", "method") != "DELETE" || str(es[0], "response", "status") != "410" || es[0]["resource"] != nil {
			t.Errorf("entry 0 is not the deletion: %v", es[0])
		}
		if str(es[1], "resource", "meta", "versionId") != v2 || str(es[1], "resource", "gender") != "male" {
			t.Errorf("entry 1 is not v2: %v", es[1])
		}
		if str(es[2], "resource", "meta", "versionId") != v1 || str(es[2], "resource", "gender") != "female" {
			t.Errorf("entry 2 is not v1: %v", es[2])
		}
		for i, e := range es {
			if got, want := str(e, "fullUrl"), s.URL+"fhir/R4/Patient/"+id; got != want {
				t.Errorf("entry %d fullUrl %q, want %q", i, got, want)
			}
		}
		if str(es[1], "response", "etag") != `W/"`+v2+`"` {
			t.Errorf("entry 1 etag %v", es[1]["response"])
		}
		if got := links(t, r)["self"]; got != s.URL+path+"/_history" {
			t.Errorf("self link %q", got)
		}
		// Old versions stay readable after the deletion.
		if r := c.Do("GET", path+"/_history/"+v1, nil, ""); r.Status != 200 || str(r.JSON(), "gender") != "female" {
			t.Errorf("vread of v1 after delete: %d %s", r.Status, r.Body)
		}
		if got := entries(t, c.Do("GET", path+"/_history?_count=1", nil, "")); len(got) != 1 || str(got[0], "request", "method") != "DELETE" {
			t.Errorf("history _count=1: %v", got)
		}
		wantOutcome(t, "history of a missing resource", c.Do("GET", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000/_history", nil, ""), 404, "not-found", "")
	})
}

func TestMetadata(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		anon := &servertest.Client{}
		r := s.Anonymous(t).Do("GET", "fhir/R4/metadata", nil, "")
		_ = anon
		if r.Status != 200 || r.JSON()["resourceType"] != "CapabilityStatement" || r.JSON()["fhirVersion"] != "4.0.1" {
			t.Fatalf("metadata: %d %.300s", r.Status, r.Body)
		}
		rest, _ := get(r.JSON(), "rest").([]any)
		if len(rest) != 1 {
			t.Fatalf("rest: %v", rest)
		}
		var patient map[string]any
		for _, res := range get(rest[0], "resource").([]any) {
			if str(res, "type") == "Patient" {
				patient = res.(map[string]any)
			}
			if str(res, "type") == "Login" || str(res, "type") == "JsonWebKey" {
				t.Errorf("server-private type %s is advertised", str(res, "type"))
			}
		}
		if patient == nil {
			t.Fatal("Patient is not listed")
		}
		params := map[string]string{}
		for _, p := range patient["searchParam"].([]any) {
			params[str(p, "name")] = str(p, "type")
		}
		for name, typ := range map[string]string{"name": "string", "identifier": "token", "_id": "token", "_lastUpdated": "date", "email": "token", "active": "token"} {
			if params[name] != typ {
				t.Errorf("Patient search param %s: type %q, want %q", name, params[name], typ)
			}
		}
	})
}
