package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Response is a handler result with an explicit HTTP status (200..499) and
// content type; zero fields keep the server's defaults.
type Response struct {
	Status      int
	ContentType string
	Body        any
}

// WithStatus returns body as a Response with the given status.
func WithStatus(status int, body any) Response {
	return Response{Status: status, Body: body}
}

// WithContentType returns body as a Response with the given content type.
func WithContentType(contentType string, body any) Response {
	return Response{ContentType: contentType, Body: body}
}

// Error is a handler error with an optional status (400..499; 0 = 400) and
// an optional OperationOutcome (a map or struct) sent instead of Message.
type Error struct {
	Status  int
	Message string
	Outcome any
}

func (e *Error) Error() string { return e.Message }

// Errorf returns an *Error with the given status and formatted message.
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// Handler handles one event. Its result becomes {"result": value}, its
// error {"error": message}.
type Handler func(ctx Context, e Event) (any, error)

type envelope struct {
	Result      any    `json:"result,omitempty"`
	Error       any    `json:"error,omitempty"`
	Status      int    `json:"status,omitempty"`
	ContentType string `json:"contentType,omitempty"`
}

// resultValue maps the handler's value to what goes under "result".
func resultValue(v any) any {
	switch v := v.(type) {
	case []byte:
		return string(v) // text, not base64
	case json.RawMessage:
		if len(v) == 0 {
			return nil
		}
		return v
	}
	return v
}

func buildEnvelope(v any, err error) []byte {
	var env envelope
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			env.Status = e.Status
			if e.Outcome != nil {
				env.Error = e.Outcome
			} else {
				env.Error = e.Message
			}
		} else {
			env.Error = err.Error()
		}
		if env.Error == "" {
			env.Error = "bot failed"
		}
	} else {
		switch r := v.(type) {
		case Response:
			env.Result, env.Status, env.ContentType = resultValue(r.Body), r.Status, r.ContentType
		case *Response:
			if r != nil {
				env.Result, env.Status, env.ContentType = resultValue(r.Body), r.Status, r.ContentType
			}
		default:
			env.Result = resultValue(v)
		}
	}
	b, merr := json.Marshal(env)
	if merr != nil {
		b, _ = json.Marshal(envelope{Error: "sdk: cannot encode the bot's result: " + merr.Error()})
	}
	return b
}
