package auth

import (
	"testing"

	"github.com/sandbot/sandbot/fhir"
)

// TestLegacyLoginIsRewrittenValid: a Login stored with the old top-level
// codeIssued keeps its code time and becomes valid FHIR on its next write.
func TestLegacyLoginIsRewrittenValid(t *testing.T) {
	l := fhir.Resource{"resourceType": "Login", "user": map[string]any{"reference": "User/1"}, "authMethod": "password",
		"authTime": "2026-01-01T00:00:00.000Z", "codeIssued": "2026-01-01T00:00:01.000Z",
		"extension": []any{map[string]any{"url": "http://other", "valueString": "kept"}}}
	if len(fhir.Validate(l)) == 0 {
		t.Fatal("the legacy field should not be valid")
	}
	normalizeLogin(l)
	if issues := fhir.Validate(l); len(issues) != 0 {
		t.Fatalf("after normalizeLogin: %+v", issues)
	}
	if got := codeIssued(l); got != "2026-01-01T00:00:01.000Z" {
		t.Errorf("codeIssued %q", got)
	}
	if ext := l["extension"].([]any); len(ext) != 2 {
		t.Errorf("other extensions lost: %v", ext)
	}
}
