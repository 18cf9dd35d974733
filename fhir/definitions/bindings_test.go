package definitions

import (
	"strings"
	"testing"

	"github.com/sandbot/sandbot/fhir"
)

func TestInValueSet(t *testing.T) {
	s := mustLoad(t)
	for _, c := range []struct {
		url, system, code string
		in, known         bool
	}{
		{"http://hl7.org/fhir/ValueSet/administrative-gender", "", "female", true, true},
		{"http://hl7.org/fhir/ValueSet/administrative-gender", "", "robot", false, true},
		{"http://hl7.org/fhir/ValueSet/administrative-gender", "http://hl7.org/fhir/administrative-gender", "male", true, true},
		{"http://hl7.org/fhir/ValueSet/administrative-gender", "http://example.org/other", "male", false, true},
		{"http://hl7.org/fhir/ValueSet/condition-clinical", "http://terminology.hl7.org/CodeSystem/condition-clinical", "active", true, true},
		// BCP 13 is not in the definitions: not known, so not refused.
		{"http://hl7.org/fhir/ValueSet/mimetypes", "", "application/x-made-up", false, false},
		{"http://example.org/ValueSet/none", "", "x", false, false},
	} {
		in, known := s.InValueSet(c.url, c.system, c.code)
		if in != c.in || known != c.known {
			t.Errorf("%s %s|%s: in %v known %v, want %v %v", c.url, c.system, c.code, in, known, c.in, c.known)
		}
	}
}

// strictPatient and strictObservation have many elements with required
// bindings (gender, name.use, telecom.system and use, address.use and type,
// identifier.use, status, link.type...).
const strictPatient = `{"resourceType":"Patient","meta":{"profile":["http://hl7.org/fhir/StructureDefinition/Patient"]},
"identifier":[{"use":"official","system":"urn:mrn","value":"1"}],"active":true,
"name":[{"use":"official","family":"Lovelace","given":["Ada","King"]},{"use":"maiden","family":"Byron"}],
"telecom":[{"system":"phone","value":"555","use":"home"},{"system":"email","value":"ada@example.org","use":"work"}],
"gender":"female","birthDate":"1815-12-10","address":[{"use":"home","type":"physical","line":["1 Way"],"city":"London"}],
"contact":[{"gender":"male","name":{"family":"Babbage"}}],"communication":[{"language":{"text":"English"}}]}`

const strictObservation = `{"resourceType":"Observation","status":"final","category":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs"}]}],
"code":{"coding":[{"system":"http://loinc.org","code":"85354-9"}]},"effectiveDateTime":"2024-01-01T10:00:00Z",
"component":[{"code":{"coding":[{"system":"http://loinc.org","code":"8480-6"}]},"valueQuantity":{"value":120,"comparator":"<","system":"http://unitsofmeasure.org","code":"mm[Hg]"}},
{"code":{"coding":[{"system":"http://loinc.org","code":"8462-4"}]},"valueQuantity":{"value":80,"system":"http://unitsofmeasure.org","code":"mm[Hg]"}}]}`

// BenchmarkValidateTransaction100 checks a transaction of 100 entries,
// Patients and Observations rich in bound codes, as a write of a project
// without and with strictMode does.
func BenchmarkValidateTransaction100(b *testing.B) {
	s := mustLoad(b)
	var sb strings.Builder
	sb.WriteString(`{"resourceType":"Bundle","type":"transaction","entry":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		body, url := strictPatient, "Patient"
		if i%2 == 1 {
			body, url = strictObservation, "Observation"
		}
		sb.WriteString(`{"request":{"method":"POST","url":"` + url + `"},"resource":` + body + `}`)
	}
	sb.WriteString(`]}`)
	r, err := fhir.ParseResource([]byte(sb.String()))
	if err != nil {
		b.Fatal(err)
	}
	if issues := fhir.ValidateStrict(r, s); len(issues) != 0 {
		b.Fatal(issues)
	}
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			fhir.Validate(r)
		}
	})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			fhir.ValidateStrict(r, s)
		}
	})
}
