package main

import (
	"os"
	"testing"
)

// TestGeneratedTableIsCurrent: fhir/validate_gen.go is what the embedded
// definitions give (run `go generate ./fhir` after changing them or this
// generator).
func TestGeneratedTableIsCurrent(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../validate_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("fhir/validate_gen.go is stale: run go generate ./fhir")
	}
}
