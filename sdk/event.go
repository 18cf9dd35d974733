package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"

	"github.com/sandbot/sandbot/sdk/hl7"
)

// Reference is a FHIR reference as the event carries it.
type Reference struct {
	Reference string `json:"reference,omitempty"`
	Display   string `json:"display,omitempty"`
}

// Secret is one of the bot's project secrets.
type Secret struct {
	Name         string `json:"name"`
	ValueString  string `json:"valueString,omitempty"`
	ValueBoolean *bool  `json:"valueBoolean,omitempty"`
}

// Event is what the server hands the bot (ABI.md, "Event").
type Event struct {
	Bot         Reference         `json:"bot"`
	Requester   Reference         `json:"requester"`
	ContentType string            `json:"contentType"`
	Input       json.RawMessage   `json:"input"`
	Secrets     map[string]Secret `json:"secrets,omitempty"`
	TraceID     string            `json:"traceId,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// Media types of the requests a bot may receive.
const (
	TextPlain = "text/plain"
	JSONType  = "application/json"
	FHIRJSON  = "application/fhir+json"
	FormType  = "application/x-www-form-urlencoded"
	HL7Type   = "x-application/hl7-v2+er7"
)

// ErrNoInput is returned by the accessors when the event has no input.
var ErrNoInput = errors.New("sdk: the event has no input")

func (e Event) hasInput() bool {
	return len(e.Input) > 0 && string(e.Input) != "null"
}

// Text returns the input as a string: the body of a text/plain or HL7
// request. Any other input is an error.
func (e Event) Text() (string, error) {
	if !e.hasInput() {
		return "", ErrNoInput
	}
	var s string
	if err := json.Unmarshal(e.Input, &s); err != nil {
		return "", fmt.Errorf("sdk: input (%s) is not text", e.ContentType)
	}
	return s, nil
}

// JSON decodes the input (a JSON or FHIR request body) into v.
func (e Event) JSON(v any) error {
	if !e.hasInput() {
		return ErrNoInput
	}
	if err := json.Unmarshal(e.Input, v); err != nil {
		return fmt.Errorf("sdk: decoding input: %w", err)
	}
	return nil
}

// Form returns the input of a form post or of a GET (its query
// parameters) as url.Values.
func (e Event) Form() (url.Values, error) {
	vals := url.Values{}
	if !e.hasInput() {
		return vals, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(e.Input, &raw); err != nil {
		return nil, fmt.Errorf("sdk: input (%s) is not a form", e.ContentType)
	}
	for k, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			vals[k] = []string{s}
			continue
		}
		var ss []string
		if err := json.Unmarshal(v, &ss); err != nil {
			return nil, fmt.Errorf("sdk: form field %q is neither a string nor strings", k)
		}
		vals[k] = ss
	}
	return vals, nil
}

// Resource returns the input as a FHIR resource (an object with a
// resourceType). To decode into a struct, use JSON.
func (e Event) Resource() (Resource, error) {
	var r Resource
	if err := e.JSON(&r); err != nil {
		return nil, err
	}
	if r.ResourceType() == "" {
		return nil, errors.New("sdk: input is not a FHIR resource (no resourceType)")
	}
	return r, nil
}

// HL7 parses the input of an HL7 v2 (x-application/hl7-v2+er7) request.
func (e Event) HL7() (*hl7.Message, error) {
	s, err := e.Text()
	if err != nil {
		return nil, err
	}
	return hl7.Parse([]byte(s))
}

// Secret returns the string value of the named project secret, or "".
func (e Event) Secret(name string) string {
	return e.Secrets[name].ValueString
}

// Header returns a request header (names are lower case; authorization
// and cookie are never present).
func (e Event) Header(name string) string {
	return e.Headers[name]
}

// Resource is a FHIR resource as a generic JSON object.
type Resource map[string]any

// ResourceType returns the resource's resourceType, or "".
func (r Resource) ResourceType() string { s, _ := r["resourceType"].(string); return s }

// ID returns the resource's id, or "".
func (r Resource) ID() string { s, _ := r["id"].(string); return s }
