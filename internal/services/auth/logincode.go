package auth

import (
	"time"

	"github.com/sandbot/sandbot/fhir"
)

// codeIssuedURL is the extension of a Login that says when its current
// authorization code was issued (a reissued code, after a profile choice
// or MFA, restarts its lifetime). Login has no such element in the FHIR
// definitions, and every write must be valid FHIR (decision 44), so it is
// an extension; Logins stored before validation have it as a top-level
// codeIssued, which normalizeLogin moves on their next write.
const codeIssuedURL = "https://sandbot.dev/fhir/StructureDefinition/login-code-issued"

// setCodeIssued records that l's code was issued at t.
func setCodeIssued(l fhir.Resource, t time.Time) {
	delete(l, "codeIssued")
	ext := []any{map[string]any{"url": codeIssuedURL, "valueInstant": t.UTC().Format(fhir.TimeFormat)}}
	if old, ok := l["extension"].([]any); ok {
		for _, e := range old {
			if m, ok := e.(map[string]any); !ok || m["url"] != codeIssuedURL {
				ext = append(ext, e)
			}
		}
	}
	l["extension"] = ext
}

// codeIssued is when l's code was issued ("" when it has none).
func codeIssued(l fhir.Resource) string {
	if old := l.String("codeIssued"); old != "" {
		return old
	}
	exts, _ := l["extension"].([]any)
	for _, e := range exts {
		if m, ok := e.(map[string]any); ok && m["url"] == codeIssuedURL {
			s, _ := m["valueInstant"].(string)
			return s
		}
	}
	return ""
}

// normalizeLogin rewrites a Login stored before validation into valid
// FHIR (its codeIssued as the extension), so that it can be written again.
func normalizeLogin(l fhir.Resource) {
	if old := l.String("codeIssued"); old != "" {
		if t, err := time.Parse(fhir.TimeFormat, old); err == nil {
			setCodeIssued(l, t)
			return
		}
	}
	delete(l, "codeIssued")
}
