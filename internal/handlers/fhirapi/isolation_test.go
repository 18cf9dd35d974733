package fhirapi_test

import (
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestIsolation: another project's resources do not exist for a caller,
// whatever the interaction; nothing of them leaks into an answer.
func TestIsolation(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "A")
		b := s.NewProject(t, "B")
		const secret = "Topsecretname"
		pat := a.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": secret}},
			"identifier": []any{map[string]any{"system": "urn:iso", "value": "iso-1"}}})
		id, vid := str(pat, "id"), str(pat, "meta", "versionId")
		path := "fhir/R4/Patient/" + id
		const jp = "application/json-patch+json"
		for _, tc := range []struct {
			what, method, path string
			body               any
			ct                 string
		}{
			{"read", "GET", path, nil, ""},
			{"vread", "GET", path + "/_history/" + vid, nil, ""},
			{"history", "GET", path + "/_history", nil, ""},
			{"update", "PUT", path, map[string]any{"resourceType": "Patient", "id": id, "name": []any{map[string]any{"family": "Overwritten"}}}, ""},
			{"patch", "PATCH", path, `[{"op":"replace","path":"/name/0/family","value":"Patched"}]`, jp},
			{"delete", "DELETE", path, nil, ""},
		} {
			r := b.Do(tc.method, tc.path, tc.body, tc.ct)
			wantOutcome(t, "cross-project "+tc.what, r, 404, "not-found", "")
			if strings.Contains(string(r.Body), secret) || strings.Contains(string(r.Body), "iso-1") {
				t.Errorf("cross-project %s leaks content: %s", tc.what, r.Body)
			}
		}
		for _, q := range []string{"_id=" + id, "name=" + secret, "identifier=urn:iso|iso-1", "name:contains=secret", "_project=" + a.ProjectID, "identifier:missing=false"} {
			r := b.Do("GET", "fhir/R4/Patient?"+q, nil, "")
			if r.Status != 200 || r.JSON()["entry"] != nil {
				t.Errorf("cross-project search %s: %d %s", q, r.Status, r.Body)
			}
			if r := b.Do("GET", "fhir/R4/Patient?"+q+"&_total=accurate", nil, ""); r.JSON()["total"] != float64(0) {
				t.Errorf("cross-project search %s counts %v", q, r.JSON()["total"])
			}
		}
		// Nothing B tried changed A's resource.
		r := a.Do("GET", path, nil, "")
		if r.Status != 200 || str(r.JSON(), "meta", "versionId") != vid || !strings.Contains(string(r.Body), secret) {
			t.Errorf("owner read after cross-project writes: %d %s", r.Status, r.Body)
		}
		if n := len(entries(t, a.Do("GET", path+"/_history", nil, ""))); n != 1 {
			t.Errorf("history has %d versions, want 1", n)
		}

		// meta.project and meta.author are the server's: a client cannot write
		// into another project or as someone else.
		spoof := b.Create(map[string]any{"resourceType": "Patient", "meta": map[string]any{"project": a.ProjectID, "author": map[string]any{"reference": a.Profile}}})
		if str(spoof, "meta", "project") != b.ProjectID || str(spoof, "meta", "author", "reference") != b.Profile {
			t.Errorf("create with a foreign meta.project: %v", spoof["meta"])
		}
		if r := a.Do("GET", "fhir/R4/Patient/"+str(spoof, "id"), nil, ""); r.Status != 404 {
			t.Errorf("spoofed meta.project put the resource in A: %d", r.Status)
		}
		sid := str(spoof, "id")
		moved := b.Do("PUT", "fhir/R4/Patient/"+sid, map[string]any{"resourceType": "Patient", "id": sid, "meta": map[string]any{"project": a.ProjectID}}, "")
		if moved.Status != 200 || str(moved.JSON(), "meta", "project") != b.ProjectID {
			t.Errorf("update with a foreign meta.project: %d %s", moved.Status, moved.Body)
		}
		if r := b.Do("PATCH", "fhir/R4/Patient/"+sid, `[{"op":"replace","path":"/meta/project","value":"`+a.ProjectID+`"}]`, jp); r.Status >= 500 || str(r.JSON(), "meta", "project") == a.ProjectID {
			t.Errorf("patch of meta.project: %d %s", r.Status, r.Body)
		}
		if r := a.Do("GET", "fhir/R4/Patient/"+sid, nil, ""); r.Status != 404 {
			t.Errorf("resource moved into A: %d", r.Status)
		}

		// References into another project are refused, on create, update and patch.
		obs := func(ref string) map[string]any {
			return map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "x"}, "subject": map[string]any{"reference": ref}}
		}
		wantOutcome(t, "create referencing another project", b.Do("POST", "fhir/R4/Observation", obs("Patient/"+id), ""), 400, "invalid", "")
		own := b.Create(obs("Patient/" + str(b.Create(map[string]any{"resourceType": "Patient"}), "id")))
		oid := str(own, "id")
		upd := obs("Patient/" + id)
		upd["id"] = oid
		wantOutcome(t, "update referencing another project", b.Do("PUT", "fhir/R4/Observation/"+oid, upd, ""), 400, "invalid", "")
		wantOutcome(t, "patch referencing another project", b.Do("PATCH", "fhir/R4/Observation/"+oid,
			`[{"op":"replace","path":"/subject/reference","value":"Patient/`+id+`"}]`, jp), 400, "invalid", "")
		nested := map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "x"},
			"performer": []any{map[string]any{"reference": "Patient/" + id}}}
		wantOutcome(t, "nested reference into another project", b.Do("POST", "fhir/R4/Observation", nested, ""), 400, "invalid", "")
		// The refusal is the same as for a reference to nothing: existence is not revealed.
		r1 := b.Do("POST", "fhir/R4/Observation", obs("Patient/"+id), "")
		r2 := b.Do("POST", "fhir/R4/Observation", obs("Patient/00000000-0000-0000-0000-000000000000"), "")
		if r1.Status != r2.Status || strings.ReplaceAll(r1.Issue(), id, "X") != strings.ReplaceAll(r2.Issue(), "00000000-0000-0000-0000-000000000000", "X") {
			t.Errorf("another project's resource and a missing one are told apart: %q vs %q", r1.Issue(), r2.Issue())
		}
	})
}

// TestNonAdminMember: a plain member reads and writes clinical resources but
// none of the project-administration types.
func TestNonAdminMember(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		adm := s.NewProject(t, "members-only")
		m := s.NewMember(t, adm.ProjectID, "plain member", false)
		if r := m.Do("GET", "fhir/R4/Patient", nil, ""); r.Status != 200 {
			t.Errorf("member search Patient: %d %s", r.Status, r.Body)
		}
		pat := m.Create(map[string]any{"resourceType": "Patient"})
		if r := adm.Do("GET", "fhir/R4/Patient/"+str(pat, "id"), nil, ""); r.Status != 200 {
			t.Errorf("admin reads member's patient: %d", r.Status)
		}
		own := entryIDs(t, adm.Do("GET", "fhir/R4/ProjectMembership?profile="+m.Profile, nil, ""))
		if len(own) != 1 {
			t.Fatalf("member's membership: %v", own)
		}
		for _, tc := range []struct{ what, method, path string }{
			{"search ProjectMembership", "GET", "fhir/R4/ProjectMembership"},
			{"read ProjectMembership", "GET", "fhir/R4/ProjectMembership/" + own[0]},
			{"search User", "GET", "fhir/R4/User"},
			{"search AccessPolicy", "GET", "fhir/R4/AccessPolicy"},
			{"read Project", "GET", "fhir/R4/Project/" + adm.ProjectID},
			{"search Login", "GET", "fhir/R4/Login"},
		} {
			wantOutcome(t, "member "+tc.what, m.Do(tc.method, tc.path, nil, ""), 403, "forbidden", "")
		}
		wantOutcome(t, "member creates ProjectMembership", m.Do("POST", "fhir/R4/ProjectMembership", map[string]any{
			"resourceType": "ProjectMembership", "project": map[string]any{"reference": "Project/" + adm.ProjectID},
			"user": map[string]any{"reference": m.Profile}, "profile": map[string]any{"reference": m.Profile}, "admin": true}, ""), 403, "forbidden", "")
		wantOutcome(t, "member patches own membership to admin", m.Do("PATCH", "fhir/R4/ProjectMembership/"+own[0],
			`[{"op":"add","path":"/admin","value":true}]`, "application/json-patch+json"), 403, "forbidden", "")
		// Secrets of ClientApplications are hidden from plain members.
		r := m.Do("GET", "fhir/R4/ClientApplication/"+m.ClientID, nil, "")
		if r.Status != 200 || r.JSON()["secret"] != nil || strings.Contains(string(r.Body), m.Secret) {
			t.Errorf("member reads a ClientApplication: %d %s", r.Status, r.Body)
		}
		if r := m.Do("GET", "fhir/R4/ClientApplication?_id="+m.ClientID, nil, ""); strings.Contains(string(r.Body), m.Secret) {
			t.Errorf("search leaks a client secret: %s", r.Body)
		}
		if r := m.Do("GET", "fhir/R4/ClientApplication/"+m.ClientID+"/_history", nil, ""); strings.Contains(string(r.Body), m.Secret) {
			t.Errorf("history leaks a client secret: %s", r.Body)
		}
	})
}
