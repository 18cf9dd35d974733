package fhirapi_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestSMARTDiscovery: the SMART configuration is served without a token at
// the root and at the FHIR base, names endpoints that work (its token
// endpoint issues a token by client credentials, its JWKS answers), and the
// CapabilityStatement says SMART-on-FHIR with the same token endpoint.
func TestSMARTDiscovery(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		anon := s.Anonymous(t)
		var first map[string]any
		for _, path := range []string{".well-known/smart-configuration", "fhir/R4/.well-known/smart-configuration"} {
			r := anon.Do("GET", path, nil, "")
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", path, r.Status, r.Body)
			}
			cfg := r.JSON()
			if first == nil {
				first = cfg
			} else if string(mustJSON(cfg)) != string(mustJSON(first)) {
				t.Errorf("the two documents differ: %s, %s", mustJSON(first), mustJSON(cfg))
			}
		}
		token, _ := first["token_endpoint"].(string)
		if token != s.URL+"oauth2/token" || first["issuer"] != strings.TrimSuffix(s.URL, "/") {
			t.Fatalf("configuration %s", mustJSON(first))
		}
		if _, ok := first["authorization_endpoint"]; ok {
			t.Errorf("an authorization endpoint the server does not have: %v", first["authorization_endpoint"])
		}
		status, body := servertest.PostToken(t, strings.TrimSuffix(token, "oauth2/token"), url.Values{"grant_type": {"client_credentials"},
			"client_id": {servertest.AdminClientID}, "client_secret": {servertest.AdminClientSecret}})
		if status != 200 || body["access_token"] == nil {
			t.Errorf("the token endpoint: %d %v", status, body)
		}
		if r := anon.Do("GET", strings.TrimPrefix(first["jwks_uri"].(string), s.URL), nil, ""); r.Status != 200 {
			t.Errorf("jwks_uri: %d", r.Status)
		}
		cs := anon.Do("GET", "fhir/R4/metadata", nil, "").JSON()
		sec := string(mustJSON(servertest.Field(cs["rest"].([]any)[0], "security")))
		if !strings.Contains(sec, `"SMART-on-FHIR"`) || !strings.Contains(sec, `"valueUri":"`+token+`"`) {
			t.Errorf("CapabilityStatement security %s", sec)
		}
	})
}
