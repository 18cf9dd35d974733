package fhir

import (
	"bytes"
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"time"
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

// TimeFormat is how instants are written (FHIR instant, millisecond precision, UTC).
const TimeFormat = "2006-01-02T15:04:05.000Z"

var idPattern = regexp.MustCompile(`^[A-Za-z0-9\-.]{1,64}$`)

// ValidID reports whether id is a syntactically valid FHIR logical id.
func ValidID(id string) bool { return idPattern.MatchString(id) }

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

// leadingFields are written first, in this order, as FHIR servers
// conventionally do; the other fields follow sorted by name.
var leadingFields = []string{"resourceType", "id", "meta"}

// Marshal encodes the resource.
func (r Resource) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	buf.WriteByte('{')
	first := true
	field := func(k string, v any) error {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
		if err := enc.Encode(v); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1) // Encode's newline
		return nil
	}
	for _, k := range leadingFields {
		if v, ok := r[k]; ok {
			if err := field(k, v); err != nil {
				return nil, err
			}
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
		if err := field(k, r[k]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
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
