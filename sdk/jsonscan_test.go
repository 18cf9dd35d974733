//go:build !wasip1

package sdk

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"testing"
)

// The hand-written event decoder and envelope encoder must agree with
// encoding/json, which they replace for speed.

var eventSamples = []string{
	`{"bot":{"reference":"Bot/1"},"requester":{"reference":"Practitioner/2","display":"Dr \u00e9"},"contentType":"application/json","input":{"name":"Ada","n":[1,2.5e3,-0,true,false,null,{}]},"secrets":{"k":{"name":"k","valueString":"v"},"b":{"name":"b","valueBoolean":true},"f":{"name":"f","valueBoolean":false}},"traceId":"t-1","headers":{"x-a":"1","content-type":"text/plain"}}`,
	`{}`,
	` { "input" : null , "bot" : null } `,
	`{"input":"MSH|^~\\&|A\r\nPID|||1\u2028\ud83d\ude00\ud800x\"\\\/\b\f\n\r\t"}`,
	`{"input":"<a href='x'>&</a>","unknown":{"deep":[[[{"x":[]}]]]},"contentType":"text/plain"}`,
	`{"headers":{},"secrets":{},"input":[],"traceId":null,"contentType":"x\u0000y"}`,
	`{"bot":{"reference":"Bot/1","extra":[1,{"a":"b"}]},"input":12345678901234567890}`,
	"{\"input\":\"\xff\xfe bad utf8 \xc3\"}",
	`{"secrets":{"x":{"valueBoolean":null,"valueString":"a"},"x":{"name":"x"}}}`,
}

func TestParseEventMatchesEncodingJSON(t *testing.T) {
	for _, in := range eventSamples {
		var want Event
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("sample does not decode with encoding/json: %v\n%s", err, in)
		}
		got, err := parseEvent([]byte(in))
		if err != nil {
			t.Errorf("parseEvent(%s): %v", in, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("parseEvent(%s)\n got %#v\nwant %#v", in, got, want)
		}
	}
}

func TestParseEventRejectsBadJSON(t *testing.T) {
	for _, in := range []string{
		``, `[]`, `"x"`, `{`, `{"input":}`, `{"input":1,}`, `{"input":01}`, `{"input":1.}`, `{"input":-}`,
		`{"input":"\x"}`, `{"input":"\u12"}`, "{\"input\":\"a\nb\"}", `{"input":tru}`, `{"input":[1 2]}`,
		`{"bot":"Bot/1"}`, `{"secrets":{"a":{"valueBoolean":"yes"}}}`, `{} {}`, `{"a":1}x`, `{'a':1}`,
	} {
		if _, err := parseEvent([]byte(in)); err == nil {
			t.Errorf("parseEvent(%q) accepted bad input", in)
		}
	}
}

// FuzzParseEvent: never panics, accepts only valid JSON, and reads
// events encoding/json wrote (with canonical keys) as encoding/json does.
func FuzzParseEvent(f *testing.F) {
	for _, s := range eventSamples {
		f.Add([]byte(s), "Bot/1", "text/plain", "t", "k", "v", true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, ref, ct, trace, key, val string, indent bool) {
		if e, err := parseEvent(raw); err == nil {
			if !json.Valid(raw) {
				t.Fatalf("accepted invalid JSON %q as %#v", raw, e)
			}
			if e.Input != nil && !json.Valid(e.Input) {
				t.Fatalf("input %q is not valid JSON", e.Input)
			}
		}
		in := json.RawMessage(raw)
		if !json.Valid(raw) {
			in, _ = json.Marshal(string(raw))
		}
		ev := Event{Bot: Reference{Reference: ref, Display: val}, Requester: Reference{Reference: key},
			ContentType: ct, Input: in, TraceID: trace,
			Secrets: map[string]Secret{key: {Name: key, ValueString: val}}, Headers: map[string]string{key: val, ct: trace}}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Skip()
		}
		if indent {
			var buf bytes.Buffer
			if json.Indent(&buf, b, " ", "\t") == nil {
				b = buf.Bytes()
			}
		}
		var want Event
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("encoding/json cannot read its own output: %v", err)
		}
		got, err := parseEvent(b)
		if err != nil {
			t.Fatalf("parseEvent(%s): %v", b, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("parseEvent(%s)\n got %#v\nwant %#v", b, got, want)
		}
	})
}

func valueSamples() []any {
	return []any{
		nil, "", "plain", "<tag> & \"q\" \\ \u2028\u2029 \x00\x1f\x7f é 😀 \xff\xc3",
		true, false, 0, -42, int64(math.MaxInt64), 1.5, 1e21, 1e-7, -0.0, 123456789.0, json.Number("12.50"),
		map[string]string{"b": "2", "a": "1", "<": ">"},
		map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"given": []any{"Ada"}}}, "active": true, "n": 3.25, "x": nil},
		Resource{"resourceType": "Observation", "valueQuantity": map[string]any{"value": 7}},
		[]any{}, []any(nil), map[string]any(nil), map[string]string(nil), map[string]string{}, []string{"a", "<b>"}, []string(nil),
		struct {
			A string `json:"a"`
			B []int  `json:"b,omitempty"`
		}{A: "s"},
		json.RawMessage(` { "a" : [1, 2] } `),
		[]int{1, 2},
	}
}

func TestAppendValueMatchesEncodingJSON(t *testing.T) {
	for _, v := range valueSamples() {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendValue(nil, v, 0)
		if err != nil {
			t.Errorf("appendValue(%#v): %v", v, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("appendValue(%#v)\n got %s\nwant %s", v, got, want)
		}
	}
	if _, err := appendValue(nil, math.Inf(1), 0); err == nil {
		t.Error("+Inf encoded without error")
	}
	if got := string(buildEnvelope(math.NaN(), nil)); got != `{"error":"sdk: cannot encode the bot's result: json: unsupported value: NaN"}` {
		t.Errorf("unencodable result: %s", got)
	}
}

// FuzzAppendValue: arbitrary strings (keys and values, any bytes) encode
// exactly as encoding/json encodes them.
func FuzzAppendValue(f *testing.F) {
	f.Add("a", "b<>&\u2028", 1.5, true)
	f.Add("\xff", "\x00\"\\", -1e300, false)
	f.Fuzz(func(t *testing.T, k, s string, x float64, b bool) {
		v := map[string]any{k: s, s: []any{k, x, b, map[string]string{s: k, k: s}}, "n": nil}
		want, werr := json.Marshal(v)
		got, gerr := appendValue(nil, v, 0)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("errors differ: %v vs %v", gerr, werr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("appendValue\n got %s\nwant %s", got, want)
		}
	})
}
