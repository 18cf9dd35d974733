package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

// buildEnvelope encodes the result envelope (ABI.md): {"result": ...},
// or {"error": ...} with an optional status, and an optional contentType.
// Written by hand (jsonscan.go); byte-identical to encoding/json's output
// for the same values.
func buildEnvelope(v any, err error) []byte {
	var result, errVal any
	status, contentType := 0, ""
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			status = e.Status
			if e.Outcome != nil {
				errVal = e.Outcome
			} else {
				errVal = e.Message
			}
		} else {
			errVal = err.Error()
		}
		if errVal == "" {
			errVal = "bot failed"
		}
	} else {
		switch r := v.(type) {
		case Response:
			result, status, contentType = resultValue(r.Body), r.Status, r.ContentType
		case *Response:
			if r != nil {
				result, status, contentType = resultValue(r.Body), r.Status, r.ContentType
			}
		default:
			result = resultValue(v)
		}
	}
	b := make([]byte, 0, 256)
	b = append(b, '{')
	var merr error
	if result != nil {
		b = append(b, `"result":`...)
		b, merr = appendValue(b, result, 0)
	}
	if errVal != nil && merr == nil {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, `"error":`...)
		b, merr = appendValue(b, errVal, 0)
	}
	if merr != nil {
		b = append(b[:0], `{"error":`...)
		b = appendString(b, "sdk: cannot encode the bot's result: "+merr.Error())
		return append(b, '}')
	}
	if status != 0 {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, `"status":`...)
		b = strconv.AppendInt(b, int64(status), 10)
	}
	if contentType != "" {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, `"contentType":`...)
		b = appendString(b, contentType)
	}
	return append(b, '}')
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
