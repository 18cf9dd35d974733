package runtime

import (
	"encoding/json"
	"net/url"
	"reflect"
	"testing"
)

// TestEventJSONMatchesMarshal: the hand-written encoder gives the same JSON
// value as encoding/json for events with every kind of input, escapes in
// every string, secrets and headers.
func TestEventJSONMatchesMarshal(t *testing.T) {
	hl7in, _ := Input(MediaHL7, []byte("MSH|^~\\&|A|B|C|D|20240102||ADT^A01|1|P|2.5\rPID|||1^^^<x>&y||Doe^\"Jo\"\r"))
	form := FormInput(url.Values{"a": {"1"}, "b": {"2", "3"}})
	text, _ := Input(MediaText, []byte("é \u2028 \x01 line\nbreak"))
	for _, ev := range []Event{
		{},
		{Bot: Reference{Reference: "Bot/1", Display: "Name \"quoted\" <b>"}, Requester: Reference{Reference: "Practitioner/2"},
			ContentType: MediaHL7, Input: hl7in, TraceID: "t\x00", Headers: map[string]string{"z": "1", "a": "é", "content-type": "x"},
			Secrets: map[string]any{"k": map[string]any{"name": "k", "valueString": "v&<>"}, "b": map[string]any{"name": "b", "valueBoolean": true}}},
		{ContentType: MediaForm, Input: form, Headers: map[string]string{}},
		{ContentType: MediaText, Input: text, Secrets: map[string]any{}},
		{ContentType: MediaJSON, Input: json.RawMessage(`{"deep":[1,{"x":null}],"n":-1.5e3}`)},
	} {
		got, err := ev.JSON()
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("Event.JSON is not valid JSON: %v\n%s", err, got)
		}
		json.Unmarshal(want, &w)
		// encoding/json writes nil maps as null, the ABI (and JSON) as {}.
		wm := w.(map[string]any)
		for _, k := range []string{"secrets", "headers"} {
			if wm[k] == nil {
				wm[k] = map[string]any{}
			}
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("Event.JSON\n got %s\nwant %s", got, want)
		}
	}
}
