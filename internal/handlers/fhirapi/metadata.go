package fhirapi

import (
	"maps"
	"net/http"
	"sort"
	"sync"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
)

var (
	capabilityOnce sync.Once
	capability     map[string]any
)

// capabilityStatement lists what the server really supports: every known
// type with the same interactions, and the search parameters of the table.
func capabilityStatement() map[string]any {
	capabilityOnce.Do(func() {
		types := fhirTypes()
		sort.Strings(types)
		var resources []any
		for _, t := range types {
			var params []any
			for _, p := range fhir.ParamsFor(t) {
				params = append(params, map[string]any{"name": p.Code, "type": p.Type.FHIRType(), "definition": p.URL})
			}
			interactions := []any{map[string]any{"code": "read"}, map[string]any{"code": "vread"}, map[string]any{"code": "update"}, map[string]any{"code": "patch"}, map[string]any{"code": "delete"}, map[string]any{"code": "history-instance"}, map[string]any{"code": "create"}, map[string]any{"code": "search-type"}}
			if definitions.Serves(t) { // read-only
				interactions = []any{map[string]any{"code": "read"}, map[string]any{"code": "vread"}, map[string]any{"code": "history-instance"}, map[string]any{"code": "search-type"}}
			}
			res := map[string]any{
				"type":        t,
				"interaction": interactions,
				"versioning":  "versioned",
				"readHistory": true,
				"searchParam": params,
			}
			if !definitions.Serves(t) {
				// internal/services/fhirservice/conditional.go; a conditional delete
				// deletes at most one resource.
				res["conditionalCreate"], res["conditionalUpdate"], res["conditionalDelete"] = true, true, "single"
			}
			resources = append(resources, res)
		}
		capability = map[string]any{
			"resourceType": "CapabilityStatement",
			"status":       "active",
			"date":         "2026-11-21",
			"kind":         "instance",
			"software":     map[string]any{"name": "sandbot"},
			"fhirVersion":  "4.0.1",
			"format":       []any{"application/fhir+json", "json"},
			"patchFormat":  []any{"application/json-patch+json"},
			"rest": []any{map[string]any{
				"mode":     "server",
				"resource": resources,
				"operation": []any{
					map[string]any{"name": "execute", "definition": "Bot/$execute"},
					map[string]any{"name": "deploy", "definition": "Bot/$deploy"},
					map[string]any{"name": "expand", "definition": "ValueSet/$expand"},
				},
			}},
		}
	})
	return capability
}

func fhirTypes() []string {
	var out []string
	for _, t := range fhir.KnownTypeNames() {
		if !fhirservice.SuperAdminOnly(t) && t != "Bundle" && t != "OperationOutcome" && t != "Parameters" && t != "CapabilityStatement" {
			out = append(out, t)
		}
	}
	return out
}

func (h *Handler) metadata(w http.ResponseWriter, r *http.Request) {
	// The statement is built once; its security block names this server's
	// URLs.
	cs := maps.Clone(capabilityStatement())
	rest := maps.Clone(cs["rest"].([]any)[0].(map[string]any))
	rest["security"] = securityOf(h.cfg.BaseURL)
	cs["rest"] = []any{rest}
	httpx.WriteJSON(w, http.StatusOK, httpx.FHIRJSON, cs)
}

// securityOf is the CapabilityStatement's security block: OAuth bearer
// tokens, SMART on FHIR, and where its token endpoint is (the SMART
// oauth-uris extension).
func securityOf(base string) map[string]any {
	return map[string]any{
		"cors": true,
		"service": []any{map[string]any{"coding": []any{
			map[string]any{"system": "http://terminology.hl7.org/CodeSystem/restful-security-service", "code": "OAuth"},
			map[string]any{"system": "http://terminology.hl7.org/CodeSystem/restful-security-service", "code": "SMART-on-FHIR"},
		}}},
		"extension": []any{map[string]any{
			"url":       "http://fhir-registry.smarthealthit.org/StructureDefinition/oauth-uris",
			"extension": []any{map[string]any{"url": "token", "valueUri": base + "oauth2/token"}},
		}},
		"description": "OAuth 2.0 bearer tokens from " + base + "oauth2/token (client credentials, authorization code with PKCE, refresh token); SMART discovery at " + base + ".well-known/smart-configuration",
	}
}
