package fhir

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/sandbot/sandbot/internal/jsonx"
)

// Resource is a FHIR resource as a decoded JSON object. Numbers stay
// json.Number so that a round trip through the server never changes them.
type Resource map[string]any

// Reference is a FHIR Reference.
type Reference struct {
	Reference string `json:"reference,omitempty"`
	Display   string `json:"display,omitempty"`
}

// Meta is what the server owns in Resource.meta.
type Meta struct {
	VersionID   string
	LastUpdated time.Time
	Project     string
	Author      Reference
}

// Record is one stored version of a resource, as the store answers it.
type Record struct {
	ResourceType string
	ID           string
	VersionID    string
	LastUpdated  time.Time
	Project      string
	Deleted      bool
	// JSON is the resource as stored, meta included; nil for a deletion.
	JSON []byte
}

// Resource decodes the record.
func (r *Record) Resource() (Resource, error) { return ParseResource(r.JSON) }

// TimeFormat is how instants are written (FHIR instant, millisecond precision, UTC).
const TimeFormat = "2006-01-02T15:04:05.000Z"

// ValidID reports whether id is a syntactically valid FHIR logical id:
// 1 to 64 of [A-Za-z0-9-.]. It runs on every read, so it is a loop rather
// than a regular expression (a fifth of the cost of a primary-key read).
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// ParseResource decodes a resource body. It must be a JSON object with a
// known resourceType.
func ParseResource(data []byte) (Resource, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, Invalid("Content could not be parsed")
	}
	if dec.More() {
		return nil, Invalid("Content could not be parsed")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, Invalid("Resource must be a JSON object")
	}
	r := Resource(obj)
	rt, _ := r["resourceType"].(string)
	if rt == "" {
		return nil, Invalid("Missing resourceType", "resourceType")
	}
	if !KnownType(rt) {
		return nil, Invalid("Unknown resource type: "+rt, "resourceType")
	}
	return r, nil
}

// Type is the resourceType.
func (r Resource) Type() string { s, _ := r["resourceType"].(string); return s }

// ID is the logical id ("" before creation).
func (r Resource) ID() string { s, _ := r["id"].(string); return s }

// String returns a top-level string field.
func (r Resource) String(field string) string { s, _ := r[field].(string); return s }

// Bool returns a top-level boolean field.
func (r Resource) Bool(field string) bool { b, _ := r[field].(bool); return b }

// Ref returns the reference string of a top-level Reference field.
func (r Resource) Ref(field string) string {
	m, _ := r[field].(map[string]any)
	s, _ := m["reference"].(string)
	return s
}

// Clone returns a deep copy.
func (r Resource) Clone() Resource {
	return deepCopy(map[string]any(r)).(map[string]any)
}

func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[k] = deepCopy(x)
		}
		return m
	case []any:
		s := make([]any, len(t))
		for i, x := range t {
			s[i] = deepCopy(x)
		}
		return s
	default:
		return v
	}
}

// SetMeta writes the server-owned meta fields, keeping any others the client sent
// (tags, profiles, security).
func (r Resource) SetMeta(m Meta) {
	meta, _ := r["meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["versionId"] = m.VersionID
	meta["lastUpdated"] = m.LastUpdated.UTC().Format(TimeFormat)
	meta["project"] = m.Project
	if m.Author.Reference != "" {
		a := map[string]any{"reference": m.Author.Reference}
		if m.Author.Display != "" {
			a["display"] = m.Author.Display
		}
		meta["author"] = a
	}
	delete(meta, "compartment")
	r["meta"] = meta
}

// MetaProject is meta.project of a stored resource.
func (r Resource) MetaProject() string {
	meta, _ := r["meta"].(map[string]any)
	s, _ := meta["project"].(string)
	return s
}

// MetaVersion is meta.versionId of a stored resource.
func (r Resource) MetaVersion() string {
	meta, _ := r["meta"].(map[string]any)
	s, _ := meta["versionId"].(string)
	return s
}

// MetaAuthor is meta.author.reference of a stored resource.
func (r Resource) MetaAuthor() string {
	meta, _ := r["meta"].(map[string]any)
	author, _ := meta["author"].(map[string]any)
	s, _ := author["reference"].(string)
	return s
}

// leadingFields are written first, in this order, as FHIR servers
// conventionally do; the other fields follow sorted by name.
var leadingFields = []string{"resourceType", "id", "meta"}

// Marshal encodes the resource: leadingFields first, then the other fields
// by name, nested objects with sorted keys, strings escaped as encoding/json
// does without HTML escaping. The values a decoded resource holds (maps,
// slices, strings, json.Number, bools, nil) are written directly; anything
// else goes through encoding/json.
func (r Resource) Marshal() ([]byte, error) {
	buf := make([]byte, 0, 512)
	buf = append(buf, '{')
	first := true
	var err error
	field := func(k string, v any) {
		if err != nil {
			return
		}
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = jsonx.AppendString(buf, k)
		buf = append(buf, ':')
		buf, err = appendValue(buf, v)
	}
	for _, k := range leadingFields {
		if v, ok := r[k]; ok {
			field(k, v)
		}
	}
	keys := make([]string, 0, len(r))
	for k := range r {
		if k != "resourceType" && k != "id" && k != "meta" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		field(k, r[k])
	}
	if err != nil {
		return nil, err
	}
	return append(buf, '}'), nil
}

func appendValue(buf []byte, v any) ([]byte, error) {
	switch t := v.(type) {
	case nil:
		return append(buf, "null"...), nil
	case string:
		return jsonx.AppendString(buf, t), nil
	case bool:
		if t {
			return append(buf, "true"...), nil
		}
		return append(buf, "false"...), nil
	case json.Number:
		if t == "" {
			return append(buf, '0'), nil
		}
		return append(buf, t...), nil
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf = append(buf, '{')
		for i, k := range keys {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = jsonx.AppendString(buf, k)
			buf = append(buf, ':')
			var err error
			if buf, err = appendValue(buf, t[k]); err != nil {
				return nil, err
			}
		}
		return append(buf, '}'), nil
	case []any:
		buf = append(buf, '[')
		for i, x := range t {
			if i > 0 {
				buf = append(buf, ',')
			}
			var err error
			if buf, err = appendValue(buf, x); err != nil {
				return nil, err
			}
		}
		return append(buf, ']'), nil
	default:
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return nil, err
		}
		return append(buf, bytes.TrimRight(b.Bytes(), "\n")...), nil
	}
}

// References returns every relative reference ("Type/id") found anywhere in
// the resource, excluding meta. Absolute URLs, fragments ("#x") and
// conditional references are not relative references and are skipped.
func (r Resource) References() []string {
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, x := range t {
				if k == "reference" {
					if s, ok := x.(string); ok {
						if typ, id, ok := SplitReference(s); ok && KnownType(typ) && ValidID(id) {
							out = append(out, s)
						}
					}
					continue
				}
				walk(x)
			}
		case []any:
			for _, x := range t {
				walk(x)
			}
		}
	}
	for k, v := range r {
		if k == "meta" {
			continue
		}
		walk(v)
	}
	return out
}

// SplitReference splits "Type/id" (no further slashes, no query).
func SplitReference(ref string) (typ, id string, ok bool) {
	typ, id, ok = strings.Cut(ref, "/")
	if !ok || typ == "" || id == "" || strings.ContainsAny(id, "/?#") {
		return "", "", false
	}
	return typ, id, true
}
