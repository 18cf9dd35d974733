package fhir

import (
	"strings"
	"testing"
	"time"
)

func TestParseSearchDecodesBeforeSplitting(t *testing.T) {
	req, err := ParseSearch("ProjectMembership", "profile-type%3Anot=ClientApplication%2CBot&_count=5000&_offset=3&_sort=-_lastUpdated&_total=accurate")
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Filters) != 1 {
		t.Fatalf("filters = %+v", req.Filters)
	}
	f := req.Filters[0]
	if f.Param.Code != "profile-type" || f.Modifier != "not" || len(f.Values) != 2 || f.Values[0].Code != "ClientApplication" || f.Values[1].Code != "Bot" {
		t.Errorf("filter = %+v", f)
	}
	if req.Count != MaxCount || req.Offset != 3 || req.Total != "accurate" || len(req.Sort) != 1 || !req.Sort[0].Descending {
		t.Errorf("request = %+v", req)
	}
}

func TestParseSearchValues(t *testing.T) {
	req, err := ParseSearch("Patient", `identifier=http://a|1,2&name:exact=a\,b&birthdate=ge2020-01&active=true`)
	if err != nil {
		t.Fatal(err)
	}
	id, name, bd, active := req.Filters[0], req.Filters[1], req.Filters[2], req.Filters[3]
	if !id.Values[0].HasSystem || id.Values[0].System != "http://a" || id.Values[0].Code != "1" || id.Values[1].HasSystem || id.Values[1].Code != "2" {
		t.Errorf("identifier = %+v", id.Values)
	}
	if len(name.Values) != 1 || name.Values[0].Code != "a,b" {
		t.Errorf("escaped comma: %+v", name.Values)
	}
	if bd.Values[0].Prefix != "ge" || bd.Values[0].Lo.Format("2006-01-02") != "2020-01-01" || bd.Values[0].Hi.Format("2006-01-02") != "2020-02-01" {
		t.Errorf("date = %+v", bd.Values[0])
	}
	if active.Values[0].Code != "true" {
		t.Errorf("boolean = %+v", active.Values)
	}
}

func TestParseSearchErrors(t *testing.T) {
	for q, want := range map[string]string{
		"foo=1":                "Unknown search parameter: foo",
		"active=yes":           "Boolean search value must be 'true' or 'false'",
		"_count=-1":            "Invalid _count",
		"_count=x":             "Invalid _count",
		"_offset=99999999":     "Search offset exceeds maximum",
		"birthdate=gt20x":      "Invalid date value",
		"name:not=x":           "Unsupported modifier",
		"_sort=nothing":        "Unsupported sort parameter",
		"name=%zz":             "Invalid search value encoding",
		"_total=maybe":         "Invalid _total",
		"identifier:missing=1": ":missing takes",
	} {
		_, err := ParseSearch("Patient", q)
		if !IsCode(err, EInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSearch(%q) = %v, want invalid %q", q, err, want)
		}
	}
}

func TestQueryRoundTrips(t *testing.T) {
	req, err := ParseSearch("ProjectMembership", "profile-type:not=ClientApplication,Bot&_count=3")
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseSearch("ProjectMembership", req.Query(6))
	if err != nil {
		t.Fatal(err)
	}
	if again.Offset != 6 || again.Count != 3 || len(again.Filters[0].Values) != 2 || again.Filters[0].Modifier != "not" {
		t.Errorf("link query %q parses to %+v", req.Query(6), again)
	}
}

func TestExtract(t *testing.T) {
	r := Resource{"resourceType": "ProjectMembership", "profile": map[string]any{"reference": "Practitioner/1"},
		"admin": true, "access": []any{map[string]any{"policy": map[string]any{"reference": "AccessPolicy/a"}}}}
	got := map[string]string{}
	for _, v := range Extract(r) {
		got[v.Code] = v.System + "|" + v.Value
	}
	for code, want := range map[string]string{"profile-type": "|Practitioner", "profile": "Practitioner|1", "admin": "|true", "access-policy": "AccessPolicy|a"} {
		if got[code] != want {
			t.Errorf("%s = %q, want %q (all: %v)", code, got[code], want, got)
		}
	}
}

func FuzzParseSearch(f *testing.F) {
	for _, s := range []string{"name=ada", "profile-type%3Anot=ClientApplication%2CBot", `identifier=a|b,c\,d`, "birthdate=ge2020&_count=3&_sort=-_lastUpdated", "_id=x&_lastUpdated=lt2020-01-01T00:00:00Z",
		"subject:Patient.name:exact=x&_sort=-date,code", "_filter=name%20eq%20%22x%22%20or%20not%20(code%20eq%20a)", "value-quantity=gt5.4|http://u|mg&_summary=count", "url:below=http://x/&_fields=id"} {
		f.Add("Patient", s)
		f.Add("ProjectMembership", s)
		f.Add("Observation", s)
	}
	f.Fuzz(func(t *testing.T, typ, q string) {
		req, err := ParseSearch(typ, q)
		if err != nil {
			if !IsCode(err, EInvalid) {
				t.Fatalf("ParseSearch error is not invalid: %v", err)
			}
			return
		}
		if req.Count < 0 || req.Count > MaxCount || req.Offset < 0 || req.Offset > MaxOffset {
			t.Fatalf("limits escaped: %+v", req)
		}
		if _, err := ParseSearch(typ, req.Query(req.Offset)); err != nil {
			t.Fatalf("the link of %q does not parse: %q: %v", q, req.Query(req.Offset), err)
		}
	})
}

func FuzzParseResource(f *testing.F) {
	f.Add([]byte(`{"resourceType":"Patient","name":[{"family":"x"}],"birthDate":"2000"}`))
	f.Add([]byte(`{"resourceType":"ProjectMembership","profile":{"reference":"Patient/1"},"admin":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseResource(b)
		if err != nil {
			if !IsCode(err, EInvalid) {
				t.Fatalf("error is not invalid: %v", err)
			}
			return
		}
		out, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseResource(out)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		out2, _ := again.Marshal()
		if string(out) != string(out2) {
			t.Fatalf("unstable: %s != %s", out, out2)
		}
		Extract(r)
		r.References()
	})
}

func TestParseDateRangeShapes(t *testing.T) {
	for in, want := range map[string][2]string{
		"2020":                             {"2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z"},
		"2020-02":                          {"2020-02-01T00:00:00Z", "2020-03-01T00:00:00Z"},
		"2020-02-29":                       {"2020-02-29T00:00:00Z", "2020-03-01T00:00:00Z"},
		"2020-02-29T10:30Z":                {"2020-02-29T10:30:00Z", "2020-02-29T10:31:00Z"},
		"2020-02-29T10:30+02:00":           {"2020-02-29T08:30:00Z", "2020-02-29T08:31:00Z"},
		"2020-02-29T10:30:15Z":             {"2020-02-29T10:30:15Z", "2020-02-29T10:30:16Z"},
		"2020-02-29T10:30:15-05:00":        {"2020-02-29T15:30:15Z", "2020-02-29T15:30:16Z"},
		"2020-02-29T10:30:15.123Z":         {"2020-02-29T10:30:15.123Z", "2020-02-29T10:30:15.124Z"},
		"2020-02-29T10:30:15.123456+01:00": {"2020-02-29T09:30:15.123Z", "2020-02-29T09:30:15.124Z"},
	} {
		lo, hi, err := ParseDateRange(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := [2]string{lo.Format(time.RFC3339Nano), hi.Format(time.RFC3339Nano)}; got != want {
			t.Errorf("%s = %v, want %v", in, got, want)
		}
	}
	for _, in := range []string{"", "20", "2020-1", "2020-13", "2020-02-30", "2020-02-29T", "2020-02-29T25:00Z", "2020-02-29 10:30:15Z", "2020-02-29T10:30:15", "tomorrow"} {
		if _, _, err := ParseDateRange(in); !IsCode(err, EInvalid) {
			t.Errorf("ParseDateRange(%q) = %v, want invalid", in, err)
		}
	}
}
