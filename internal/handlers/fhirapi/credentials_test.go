package fhirapi_test

import (
	"encoding/base64"
	"net/url"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestCredentialsDieWithTheirOwner: deleting a ClientApplication through
// FHIR deletes its membership in the same transaction, and its tokens and
// its secret stop working at once; a removed membership and a demoted admin
// take effect at once too (the principal caches are dropped by the store's
// change feed, not by the 10 s TTL).
func TestCredentialsDieWithTheirOwner(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		pa := s.NewProject(t, "creds")
		worker := s.NewMember(t, pa.ProjectID, "worker", true)
		basicAuth := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(worker.ClientID+":"+worker.Secret))}
		// Both credentials work, and are cached by now.
		for range 2 {
			if r := worker.Do("GET", "fhir/R4/Patient", nil, ""); r.Status != 200 {
				t.Fatalf("worker token before: %d", r.Status)
			}
			if r := s.Anonymous(t).DoWith("GET", "fhir/R4/Patient", nil, "", basicAuth); r.Status != 200 {
				t.Fatalf("worker Basic before: %d", r.Status)
			}
		}
		members := pa.Do("GET", "fhir/R4/ProjectMembership?user=ClientApplication/"+worker.ClientID, nil, "")
		mids := entryIDs(t, members)
		if len(mids) != 1 {
			t.Fatalf("worker memberships: %v", mids)
		}

		if r := pa.Do("DELETE", "fhir/R4/ClientApplication/"+worker.ClientID, nil, ""); r.Status != 200 {
			t.Fatalf("delete client: %d %s", r.Status, r.Body)
		}
		if r := worker.Do("GET", "fhir/R4/Patient", nil, ""); r.Status != 401 {
			t.Errorf("deleted client's token: %d, want 401", r.Status)
		}
		if r := worker.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient"}, ""); r.Status != 401 {
			t.Errorf("deleted client's token writes: %d, want 401", r.Status)
		}
		if r := s.Anonymous(t).DoWith("GET", "fhir/R4/Patient", nil, "", basicAuth); r.Status != 401 {
			t.Errorf("deleted client's Basic: %d, want 401", r.Status)
		}
		if status, out := servertest.PostToken(t, s.URL, url.Values{"grant_type": {"client_credentials"}, "client_id": {worker.ClientID}, "client_secret": {worker.Secret}}); status != 400 || out["error_description"] != "Invalid client" {
			t.Errorf("token for a deleted client: %d %v", status, out)
		}
		if r := pa.Do("GET", "fhir/R4/ProjectMembership/"+mids[0], nil, ""); r.Status != 410 {
			t.Errorf("deleted client's membership: %d, want 410 (deleted with it)", r.Status)
		}

		// A membership removed through the admin API ends its tokens at once.
		other := s.NewMember(t, pa.ProjectID, "other", false)
		if r := other.Do("GET", "fhir/R4/Patient", nil, ""); r.Status != 200 {
			t.Fatalf("other before: %d", r.Status)
		}
		omid := entryIDs(t, pa.Do("GET", "fhir/R4/ProjectMembership?user=ClientApplication/"+other.ClientID, nil, ""))
		if r := pa.Do("DELETE", "admin/projects/"+pa.ProjectID+"/members/"+omid[0], nil, ""); r.Status != 200 {
			t.Fatalf("remove member: %d %s", r.Status, r.Body)
		}
		if r := other.Do("GET", "fhir/R4/Patient", nil, ""); r.Status != 401 {
			t.Errorf("removed member's token: %d, want 401", r.Status)
		}

		// A demoted admin is no admin from its next request on.
		boss := s.NewMember(t, pa.ProjectID, "boss", true)
		if r := boss.Do("GET", "admin/projects/"+pa.ProjectID, nil, ""); r.Status != 200 {
			t.Fatalf("admin before demotion: %d", r.Status)
		}
		bmid := entryIDs(t, pa.Do("GET", "fhir/R4/ProjectMembership?user=ClientApplication/"+boss.ClientID, nil, ""))
		if r := pa.Do("PATCH", "admin/projects/"+pa.ProjectID+"/members/"+bmid[0], `[{"op":"replace","path":"/admin","value":false}]`, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("demote: %d %s", r.Status, r.Body)
		}
		if r := boss.Do("GET", "admin/projects/"+pa.ProjectID, nil, ""); r.Status != 403 {
			t.Errorf("demoted admin: %d, want 403", r.Status)
		}
		if r := boss.Do("GET", "fhir/R4/ProjectMembership", nil, ""); r.Status != 403 {
			t.Errorf("demoted admin searches memberships: %d, want 403", r.Status)
		}
	})
}

// TestDeletedUserAndBotLoseTheirMemberships: a User or a Bot deleted through
// FHIR takes its memberships with it, in the same transaction.
func TestDeletedUserAndBotLoseTheirMemberships(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		su := s.SuperAdmin(t)
		pa := s.NewProject(t, "owners")
		inv := pa.Do("POST", "admin/projects/"+pa.ProjectID+"/invite", map[string]any{"resourceType": "Patient",
			"firstName": "Pat", "lastName": "Q", "email": "pat-" + pa.ProjectID[:8] + "@example.com", "sendEmail": false}, "application/json")
		if inv.Status != 200 {
			t.Fatalf("invite: %d %s", inv.Status, inv.Body)
		}
		user := str(inv.JSON(), "user", "reference")
		bot := pa.Do("POST", "admin/projects/"+pa.ProjectID+"/bot", map[string]any{"name": "b"}, "application/json")
		if bot.Status != 201 {
			t.Fatalf("bot: %d %s", bot.Status, bot.Body)
		}
		for _, owner := range []struct {
			ref     string
			deleter *servertest.Client
		}{{user, su}, {"Bot/" + str(bot.JSON(), "id"), pa}} {
			mids := entryIDs(t, pa.Do("GET", "fhir/R4/ProjectMembership?user="+owner.ref, nil, ""))
			if len(mids) != 1 {
				t.Fatalf("memberships of %s: %v", owner.ref, mids)
			}
			if r := owner.deleter.Do("DELETE", "fhir/R4/"+owner.ref, nil, ""); r.Status != 200 {
				t.Fatalf("delete %s: %d %s", owner.ref, r.Status, r.Body)
			}
			if r := pa.Do("GET", "fhir/R4/ProjectMembership/"+mids[0], nil, ""); r.Status != 410 {
				t.Errorf("membership of the deleted %s: %d, want 410", owner.ref, r.Status)
			}
		}
	})
}
