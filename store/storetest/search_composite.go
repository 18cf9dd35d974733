package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// testSearchComposite holds the composite parameters to FHIR's meaning: the
// parts of a value match within one element (the Observation itself for
// code-value-*, one of its components for component-code-value-*, either
// for combo-code-value-*), never a code of one element with a value of
// another.
func testSearchComposite(t *testing.T, s store.Store) {
	sc := store.ProjectScope("p1")
	const loinc = "http://loinc.org"
	bp := func(sys, dia string) string {
		return mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"`+loinc+`","code":"85354-9"}]},
			"component":[
			 {"code":{"coding":[{"system":"`+loinc+`","code":"8480-6"}]},"valueQuantity":{"value":`+sys+`,"system":"http://unitsofmeasure.org","code":"mm[Hg]"}},
			 {"code":{"coding":[{"system":"`+loinc+`","code":"8462-4"}]},"valueQuantity":{"value":`+dia+`,"system":"http://unitsofmeasure.org","code":"mm[Hg]"}}]}`).ID
	}
	high := bp("150", "95") // systolic 150
	low := bp("95", "150")  // systolic 95, diastolic 150: code and value of different components
	hr := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"`+loinc+`","code":"8867-4"}]},"valueQuantity":{"value":120,"system":"http://unitsofmeasure.org","code":"/min"}}`).ID
	smoker := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"`+loinc+`","code":"72166-2"}]},"valueCodeableConcept":{"coding":[{"system":"http://snomed.info/sct","code":"77176002"}]}}`).ID
	dated := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"`+loinc+`","code":"21112-8"}]},"valueDateTime":"1990-05-01"}`).ID
	named := mustCreate(t, s, "p1", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"`+loinc+`","code":"x-1"}]},"valueString":"Positive result"}`).ID
	// Another project's matching Observation stays out.
	mustCreate(t, s, "p2", `{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"`+loinc+`","code":"8867-4"}]},"valueQuantity":{"value":120}}`)

	expectIDs(t, s, sc, "Observation", "component-code-value-quantity="+loinc+"|8480-6$gt100", high)
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$gt100", high)
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8462-4$gt100", low)
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$lt100", low)
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$150|http://unitsofmeasure.org|mm[Hg]", high)
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$150||kg")
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$gt200,8462-4$gt100", low)
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$gt100,8462-4$gt100", high, low)
	// The Observation's own code and value are not its components'.
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8867-4$120")
	expectIDs(t, s, sc, "Observation", "code-value-quantity="+loinc+"|8867-4$gt100", hr)
	expectIDs(t, s, sc, "Observation", "code-value-quantity="+loinc+"|8867-4$lt100")
	expectIDs(t, s, sc, "Observation", "code-value-quantity=85354-9$150")
	expectIDs(t, s, sc, "Observation", "combo-code-value-quantity=8867-4$120", hr)
	expectIDs(t, s, sc, "Observation", "combo-code-value-quantity=8480-6$gt140", high)
	expectIDs(t, s, sc, "Observation", "code-value-concept=72166-2$http://snomed.info/sct|77176002", smoker)
	expectIDs(t, s, sc, "Observation", "code-value-concept=72166-2$8517006")
	expectIDs(t, s, sc, "Observation", "code-value-date=21112-8$1990", dated)
	expectIDs(t, s, sc, "Observation", "code-value-date=21112-8$gt2000")
	expectIDs(t, s, sc, "Observation", "code-value-string=x-1$pos", named)
	expectIDs(t, s, sc, "Observation", "code-value-string=8867-4$pos")

	// With other filters, every shape (stream, collect, walk) and counts.
	expectIDs(t, s, sc, "Observation", "status=final&component-code-value-quantity=8480-6$gt100", high)
	expectIDs(t, s, sc, "Observation", "code=85354-9&component-code-value-quantity=8480-6$gt100", high)
	expectIDs(t, s, sc, "Observation", "code=85354-9&component-code-value-quantity=8480-6$gt100&_sort=-_lastUpdated", high)
	expectTotal(t, s, sc, "Observation", "component-code-value-quantity=8480-6$gt10", 2)
	expectTotal(t, s, sc, "Observation", "status=final&component-code-value-quantity=8480-6$gt100", 1)
	expectIDs(t, s, store.Scope{All: true}, "Observation", "code-value-quantity=8867-4$120", hr, search(t, s, store.ProjectScope("p2"), "Observation", "").Records[0].ID)

	// An update moves the rows: the pair of the old version no longer
	// matches.
	if _, err := s.Update(context.Background(), sc, "Observation", high, store.Write{}, func(cur fhir.Resource) (fhir.Resource, error) {
		comps := cur["component"].([]any)
		comps[0].(map[string]any)["valueQuantity"] = map[string]any{"value": json.Number("90")}
		return cur, nil
	}); err != nil {
		t.Fatal(err)
	}
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$gt100")
	expectIDs(t, s, sc, "Observation", "component-code-value-quantity=8480-6$lt100", high, low)

	// Bad values are 400s, not searches.
	for _, q := range []string{
		"component-code-value-quantity=8480-6",            // one part of two
		"component-code-value-quantity=8480-6$gt1$x",      // three parts
		"component-code-value-quantity=8480-6$abc",        // not a quantity
		"component-code-value-quantity=$gt100",            // an empty part
		"component-code-value-quantity:missing=true",      // no modifiers
		"_sort=component-code-value-quantity",             // not sortable
		"_filter=component-code-value-quantity eq 8480-6", // not in _filter
	} {
		_, err := fhir.ParseSearch("Observation", q)
		var fe *fhir.Error
		if !errors.As(err, &fe) || fe.Code != fhir.EInvalid {
			t.Errorf("Observation?%s: %v, want an invalid search", q, err)
		}
	}
}
