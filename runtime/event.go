package runtime

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"unicode/utf8"

	"github.com/sandbot/sandbot/internal/jsonx"
	"github.com/sandbot/sandbot/sdk/hl7"
)

// The media types the ABI maps to event.input.
const (
	MediaText = "text/plain"
	MediaJSON = "application/json"
	MediaFHIR = "application/fhir+json"
	MediaForm = "application/x-www-form-urlencoded"
	MediaHL7  = "x-application/hl7-v2+er7"
)

// Reference is a FHIR Reference in an event.
type Reference struct {
	Reference string `json:"reference"`
	Display   string `json:"display,omitempty"`
}

// Event is what a bot receives (bot ABI, "Event").
type Event struct {
	Bot         Reference         `json:"bot"`
	Requester   Reference         `json:"requester"`
	ContentType string            `json:"contentType"`
	Input       json.RawMessage   `json:"input"`
	Secrets     map[string]any    `json:"secrets"`
	TraceID     string            `json:"traceId"`
	Headers     map[string]string `json:"headers"`
}

// JSON encodes the event. It is written by hand (a tenth of json.Marshal's
// time: encoding/json would re-validate and compact Input, which can be a
// megabyte of HL7), so Input must be what Input or FormInput returned:
// valid, compact JSON. Keys come in the order of the ABI's example, map
// keys sorted.
func (e *Event) JSON() ([]byte, error) {
	b := make([]byte, 0, 256+len(e.Input))
	b = append(b, `{"bot":`...)
	b = appendReference(b, e.Bot)
	b = append(b, `,"requester":`...)
	b = appendReference(b, e.Requester)
	b = append(b, `,"contentType":`...)
	b = jsonx.AppendString(b, e.ContentType)
	b = append(b, `,"input":`...)
	if len(e.Input) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, e.Input...)
	}
	b = append(b, `,"secrets":`...)
	if len(e.Secrets) == 0 {
		b = append(b, "{}"...)
	} else {
		s, err := json.Marshal(e.Secrets)
		if err != nil {
			return nil, err
		}
		b = append(b, s...)
	}
	b = append(b, `,"traceId":`...)
	b = jsonx.AppendString(b, e.TraceID)
	b = append(b, `,"headers":{`...)
	keys := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonx.AppendString(b, k)
		b = append(b, ':')
		b = jsonx.AppendString(b, e.Headers[k])
	}
	return append(b, "}}"...), nil
}

func appendReference(b []byte, r Reference) []byte {
	b = append(b, `{"reference":`...)
	b = jsonx.AppendString(b, r.Reference)
	if r.Display != "" {
		b = append(b, `,"display":`...)
		b = jsonx.AppendString(b, r.Display)
	}
	return append(b, '}')
}

// InputError says why a body does not fit its media type.
type InputError struct {
	// Unsupported is set when the media type is not one the ABI maps.
	Unsupported bool
	Message     string
	// HL7 is the position of an HL7 parse failure.
	HL7 *hl7.ParseError
}

func (e *InputError) Error() string { return e.Message }

// Input maps a request body of the given media type (parameters removed) to
// event.input as the ABI says. HL7 is checked with the hl7 package, FHIR
// JSON must be an object with a resourceType, text must be UTF-8; an empty
// body without a media type is the empty object.
func Input(mediaType string, body []byte) (json.RawMessage, error) {
	switch {
	case mediaType == MediaText:
		if !utf8.Valid(body) {
			return nil, &InputError{Message: "Content could not be parsed: text is not UTF-8"}
		}
		return json.Marshal(string(body))
	case mediaType == MediaHL7:
		if err := checkHL7(body); err != nil {
			return nil, err
		}
		return json.Marshal(string(body))
	case mediaType == MediaForm:
		values, err := url.ParseQuery(string(bytes.TrimSpace(body)))
		if err != nil {
			return nil, &InputError{Message: "Content could not be parsed: invalid form body"}
		}
		return FormInput(values), nil
	case mediaType == MediaJSON:
		return compactJSON(body)
	case isJSON(mediaType):
		var head struct {
			ResourceType any `json:"resourceType"`
		}
		trimmed := bytes.TrimSpace(body)
		if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &head) != nil {
			return nil, &InputError{Message: "Content could not be parsed"}
		}
		if rt, ok := head.ResourceType.(string); !ok || rt == "" {
			return nil, &InputError{Message: "Input must be a FHIR resource (an object with a resourceType)"}
		}
		return compactJSON(trimmed)
	case mediaType == "" && len(bytes.TrimSpace(body)) == 0:
		return json.RawMessage(`{}`), nil
	}
	return nil, &InputError{Unsupported: true, Message: "Unsupported media type: " + mediaType}
}

// FormInput maps form or query values to an object of strings, with an
// array of strings for a repeated key.
func FormInput(v url.Values) json.RawMessage {
	out := make(map[string]any, len(v))
	for k, vals := range v {
		if len(vals) == 1 {
			out[k] = vals[0]
		} else {
			out[k] = vals
		}
	}
	b, _ := json.Marshal(out)
	return b
}

func isJSON(mt string) bool {
	return len(mt) > len("application/+json") && mt[:12] == "application/" && mt[len(mt)-5:] == "+json"
}

func compactJSON(b []byte) (json.RawMessage, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, &InputError{Message: "Content could not be parsed"}
	}
	return buf.Bytes(), nil
}

// checkHL7 checks that a body parses as an HL7 v2 message or batch.
func checkHL7(body []byte) error {
	var err error
	trimmed := bytes.TrimLeft(body, "\ufeff\x0b \r\n")
	if bytes.HasPrefix(trimmed, []byte("FHS")) || bytes.HasPrefix(trimmed, []byte("BHS")) {
		_, err = hl7.ParseBatch(body)
	} else {
		_, err = hl7.Parse(body)
	}
	if err == nil {
		return nil
	}
	var pe *hl7.ParseError
	if errors.As(err, &pe) {
		return &InputError{HL7: pe, Message: fmt.Sprintf("Content could not be parsed: invalid HL7 at byte %d (line %d, segment %q, field %d): %s",
			pe.Offset, pe.Line, pe.Segment, pe.Field, pe.Reason)}
	}
	return &InputError{Message: "Content could not be parsed: " + err.Error()}
}
