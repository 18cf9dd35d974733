package fhir

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestExtractBoundsIndexedValues(t *testing.T) {
	long := strings.Repeat("é", MaxIndexedValue) // 2 bytes each
	r := Resource{"resourceType": "Patient",
		"name":       []any{map[string]any{"text": long, "family": "Short"}},
		"identifier": []any{map[string]any{"system": "urn:x", "value": strings.Repeat("9", MaxIndexedValue+1)}, map[string]any{"value": "ok"}},
	}
	var names, ids []string
	for _, v := range Extract(r) {
		switch v.Code {
		case "name":
			names = append(names, v.Value)
		case "identifier":
			ids = append(ids, v.Value)
		}
	}
	if len(ids) != 1 || ids[0] != "ok" {
		t.Errorf("identifiers indexed: %q, want only the short one", ids)
	}
	found := false
	for _, n := range names {
		if len(n) > MaxIndexedValue || !utf8.ValidString(n) {
			t.Errorf("name indexed as %d bytes (valid UTF-8: %v)", len(n), utf8.ValidString(n))
		}
		if strings.HasPrefix(long, n) && len(n) >= MaxIndexedValue-1 {
			found = true
		}
	}
	if !found {
		t.Errorf("the long name is not indexed by its prefix: %d values", len(names))
	}
}
