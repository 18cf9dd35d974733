package fhir

import "testing"

// A composite pairs its parts within one element: in memory as in the
// stores (store/storetest's SearchComposite).
func TestCompositeMatchesWithinOneElement(t *testing.T) {
	r, err := ParseResource([]byte(`{"resourceType":"Observation","status":"final","code":{"text":"bp"},"component":[
		{"code":{"coding":[{"system":"http://loinc.org","code":"8480-6"}]},"valueQuantity":{"value":95}},
		{"code":{"coding":[{"system":"http://loinc.org","code":"8462-4"}]},"valueQuantity":{"value":150}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	values := Extract(r)
	groups := map[int]bool{}
	for _, v := range values {
		if v.Code == "component-code-value-quantity$0" || v.Code == "component-code-value-quantity$1" {
			groups[v.Group] = true
		}
	}
	if len(groups) != 2 || groups[0] {
		t.Fatalf("component groups %v, want 1 and 2", groups)
	}
	for q, want := range map[string]bool{
		"component-code-value-quantity=http://loinc.org|8480-6$lt100": true,
		"component-code-value-quantity=8480-6$gt100":                  false,
		"component-code-value-quantity=8462-4$gt100":                  true,
		"component-code-value-quantity=8480-6$gt100,8462-4$150":       true,
		"combo-code-value-quantity=8462-4$150":                        true,
		"code-value-quantity=8462-4$150":                              false,
	} {
		req, err := ParseSearch("Observation", q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		got, err := MatchInMemory(req, r, values)
		if err != nil || got != want {
			t.Errorf("%s: %v, %v; want %v", q, got, err, want)
		}
	}
	req, _ := ParseSearch("Observation", `component-code-value-quantity=a\$b$1,c\,d$2`)
	if v := req.Filters[0].Values; len(v) != 2 || v[0].Components[0].Code != "a$b" || v[1].Components[0].Code != "c,d" {
		t.Errorf("escapes: %+v", v)
	}
	if n, v := req.Filters[0].queryPart(); n != "component-code-value-quantity" || v != `a\$b$1,c\,d$2` {
		t.Errorf("queryPart = %s=%s", n, v)
	}
}
