package fhir

import (
	"strings"
	"testing"
)

func mustParse(t testing.TB, s string) Resource {
	t.Helper()
	r, err := ParseResource([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const richPatient = `{"resourceType":"Patient","id":"p1","meta":{"versionId":"1","lastUpdated":"2024-01-02T03:04:05.678Z","project":"0b5f1b3e-7c33-4a2c-8b6a-1d0e6e0f5a11","author":{"reference":"Practitioner/x","display":"Dr X"},"compartment":[{"reference":"Project/1"}],"account":{"reference":"Organization/o"},"tag":[{"system":"http://x","code":"t"}]},
"text":{"status":"generated","div":"<div xmlns=\"http://www.w3.org/1999/xhtml\">Ada</div>"},
"extension":[{"url":"http://hl7.org/fhir/us/core/StructureDefinition/us-core-birthsex","valueCode":"F"},{"url":"http://example.org/race","extension":[{"url":"text","valueString":"x"}]}],
"identifier":[{"system":"http://hospital.org/mrn","value":"12345","period":{"start":"2020-01-01"}}],
"active":true,"name":[{"use":"official","family":"Lovelace","given":["Ada","King"]}],
"telecom":[{"system":"phone","value":"555-1234","use":"home","rank":1}],
"gender":"female","birthDate":"1815-12-10","_birthDate":{"extension":[{"url":"http://hl7.org/fhir/StructureDefinition/patient-birthTime","valueDateTime":"1815-12-10T10:00:00+00:00"}]},
"deceasedDateTime":"1852-11-27","address":[{"line":["12 St James's Square"],"city":"London","country":"UK"}],
"multipleBirthInteger":1,"contact":[{"relationship":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/v2-0131","code":"N"}]}],"name":{"family":"Byron"}}],
"communication":[{"language":{"text":"English"},"preferred":true}],
"generalPractitioner":[{"reference":"#org1"}],
"contained":[{"resourceType":"Organization","id":"org1","name":"Clinic"}]}`

const richObservation = `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"8867-4","display":"Heart rate"}]},
"subject":{"reference":"Patient/p1"},"effectivePeriod":{"start":"2024-01-01T10:00:00Z"},"issued":"2024-01-01T10:00:00.000+01:00",
"valueQuantity":{"value":72.5,"unit":"beats/minute","system":"http://unitsofmeasure.org","code":"/min"},
"component":[{"code":{"text":"a"},"valueString":"x"},{"code":{"text":"b"},"valueInteger":-3},{"code":{"text":"c"},"valueBoolean":false}],
"referenceRange":[{"low":{"value":60},"high":{"value":100}}]}`

func TestValidateAcceptsValidResources(t *testing.T) {
	for _, s := range []string{richPatient, richObservation,
		`{"resourceType":"Patient"}`,
		`{"resourceType":"Patient","name":[{"given":["A",null],"_given":[null,{"extension":[{"url":"http://x","valueString":"y"}]}]}]}`,
		`{"resourceType":"Questionnaire","status":"draft","item":[{"linkId":"1","type":"group","item":[{"linkId":"1.1","type":"string","item":[{"linkId":"1.1.1","type":"boolean"}]}]}]}`,
		`{"resourceType":"Bot","name":"b","runtimeVersion":"awslambda","sourceCode":{"contentType":"text/typescript","url":"Binary/1"}}`,
		// Extensions on a backbone element the reference's definition
		// leaves them out of.
		`{"resourceType":"Agent","name":"a","status":"active","channel":[{"name":"c","endpoint":{"reference":"Endpoint/1"},"targetReference":{"reference":"Bot/1"},"extension":[{"url":"https://sandbot.dev/x","valueString":"PID-3.1"}]}]}`,
		`{"resourceType":"Bundle","type":"collection","entry":[{"resource":{"resourceType":"Patient","active":true}}]}`,
		`{"resourceType":"Parameters","parameter":[{"name":"a","valueString":"b"},{"name":"r","resource":{"resourceType":"Patient"}}]}`,
	} {
		if issues := Validate(mustParse(t, s)); len(issues) != 0 {
			t.Errorf("%.60s: %+v", s, issues)
		}
	}
}

func TestValidateRefusesInvalidResources(t *testing.T) {
	for _, c := range []struct{ body, expr, text string }{
		{`{"resourceType":"Patient","gender":5}`, "Patient.gender", "expected a string"},
		{`{"resourceType":"Patient","foo":"bar"}`, "Patient.foo", "Invalid additional property"},
		{`{"resourceType":"Patient","birthDate":"not-a-date"}`, "Patient.birthDate", "Invalid date"},
		{`{"resourceType":"Patient","name":"Ada"}`, "Patient.name", "Expected an array"},
		{`{"resourceType":"Patient","name":[{"given":["Ada",7]}]}`, "Patient.name[0].given[1]", "expected a string"},
		{`{"resourceType":"Patient","active":"yes"}`, "Patient.active", "Invalid boolean"},
		{`{"resourceType":"Patient","gender":["male"]}`, "Patient.gender", "got an array"},
		{`{"resourceType":"Patient","maritalStatus":"M"}`, "Patient.maritalStatus", "an object"},
		{`{"resourceType":"Patient","multipleBirthInteger":1.5}`, "Patient.multipleBirthInteger", "expected an integer"},
		{`{"resourceType":"Patient","multipleBirthInteger":1,"multipleBirthBoolean":true}`, "Patient.multipleBirth", "Only one of"},
		{`{"resourceType":"Patient","link":[{"type":"seealso"}]}`, "Patient.link[0].other", "Missing required"},
		{`{"resourceType":"Patient","extension":[{"valueString":"x"}]}`, "Patient.extension[0].url", "Missing required"},
		{`{"resourceType":"Patient","generalPractitioner":[{"reference":5}]}`, "Patient.generalPractitioner[0].reference", "expected a string"},
		{`{"resourceType":"Patient","contained":[{"resourceType":"Organization","name":3}]}`, "Patient.contained[0].name", "expected a string"},
		{`{"resourceType":"Patient","contained":[{"resourceType":"Nope"}]}`, "Patient.contained[0].resourceType", "Unknown resource type"},
		{`{"resourceType":"Patient","_birthDate":"x"}`, "Patient._birthDate", "Expected an Element"},
		{`{"resourceType":"Patient","_name":{}}`, "Patient._name", "Only primitive"},
		{`{"resourceType":"Observation","status":"final","code":{"text":"x"},"valueFoo":1}`, "Observation.valueFoo", "Invalid additional property"},
		{`{"resourceType":"Observation","code":{"text":"x"}}`, "Observation.status", "Missing required"},
		{`{"resourceType":"Observation","status":"final","code":{"text":"x"},"issued":"2024-01-01"}`, "Observation.issued", "Invalid instant"},
		{`{"resourceType":"Observation","status":"final","code":{"text":"x"},"effectiveDateTime":"2024-13-01"}`, "Observation.effectiveDateTime", "Invalid dateTime"},
		{`{"resourceType":"Patient","telecom":[{"rank":0}]}`, "Patient.telecom[0].rank", "out of range"},
		{`{"resourceType":"Patient","gender":"fe male  "}`, "Patient.gender", "Invalid code"},
		{`{"resourceType":"Patient","identifier":[]}`, "Patient.identifier", "must not be empty"},
	} {
		issues := Validate(mustParse(t, c.body))
		found := false
		for _, is := range issues {
			if len(is.Expression) == 1 && (is.Expression[0] == c.expr || strings.HasPrefix(c.text, "Only") && strings.HasPrefix(is.Expression[0], c.expr)) && strings.Contains(is.Details.Text, c.text) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: want %s %q, got %+v", c.body, c.expr, c.text, issues)
		}
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	issues := Validate(mustParse(t, `{"resourceType":"Patient","gender":5,"foo":"bar","birthDate":"x"}`))
	if len(issues) != 3 || issues[0].Expression[0] != "Patient.birthDate" || issues[1].Expression[0] != "Patient.foo" || issues[2].Expression[0] != "Patient.gender" {
		t.Fatalf("want 3 issues in expression order, got %+v", issues)
	}
	err := ValidationError(issues)
	if err.Code != EInvalid || len(OutcomeFor(err).Issue) != 3 {
		t.Fatalf("outcome: %+v", OutcomeFor(err))
	}
}

func TestPrimitiveFormats(t *testing.T) {
	for _, c := range []struct {
		typ, v string
		ok     bool
	}{
		{"date", "2020", true}, {"date", "2020-02", true}, {"date", "2020-02-29", true}, {"date", "2020-2-1", false}, {"date", "20201", false},
		{"dateTime", "2020-01-01T10:00:00Z", true}, {"dateTime", "2020-01-01T10:00:00.123+05:30", true}, {"dateTime", "2020-01-01T10:00", false},
		{"dateTime", "2020-01-01T25:00:00Z", false}, {"instant", "2020-01-01T10:00:00Z", true}, {"instant", "2020-01-01T10:00:00", false},
		{"time", "10:00:00", true}, {"time", "10:00", false}, {"id", "a-b.c", true}, {"id", "a b", false},
		{"uri", "http://x y", false}, {"oid", "urn:oid:1.2.3", true}, {"uuid", "urn:uuid:c757873d-ec9a-4326-a141-556f43239520", true},
		{"base64Binary", "aGVsbG8=", true}, {"base64Binary", "héllo", false}, {"string", "  ", false}, {"string", "", true}, {"markdown", "", true}, {"code", "", false}, {"date", "", false}, {"code", "a b", true},
	} {
		if got := checkPrimitive(c.typ, c.v) == ""; got != c.ok {
			t.Errorf("%s %q: valid %v, want %v", c.typ, c.v, got, c.ok)
		}
	}
}

func TestEveryResourceTypeIsInTheTable(t *testing.T) {
	for _, typ := range []string{"Patient", "Observation", "Bot", "ProjectMembership", "Login", "AsyncJob", "ClientApplication", "AccessPolicy", "UserConfiguration", "Agent", "AuditEvent", "Project", "User", "Binary", "Subscription"} {
		if st := structures[typ]; st == nil || !st.Resource {
			t.Errorf("%s: not a resource in the table", typ)
		}
	}
}

func BenchmarkValidatePatient(b *testing.B) {
	r := mustParse(b, richPatient)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if issues := Validate(r); len(issues) != 0 {
			b.Fatal(issues)
		}
	}
}

func BenchmarkValidateTransaction100(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"resourceType":"Bundle","type":"transaction","entry":[`)
	for i := 0; i < 100; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		body := richPatient
		if i%2 == 1 {
			body = richObservation
		}
		sb.WriteString(`{"request":{"method":"POST","url":"Patient"},"resource":` + body + `}`)
	}
	sb.WriteString(`]}`)
	r := mustParse(b, sb.String())
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if issues := Validate(r); len(issues) != 0 {
			b.Fatal(issues)
		}
	}
}

// FuzzValidate: any JSON object decodes and validates without a panic, and
// every issue names an element.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{richPatient, richObservation, `{"resourceType":"Patient","gender":5}`, `{"resourceType":"Patient","foo":"bar"}`,
		`{"resourceType":"Patient","birthDate":"not-a-date"}`, `{"resourceType":"Patient","name":"Ada"}`,
		`{"resourceType":"Patient","_given":[null],"contained":[{"resourceType":"Patient","contained":[{}]}]}`,
		`{"resourceType":"Questionnaire","item":[{"item":[{"item":[{"item":{}}]}]}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseResource(data)
		if err != nil {
			return
		}
		for _, is := range Validate(r) {
			if len(is.Expression) != 1 || is.Expression[0] == "" || is.Details == nil {
				t.Fatalf("issue without expression: %+v", is)
			}
		}
	})
}
