package fhirapi_test

import (
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

func TestProjectsAreWalls(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		a := s.NewProject(t, "A")
		b := s.NewProject(t, "B")
		pat := a.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Secret"}}})
		id := pat["id"].(string)
		if r := b.Do("GET", "fhir/R4/Patient/"+id, nil, ""); r.Status != 404 {
			t.Errorf("cross-project read: %d %s", r.Status, r.Body)
		}
		if r := b.Do("GET", "fhir/R4/Patient?name=secret", nil, ""); r.Status != 200 || r.JSON()["entry"] != nil {
			t.Errorf("cross-project search: %d %s", r.Status, r.Body)
		}
		if r := a.Do("GET", "fhir/R4/Patient?name=secret", nil, ""); r.Status != 200 || len(r.JSON()["entry"].([]any)) != 1 {
			t.Errorf("own search: %d %s", r.Status, r.Body)
		}
		obs := map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"text": "x"}, "subject": map[string]any{"reference": "Patient/" + id}}
		if r := b.Do("POST", "fhir/R4/Observation", obs, ""); r.Status != 400 {
			t.Errorf("write referencing another project: %d %s", r.Status, r.Body)
		}
		if r := a.Do("POST", "fhir/R4/Observation", obs, ""); r.Status != 201 {
			t.Errorf("write referencing own project: %d %s", r.Status, r.Body)
		}
	})
}
