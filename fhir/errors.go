package fhir

import (
	"errors"
	"fmt"
	"time"
)

// ErrorCode classifies an *Error. Each code maps to exactly one HTTP status
// (see Status) and one OperationOutcome shape (see OutcomeFor).
type ErrorCode string

// Error codes, named after what went wrong rather than after HTTP.
const (
	EInvalid          ErrorCode = "invalid"             // 400: the request is malformed or breaks a rule
	EUnauthorized     ErrorCode = "unauthorized"        // 401: no or bad credentials
	EForbidden        ErrorCode = "forbidden"           // 403: authenticated but not allowed
	ENotFound         ErrorCode = "not-found"           // 404
	EConflict         ErrorCode = "conflict"            // 409
	EGone             ErrorCode = "gone"                // 410: the resource was deleted
	EPrecondition     ErrorCode = "precondition-failed" // 412
	EMultipleMatches  ErrorCode = "multiple-matches"    // 412
	ETooLarge         ErrorCode = "content-too-large"   // 413
	EUnsupportedMedia ErrorCode = "unsupported-media"   // 415
	EBusinessRule     ErrorCode = "business-rule"       // 422
	EThrottled        ErrorCode = "too-many-requests"   // 429
	ENotImplemented   ErrorCode = "not-implemented"     // 501
	EUnavailable      ErrorCode = "unavailable"         // 503: a dependency (the database) cannot be reached; retry later
	EInternal         ErrorCode = "internal"            // 500: never for a client mistake
)

// Error is the error type every sandbot layer returns for an expected
// failure. Anything that is not an *Error is an internal error.
type Error struct {
	Code ErrorCode
	// Message is safe to show to the caller.
	Message string
	// Expression names the offending field(s), as OperationOutcome.issue.expression.
	Expression []string
	// Outcome, when set, is sent as-is instead of one built from Code and Message
	// (a bot may fail with its own OperationOutcome).
	Outcome *OperationOutcome
	// RetryAfter, when set, tells the caller of a refused request (code
	// EThrottled) when to try again.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if len(e.Expression) > 0 {
		return fmt.Sprintf("%s: %s (%v)", e.Code, e.Message, e.Expression)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Errorf builds an *Error with a formatted message.
func Errorf(code ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid is a 400 error naming the offending expression.
func Invalid(message string, expression ...string) *Error {
	return &Error{Code: EInvalid, Message: message, Expression: expression}
}

// Common errors whose text the reference client knows.
var (
	ErrNotFound     = &Error{Code: ENotFound, Message: "Not found"}
	ErrGone         = &Error{Code: EGone, Message: "Gone"}
	ErrForbidden    = &Error{Code: EForbidden, Message: "Forbidden"}
	ErrUnauthorized = &Error{Code: EUnauthorized, Message: "Unauthorized"}
	ErrUnavailable  = &Error{Code: EUnavailable, Message: "Service unavailable: the database cannot be reached; retry later"}
)

// ErrorCodeOf returns the code of err, or EInternal when err is not an *Error.
func ErrorCodeOf(err error) ErrorCode {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if err == nil {
		return ""
	}
	return EInternal
}

// IsCode reports whether err is an *Error with the given code.
func IsCode(err error, code ErrorCode) bool { return err != nil && ErrorCodeOf(err) == code }

// Status is the HTTP status of a code. It lives here, beside the codes, so that
// the mapping is written once; internal/handlers/httpx is its only caller.
func (c ErrorCode) Status() int {
	switch c {
	case EInvalid:
		return 400
	case EUnauthorized:
		return 401
	case EForbidden:
		return 403
	case ENotFound:
		return 404
	case EConflict:
		return 409
	case EGone:
		return 410
	case EPrecondition, EMultipleMatches:
		return 412
	case ETooLarge:
		return 413
	case EUnsupportedMedia:
		return 415
	case EBusinessRule:
		return 422
	case EThrottled:
		return 429
	case ENotImplemented:
		return 501
	case EUnavailable:
		return 503
	default:
		return 500
	}
}
