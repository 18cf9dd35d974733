package fhir

import (
	"bytes"
	"encoding/json"
	"sort"
	"testing"
)

// refMarshal is Marshal written with encoding/json: the reference the fast
// encoder must match byte for byte.
func refMarshal(r Resource) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	buf.WriteByte('{')
	first := true
	field := func(k string, v any) error {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		if err := enc.Encode(k); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1)
		buf.WriteByte(':')
		if err := enc.Encode(v); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1)
		return nil
	}
	for _, k := range leadingFields {
		if v, ok := r[k]; ok {
			if err := field(k, v); err != nil {
				return nil, err
			}
		}
	}
	var keys []string
	for k := range r {
		if k != "resourceType" && k != "id" && k != "meta" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := field(k, r[k]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func TestMarshalMatchesEncodingJSON(t *testing.T) {
	r := Resource{
		"resourceType": "Patient", "id": "x",
		"text":  "quote \" backslash \\ nl \n tab \t cr \r bs \b ff \f nul \x00 esc \x1b <html> & \u2028 \u2029 é 🙂 bad\xffutf8",
		"n":     json.Number("1.50"),
		"b":     []any{true, false, nil, map[string]any{"z": "1", "a": []any{}}},
		"other": map[string]string{"k": "v"}, // not a decoded type: falls back
		"num":   3,
	}
	expectMarshalMatches(t, r)
}

func FuzzMarshalMatchesEncodingJSON(f *testing.F) {
	f.Add([]byte(`{"resourceType":"Patient","name":[{"family":"a\u0001b\"c\\\u2028"}],"n":1e5}`))
	f.Add([]byte(`{"resourceType":"Observation","valueQuantity":{"value":-0.0},"note":[{"text":"<b>&</b>"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseResource(b)
		if err != nil {
			return
		}
		expectMarshalMatches(t, r)
	})
}

func expectMarshalMatches(t *testing.T, r Resource) {
	t.Helper()
	got, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want, err := refMarshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Marshal differs from encoding/json:\n got %s\nwant %s", got, want)
	}
}
