package password

import (
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		pw string
		ok bool
	}{
		{"", false},
		{strings.Repeat("x", MinLength-1), false},
		{strings.Repeat("x", MinLength), true},
		{strings.Repeat("x", MaxBytes), true},
		{strings.Repeat("x", MaxBytes+1), false},
		// Bytes, not characters: 24 three-byte runes are 72 bytes, 25 are 75.
		{strings.Repeat("€", 24), true},
		{strings.Repeat("€", 25), false},
	} {
		err := Check(tc.pw, "newPassword")
		if (err == nil) != tc.ok {
			t.Errorf("Check(%d bytes) = %v, want ok %v", len(tc.pw), err, tc.ok)
		}
		if err != nil {
			e, isFHIR := err.(*fhir.Error)
			if !isFHIR || e.Code != fhir.EInvalid || len(e.Expression) != 1 || e.Expression[0] != "newPassword" {
				t.Errorf("Check(%d bytes): %#v, want a 400 at newPassword", len(tc.pw), err)
			}
		}
	}
}

func TestHashAndVerify(t *testing.T) {
	h, err := Hash("correct horse")
	if err != nil {
		t.Fatal(err)
	}
	if !Verify(h, "correct horse") || Verify(h, "correct horsE") || Verify("", "correct horse") || Verify("not a hash", "x") {
		t.Fatal("Verify")
	}
}

func TestSecrets(t *testing.T) {
	a, b := NewSecret(), NewSecret()
	if a == b || len(a) != 43 {
		t.Fatalf("secrets %q %q", a, b)
	}
	if !SecretMatches(HashSecret(a), a) || SecretMatches(HashSecret(a), b) || SecretMatches("", "") {
		t.Fatal("SecretMatches")
	}
}
