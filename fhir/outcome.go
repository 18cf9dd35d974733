package fhir

import "errors"

// OperationOutcome is the FHIR error and status envelope, shaped as the
// reference platform emits it (its client keys on id and issue[0].code).
type OperationOutcome struct {
	ResourceType string      `json:"resourceType"`
	ID           string      `json:"id,omitempty"`
	Issue        []Issue     `json:"issue"`
	Extension    []Extension `json:"extension,omitempty"`
}

// Issue is one OperationOutcome.issue entry.
type Issue struct {
	Severity    string        `json:"severity"`
	Code        string        `json:"code"`
	Details     *IssueDetails `json:"details,omitempty"`
	Diagnostics string        `json:"diagnostics,omitempty"`
	Expression  []string      `json:"expression,omitempty"`
}

// IssueDetails is the CodeableConcept of an issue; only its text is used.
type IssueDetails struct {
	Text string `json:"text"`
}

// Extension is a FHIR extension as used for request tracing.
type Extension struct {
	URL       string      `json:"url"`
	ValueID   string      `json:"valueId,omitempty"`
	Extension []Extension `json:"extension,omitempty"`
}

// TracingExtensionURL is the extension the reference attaches to outcomes.
const TracingExtensionURL = "https://medplum.com/fhir/StructureDefinition/tracing"

// AllOK is the outcome of a successful operation without a resource body.
func AllOK() *OperationOutcome {
	return &OperationOutcome{ResourceType: "OperationOutcome", ID: "ok",
		Issue: []Issue{{Severity: "information", Code: "informational", Details: &IssueDetails{Text: "All OK"}}}}
}

// Accepted is the outcome of a request accepted for asynchronous
// processing (Prefer: respond-async); diagnostics, when set, is where its
// status is polled, as the reference puts it.
func Accepted(diagnostics string) *OperationOutcome {
	return &OperationOutcome{ResourceType: "OperationOutcome", ID: "accepted",
		Issue: []Issue{{Severity: "information", Code: "informational", Details: &IssueDetails{Text: "Accepted"}, Diagnostics: diagnostics}}}
}

// outcomeShape gives the reference's id and issue code for each error code.
var outcomeShape = map[ErrorCode]struct{ id, code, text string }{
	EInvalid:          {"", "invalid", ""},
	EUnauthorized:     {"unauthorized", "login", "Unauthorized"},
	EForbidden:        {"forbidden", "forbidden", "Forbidden"},
	ENotFound:         {"not-found", "not-found", "Not found"},
	EConflict:         {"conflict", "conflict", ""},
	EGone:             {"gone", "deleted", "Gone"},
	EPrecondition:     {"precondition-failed", "processing", "Precondition Failed"},
	EMultipleMatches:  {"multiple-matches", "multiple-matches", "Multiple resources found matching condition"},
	ETooLarge:         {"content-too-large", "too-long", ""},
	EUnsupportedMedia: {"unsupported-media-type", "not-supported", "Unsupported media type"},
	EBusinessRule:     {"business-rule", "business-rule", ""},
	EThrottled:        {"too-many-requests", "throttled", "Too Many Requests"},
	ENotImplemented:   {"not-implemented", "not-supported", "Not implemented"},
	EUnavailable:      {"unavailable", "transient", ""},
	EInternal:         {"", "exception", "Internal server error"},
}

// OutcomeFor renders err as the reference would. Internal errors never leak
// their text: the caller logs them and the client sees a generic message.
func OutcomeFor(err error) *OperationOutcome {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: EInternal}
	}
	if e.Outcome != nil {
		return e.Outcome
	}
	shape, ok := outcomeShape[e.Code]
	if !ok {
		shape = outcomeShape[EInternal]
	}
	text := e.Message
	if text == "" || e.Code == EInternal {
		text = shape.text
	}
	return &OperationOutcome{
		ResourceType: "OperationOutcome",
		ID:           shape.id,
		Issue: []Issue{{
			Severity:   "error",
			Code:       shape.code,
			Details:    &IssueDetails{Text: text},
			Expression: e.Expression,
		}},
	}
}

// WithTracing adds the request and trace ids to an outcome.
func (o *OperationOutcome) WithTracing(requestID, traceID string) *OperationOutcome {
	var ext []Extension
	if requestID != "" {
		ext = append(ext, Extension{URL: "requestId", ValueID: requestID})
	}
	if traceID != "" {
		ext = append(ext, Extension{URL: "traceId", ValueID: traceID})
	}
	if len(ext) > 0 {
		o.Extension = []Extension{{URL: TracingExtensionURL, Extension: ext}}
	}
	return o
}
