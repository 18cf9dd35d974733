package sdk

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// The SDK decodes the event and encodes the result envelope by hand. In a
// fresh Go instance every reflection cache is cold, and encoding/json's
// first decode of the Event type took 1.4 ms of a 2.2 ms hello execution;
// this scanner takes tens of microseconds. Values the SDK does not own (the
// handler's input and result types) still go through encoding/json.

var errSyntax = errors.New("invalid JSON")

// maxDepth bounds nesting in skipped values, as encoding/json does (10000).
const maxDepth = 10000

type scanner struct {
	b   []byte
	off int
}

func (s *scanner) ws() {
	for s.off < len(s.b) {
		switch s.b[s.off] {
		case ' ', '\t', '\n', '\r':
			s.off++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.off < len(s.b) {
		return s.b[s.off]
	}
	return 0
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return errSyntax
	}
	s.off++
	return nil
}

// literal consumes lit (true, false, null) if it is next.
func (s *scanner) literal(lit string) bool {
	s.ws()
	if len(s.b)-s.off >= len(lit) && string(s.b[s.off:s.off+len(lit)]) == lit {
		s.off += len(lit)
		return true
	}
	return false
}

// str decodes a JSON string, as encoding/json does: invalid UTF-8 and lone
// surrogates become U+FFFD.
func (s *scanner) str() (string, error) {
	if s.peek() != '"' {
		return "", errSyntax
	}
	s.off++
	start := s.off
	// Fast path: no escapes and plain ASCII or valid UTF-8.
	for s.off < len(s.b) {
		c := s.b[s.off]
		if c == '"' {
			v := s.b[start:s.off]
			s.off++
			if utf8.Valid(v) {
				return string(v), nil
			}
			return string([]rune(string(v))), nil // invalid bytes -> U+FFFD
		}
		if c == '\\' || c < 0x20 {
			break
		}
		s.off++
	}
	if s.off >= len(s.b) {
		return "", errSyntax
	}
	out := append([]byte(nil), s.b[start:s.off]...)
	for s.off < len(s.b) {
		c := s.b[s.off]
		switch {
		case c == '"':
			s.off++
			if !utf8.Valid(out) {
				return string([]rune(string(out))), nil
			}
			return string(out), nil
		case c < 0x20:
			return "", errSyntax
		case c != '\\':
			out = append(out, c)
			s.off++
			continue
		}
		if s.off+1 >= len(s.b) {
			return "", errSyntax
		}
		e := s.b[s.off+1]
		s.off += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return "", errSyntax
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if s.off+1 < len(s.b) && s.b[s.off] == '\\' && s.b[s.off+1] == 'u' {
					save := s.off
					s.off += 2
					if v, ok := s.hex4(); ok {
						r2 = v
					} else {
						return "", errSyntax
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						out = utf8.AppendRune(out, dec)
						continue
					}
					s.off = save // not a pair: the second escape stands alone
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", errSyntax
		}
	}
	return "", errSyntax
}

func (s *scanner) hex4() (rune, bool) {
	if s.off+4 > len(s.b) {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.off : s.off+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	s.off += 4
	return r, true
}

// skip consumes one JSON value, checking its syntax, and returns its bytes.
func (s *scanner) skip(depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, errors.New("JSON nested too deeply")
	}
	c := s.peek()
	start := s.off
	switch {
	case c == '"':
		if _, err := s.str(); err != nil {
			return nil, err
		}
	case c == '{':
		if err := s.object(func(string) error { _, err := s.skip(depth + 1); return err }); err != nil {
			return nil, err
		}
	case c == '[':
		s.off++
		if s.peek() == ']' {
			s.off++
			break
		}
		for {
			if _, err := s.skip(depth + 1); err != nil {
				return nil, err
			}
			if s.peek() != ',' {
				break
			}
			s.off++
		}
		if err := s.expect(']'); err != nil {
			return nil, err
		}
	case c == '-' || '0' <= c && c <= '9':
		if err := s.number(); err != nil {
			return nil, err
		}
	case s.literal("true"), s.literal("false"), s.literal("null"):
	default:
		return nil, errSyntax
	}
	return s.b[start:s.off], nil
}

// number consumes a number with JSON's grammar.
func (s *scanner) number() error {
	b, i := s.b, s.off
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return errSyntax
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return errSyntax
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return errSyntax
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	s.off = i
	return nil
}

// object calls field for each member of an object (or does nothing for
// null); field must consume the value.
func (s *scanner) object(field func(key string) error) error {
	if s.literal("null") {
		return nil
	}
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.off++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		if s.peek() == ',' {
			s.off++
			continue
		}
		return s.expect('}')
	}
}

// optString decodes a string or null (which leaves *dst alone, as
// encoding/json does).
func (s *scanner) optString(dst *string) error {
	if s.literal("null") {
		return nil
	}
	v, err := s.str()
	if err != nil {
		return err
	}
	*dst = v
	return nil
}

func (s *scanner) reference(dst *Reference) error {
	return s.object(func(key string) error {
		switch key {
		case "reference":
			return s.optString(&dst.Reference)
		case "display":
			return s.optString(&dst.Display)
		}
		_, err := s.skip(1)
		return err
	})
}

// parseEvent decodes the event JSON the host hands the bot (ABI.md).
func parseEvent(b []byte) (Event, error) {
	var e Event
	s := &scanner{b: b}
	err := s.object(func(key string) error {
		switch key {
		case "bot":
			return s.reference(&e.Bot)
		case "requester":
			return s.reference(&e.Requester)
		case "contentType":
			return s.optString(&e.ContentType)
		case "traceId":
			return s.optString(&e.TraceID)
		case "input":
			raw, err := s.skip(0)
			if err != nil {
				return err
			}
			e.Input = append(json.RawMessage(nil), raw...)
			return nil
		case "headers":
			if s.peek() == '{' && e.Headers == nil {
				e.Headers = map[string]string{}
			}
			return s.object(func(name string) error {
				var v string
				if err := s.optString(&v); err != nil {
					return err
				}
				e.Headers[name] = v
				return nil
			})
		case "secrets":
			if s.peek() == '{' && e.Secrets == nil {
				e.Secrets = map[string]Secret{}
			}
			return s.object(func(name string) error {
				var sec Secret // a repeated name replaces, as in encoding/json
				err := s.object(func(key string) error {
					switch key {
					case "name":
						return s.optString(&sec.Name)
					case "valueString":
						return s.optString(&sec.ValueString)
					case "valueBoolean":
						switch {
						case s.literal("true"):
							v := true
							sec.ValueBoolean = &v
						case s.literal("false"):
							v := false
							sec.ValueBoolean = &v
						case s.literal("null"):
							sec.ValueBoolean = nil
						default:
							return errSyntax
						}
						return nil
					}
					_, err := s.skip(1)
					return err
				})
				e.Secrets[name] = sec
				return err
			})
		}
		_, err := s.skip(0)
		return err
	})
	if err == nil && s.peek() != 0 {
		err = errSyntax
	}
	if err != nil {
		return Event{}, err
	}
	return e, nil
}

// appendString appends s as a JSON string exactly as encoding/json.Marshal
// writes it: HTML-safe (<, >, & escaped), U+2028 and U+2029 escaped,
// invalid UTF-8 as U+FFFD. The server's internal/jsonx has the same loop
// without the HTML escapes; the SDK is its own module and cannot import it.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendValue appends v as encoding/json.Marshal would, by hand for the
// shapes bots return most (strings, maps of strings, FHIR resources as
// map[string]any), and through encoding/json for anything else.
func appendValue(b []byte, v any, depth int) ([]byte, error) {
	if depth > 100 {
		return appendMarshal(b, v)
	}
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		return appendString(b, v), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case json.Number:
		if v == "" {
			return append(b, '0'), nil
		}
		return appendMarshal(b, v) // validated by encoding/json
	case map[string]string:
		return appendMap(b, v, depth)
	case map[string]any:
		return appendMap(b, v, depth)
	case Resource:
		return appendMap(b, v, depth)
	case []any:
		return appendSlice(b, v, depth)
	case []string:
		return appendSlice(b, v, depth)
	}
	return appendMarshal(b, v)
}

func appendMarshal(b []byte, v any) ([]byte, error) {
	m, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, m...), nil
}

// appendMap writes an object with sorted keys (null for a nil map), as
// encoding/json does.
func appendMap[M ~map[string]V, V any](b []byte, m M, depth int) ([]byte, error) {
	if m == nil {
		return append(b, "null"...), nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		var err error
		if b, err = appendValue(b, m[k], depth+1); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendSlice[V any](b []byte, s []V, depth int) ([]byte, error) {
	if s == nil {
		return append(b, "null"...), nil
	}
	b = append(b, '[')
	for i, e := range s {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendValue(b, e, depth+1); err != nil {
			return nil, err
		}
	}
	return append(b, ']'), nil
}
