package fhir

import (
	"strings"
	"testing"
)

func TestMarshalOrdersLeadingFields(t *testing.T) {
	r, err := ParseResource([]byte(`{"name":[{"family":"<A&B>"}],"meta":{"versionId":"1"},"id":"x","resourceType":"Patient","active":true,"n":1.50}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"resourceType":"Patient","id":"x","meta":{"versionId":"1"},"active":true,"n":1.50,"name":[{"family":"<A&B>"}]}`
	if string(got) != want {
		t.Errorf("Marshal = %s\nwant      %s", got, want)
	}
}

func TestParseResourceRejects(t *testing.T) {
	for _, in := range []string{``, `[]`, `"x"`, `{}`, `{"resourceType":""}`, `{"resourceType":"Nope"}`, `{"resourceType":"Patient"} {}`, `{"resourceType":1}`} {
		if _, err := ParseResource([]byte(in)); !IsCode(err, EInvalid) {
			t.Errorf("ParseResource(%q) = %v, want invalid", in, err)
		}
	}
}

func TestReferencesSkipsNonRelative(t *testing.T) {
	r := Resource{"resourceType": "Observation", "subject": map[string]any{"reference": "Patient/1"},
		"performer": []any{map[string]any{"reference": "https://x.org/Practitioner/2"}, map[string]any{"reference": "#c"}, map[string]any{"reference": "Patient?identifier=x"}},
		"meta":      map[string]any{"author": map[string]any{"reference": "Practitioner/9"}}}
	got := r.References()
	if len(got) != 1 || got[0] != "Patient/1" {
		t.Errorf("References = %v", got)
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"a":                                    true,
		"0193a2b4-5c6d-7e8f-9a0b-c1d2e3f4a5b6": true,
		"A.b-C.9":                              true,
		strings.Repeat("x", 64):                true,
		strings.Repeat("x", 65):                false,
		"":                                     false,
		"a/b":                                  false,
		"a b":                                  false,
		"a_b":                                  false,
		"é":                                    false,
		"a\x00":                                false,
	} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}
