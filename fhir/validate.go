package fhir

import (
	"encoding/json"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

//go:generate go run ./internal/genvalidate -o validate_gen.go

// structure is one row of the generated table (validate_gen.go): a
// resource type, a complex data type or a backbone element.
type structure struct {
	// Resource is set for resource types (a valid resourceType).
	Resource bool
	// Required are the elements of min 1; a choice group as "value[x]".
	Required []string
	// Elements by JSON name, choice elements expanded (valueString, ...).
	Elements map[string]element
}

// element is one element of a structure.
type element struct {
	// Type is a primitive type, a structure name or "Resource" (any
	// resource, by its resourceType).
	Type string
	// Array is set when max is above 1: the JSON value is an array.
	Array bool
	// Choice is the group name of a choice element ("value").
	Choice string
	// Binding is the ValueSet url of a required binding of a code, Coding
	// or CodeableConcept element (checked in strict mode, ValidateStrict).
	Binding string
	// Targets are the resource types a Reference element may point to
	// (none: any resource).
	Targets []string
}

// primitiveElement is the structure of a primitive's _ sibling (Element is
// abstract, so not in the table).
var elementBase = map[string]element{"id": {Type: "string"}, "extension": {Type: "Extension", Array: true},
	"modifierExtension": {Type: "Extension", Array: true}}

var primitiveElement = &structure{Elements: map[string]element{"id": {Type: "string"}, "extension": {Type: "Extension", Array: true}}}

// maxValidationIssues bounds the issues one validation reports: a huge
// malformed body does not build a huge answer.
const maxValidationIssues = 100

// maxValidationDepth bounds nesting (contained resources, recursive
// backbones): deeper values are refused, never walked.
const maxValidationDepth = 64

// Validate checks a decoded resource against the FHIR R4 (and reference
// platform) StructureDefinitions: its resourceType, unknown elements, the
// JSON shape of every element (object, array, primitive), primitive types
// and formats, cardinality (required elements, one value where max is 1),
// choice types (one type per choice), contained resources recursively,
// primitive extensions (_birthDate) and extensions, and the type a relative
// Reference ("Type/id") names. ValidateStrict adds required bindings and
// meta.profile. It returns one issue
// per error, each naming the element in expression (Patient.name[0].given),
// none when the resource is valid.
func Validate(res Resource) []Issue {
	return validate(res, nil)
}

// Terminology tells whether a code is in a ValueSet, for the required
// bindings strict validation checks. known is false when it cannot tell (a
// ValueSet it cannot expand completely, such as one of SNOMED CT codes):
// the code is then accepted.
type Terminology interface {
	InValueSet(valueSet, system, code string) (in, known bool)
}

// ValidateStrict is Validate and, besides, the checks of a project in
// strictMode: every code, Coding and CodeableConcept of an element with a
// required binding is in its ValueSet (when terms knows it; a
// CodeableConcept needs one of its codings in it, one with only a text is
// not checked), and every meta.profile is a profile the server has: the
// definition of the resource's own type, the only ones among the embedded
// definitions (a profile it does not have could not be checked).
func ValidateStrict(res Resource, terms Terminology) []Issue {
	return validate(res, terms)
}

// CheckValidStrict is ValidateStrict as an error.
func CheckValidStrict(res Resource, terms Terminology) error {
	if issues := ValidateStrict(res, terms); len(issues) > 0 {
		return ValidationError(issues)
	}
	return nil
}

func validate(res Resource, terms Terminology) []Issue {
	v := validator{path: make([]byte, 0, 64), terms: terms}
	v.resource(map[string]any(res), 0)
	if len(v.issues) > 1 {
		// Elements are walked in map order: the answer is in a stable one.
		sort.SliceStable(v.issues, func(i, j int) bool { return v.issues[i].Expression[0] < v.issues[j].Expression[0] })
	}
	return v.issues
}

// ValidationError is the error of a resource that fails Validate: a 400
// whose OperationOutcome has one issue per error.
func ValidationError(issues []Issue) *Error {
	return &Error{Code: EInvalid, Message: issues[0].Details.Text, Expression: issues[0].Expression,
		Outcome: &OperationOutcome{ResourceType: "OperationOutcome", Issue: issues}}
}

// CheckValid is Validate as an error (nil when the resource is valid).
func CheckValid(res Resource) error {
	if issues := Validate(res); len(issues) > 0 {
		return ValidationError(issues)
	}
	return nil
}

type validator struct {
	issues []Issue
	// terms is set in strict mode: bindings and profiles are checked.
	terms Terminology
	// path is the expression of the value being checked; it only becomes
	// a string when an issue is reported.
	path []byte
}

func (v *validator) fail(code, text string) {
	if len(v.issues) >= maxValidationIssues {
		return
	}
	v.issues = append(v.issues, Issue{Severity: "error", Code: code, Details: &IssueDetails{Text: text}, Expression: []string{string(v.path)}})
}

// resource checks a resource at v.path ("" at the root).
func (v *validator) resource(obj map[string]any, depth int) {
	rt, ok := obj["resourceType"].(string)
	if !ok {
		if len(v.path) == 0 {
			v.path = append(v.path, "resourceType"...)
		} else {
			v.path = append(v.path, ".resourceType"...)
		}
		v.fail("structure", "Missing resourceType")
		return
	}
	st := structures[rt]
	if st == nil || !st.Resource {
		mark := len(v.path)
		if mark == 0 {
			v.path = append(v.path, "resourceType"...)
		} else {
			v.path = append(v.path, ".resourceType"...)
		}
		v.fail("structure", "Unknown resource type: "+rt)
		v.path = v.path[:mark]
		return
	}
	if len(v.path) == 0 {
		v.path = append(v.path, rt...)
	}
	v.object(st, obj, depth)
	if v.terms != nil {
		v.profiles(rt, obj)
	}
}

// object checks the elements of a structure's value at v.path.
func (v *validator) object(st *structure, obj map[string]any, depth int) {
	if depth > maxValidationDepth {
		v.fail("structure", "Too deeply nested")
		return
	}
	mark := len(v.path)
	var choices []string // choice groups seen
	for k, val := range obj {
		v.path = append(append(v.path[:mark], '.'), k...)
		if k == "resourceType" && st.Resource {
			continue
		}
		name, ext := k, false
		if len(k) > 1 && k[0] == '_' {
			name, ext = k[1:], true
		}
		el, ok := st.Elements[name]
		if !ok && !st.Resource {
			// Every element has an id and extensions, and a backbone
			// element modifier extensions: some of the reference's own
			// definitions (Agent.channel) leave them out of their
			// snapshots.
			el, ok = elementBase[name]
		}
		if !ok {
			v.fail("structure", `Invalid additional property "`+k+`"`)
			continue
		}
		if el.Choice != "" && !ext {
			for _, c := range choices {
				if c == el.Choice {
					v.fail("structure", "Only one of the "+el.Choice+"[x] types may be given")
				}
			}
			choices = append(choices, el.Choice)
		}
		if ext {
			v.primitiveExtension(el, val, obj[name], depth)
			continue
		}
		if el.Array {
			arr, ok := val.([]any)
			if !ok {
				v.fail("structure", "Expected an array of "+el.Type+", got "+jsonKind(val))
				continue
			}
			if len(arr) == 0 {
				v.fail("structure", "An array must not be empty")
				continue
			}
			_, hasExt := obj["_"+name]
			at := len(v.path)
			for i, item := range arr {
				v.path = append(append(append(v.path[:at], '['), strconv.Itoa(i)...), ']')
				if item == nil && hasExt && primitiveTypes[el.Type] {
					continue // the value is in _name[i]
				}
				v.checked(el, item, depth)
			}
			continue
		}
		if _, isArray := val.([]any); isArray {
			v.fail("structure", "Expected a single "+el.Type+", got an array")
			continue
		}
		v.checked(el, val, depth)
	}
	v.path = v.path[:mark]
	for _, r := range st.Required {
		if strings.HasSuffix(r, "[x]") {
			group := r[:len(r)-3]
			found := false
			for k := range obj {
				if e, ok := st.Elements[k]; ok && e.Choice == group {
					found = true
					break
				}
			}
			if !found {
				v.path = append(append(v.path, '.'), r...)
				v.fail("required", "Missing required property")
				v.path = v.path[:mark]
			}
			continue
		}
		if _, ok := obj[r]; ok {
			continue
		}
		if _, ok := obj["_"+r]; ok {
			continue
		}
		v.path = append(append(v.path, '.'), r...)
		v.fail("required", "Missing required property")
		v.path = v.path[:mark]
	}
}

// primitiveExtension checks _name: an Element (id, extension) beside a
// primitive, or an array of them (null where there is none) beside an
// array of primitives.
func (v *validator) primitiveExtension(el element, val, value any, depth int) {
	if !primitiveTypes[el.Type] {
		v.fail("structure", "Only primitive elements have a _ sibling")
		return
	}
	elem := primitiveElement
	if el.Array {
		arr, ok := val.([]any)
		if !ok {
			v.fail("structure", "Expected an array of Element, got "+jsonKind(val))
			return
		}
		if vals, ok := value.([]any); ok && len(vals) != len(arr) {
			v.fail("structure", "The _ array must have as many items as its primitive array")
		}
		at := len(v.path)
		for i, item := range arr {
			if item == nil {
				continue
			}
			v.path = append(append(append(v.path[:at], '['), strconv.Itoa(i)...), ']')
			obj, ok := item.(map[string]any)
			if !ok {
				v.fail("structure", "Expected an Element, got "+jsonKind(item))
				continue
			}
			v.object(elem, obj, depth+1)
		}
		return
	}
	obj, ok := val.(map[string]any)
	if !ok {
		v.fail("structure", "Expected an Element, got "+jsonKind(val))
		return
	}
	v.object(elem, obj, depth+1)
}

// checked checks one value of an element, then, when it is well formed,
// the type a Reference points to and, in strict mode, the element's
// required binding.
func (v *validator) checked(el element, val any, depth int) {
	n := len(v.issues)
	v.value(el.Type, val, depth)
	if len(v.issues) != n {
		return
	}
	if len(el.Targets) > 0 {
		v.referenceTarget(el, val)
	}
	if el.Binding != "" && v.terms != nil {
		v.binding(el, val)
	}
}

// referenceTarget checks that a relative reference ("Type/id", possibly
// versioned) names a type the element allows. Absolute URLs, contained
// (#id) and Bundle-local (urn:uuid:) references are not checked.
func (v *validator) referenceTarget(el element, val any) {
	ref, _ := val.(map[string]any)["reference"].(string)
	if base, version, ok := strings.Cut(ref, "/_history/"); ok && version != "" {
		ref = base
	}
	typ, _, ok := SplitReference(ref)
	if !ok || strings.Contains(typ, ":") || !KnownType(typ) {
		return
	}
	for _, t := range el.Targets {
		if t == typ {
			return
		}
	}
	mark := len(v.path)
	v.path = append(v.path, ".reference"...)
	v.fail("value", "Invalid reference type "+typ+": expected "+strings.Join(el.Targets, ", "))
	v.path = v.path[:mark]
}

// binding checks a coded value against its element's required ValueSet.
func (v *validator) binding(el element, val any) {
	in := func(system, code string) (bool, bool) {
		if slices.Contains(serverCodes[el.Binding], code) {
			return true, true
		}
		return v.terms.InValueSet(el.Binding, system, code)
	}
	var shown string
	switch el.Type {
	case "code":
		code, _ := val.(string)
		if ok, known := in("", code); ok || !known {
			return
		}
		shown = code
	case "Coding":
		m := val.(map[string]any)
		code, _ := m["code"].(string)
		system, _ := m["system"].(string)
		if code == "" {
			return
		}
		if ok, known := in(system, code); ok || !known {
			return
		}
		shown = system + "|" + code
	case "CodeableConcept":
		codings, _ := val.(map[string]any)["coding"].([]any)
		var tried []string
		for _, c := range codings {
			m, _ := c.(map[string]any)
			code, _ := m["code"].(string)
			system, _ := m["system"].(string)
			if code == "" {
				continue
			}
			if ok, known := in(system, code); ok || !known {
				return
			}
			tried = append(tried, system+"|"+code)
		}
		if len(tried) == 0 {
			return
		}
		shown = strings.Join(tried, ", ")
	}
	if len(shown) > 100 {
		shown = shown[:100] + "..."
	}
	v.fail("code-invalid", "Value "+strconv.Quote(shown)+" is not in the required value set "+el.Binding)
}

// serverCodes are the codes sandbot adds to a ValueSet of a required
// binding: its WebAssembly bots' runtimeVersion beside the reference's
// vmcontext and awslambda (the bot service checks which it runs).
var serverCodes = map[string][]string{
	"https://medplum.com/fhir/ValueSet/bot-runtime-version": {"wasm"},
}

// profiles checks, in strict mode, that each meta.profile of a resource of
// type rt is a profile the server has (profileTypes).
func (v *validator) profiles(rt string, obj map[string]any) {
	meta, _ := obj["meta"].(map[string]any)
	list, _ := meta["profile"].([]any)
	mark := len(v.path)
	for i, p := range list {
		url, _ := p.(string)
		if is := ProfileIssue(rt, url); is != nil {
			v.path = append(append(append(v.path[:mark], ".meta.profile["...), strconv.Itoa(i)...), ']')
			v.fail(is.Code, is.Details.Text)
		}
	}
	v.path = v.path[:mark]
}

// ProfileIssue is the error of a profile (a canonical url, possibly with
// "|version") claimed by a resource of type rt in strict mode: nil when it
// is the definition of rt, the only profiles the server has.
func ProfileIssue(rt, url string) *Issue {
	url, _, _ = strings.Cut(url, "|")
	t, ok := profileTypes[url]
	switch {
	case ok && t == rt:
		return nil
	case ok:
		return &Issue{Severity: "error", Code: "invalid", Details: &IssueDetails{Text: "Profile " + url + " is a profile of " + t + ", not " + rt}}
	}
	return &Issue{Severity: "error", Code: "not-supported",
		Details: &IssueDetails{Text: "Unknown profile " + url + ": in strict mode a profile must be one the server has (the definition of " + rt + ")"}}
}

// value checks one value of a type at v.path.
func (v *validator) value(typ string, val any, depth int) {
	if primitiveTypes[typ] {
		if msg := checkPrimitive(typ, val); msg != "" {
			v.fail("value", msg)
		}
		return
	}
	obj, ok := val.(map[string]any)
	if !ok {
		v.fail("structure", "Expected "+typ+" (an object), got "+jsonKind(val))
		return
	}
	if typ == "Resource" {
		v.resource(obj, depth+1)
		return
	}
	st := structures[typ]
	if st == nil {
		return // a type the definitions do not describe
	}
	v.object(st, obj, depth+1)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64, int, int64:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "an unknown value"
}

// checkPrimitive checks a primitive value's JSON type and format; it
// returns what is wrong, "" when nothing is.
func checkPrimitive(typ string, val any) string {
	switch typ {
	case "boolean":
		if _, ok := val.(bool); !ok {
			return "Invalid boolean: expected true or false, got " + jsonKind(val)
		}
		return ""
	case "integer", "positiveInt", "unsignedInt":
		n, ok := integerValue(val)
		if !ok {
			return "Invalid " + typ + ": expected an integer, got " + jsonKind(val)
		}
		if n < math.MinInt32 || n > math.MaxInt32 || typ == "positiveInt" && n < 1 || typ == "unsignedInt" && n < 0 {
			return "Invalid " + typ + ": out of range"
		}
		return ""
	case "decimal":
		switch n := val.(type) {
		case json.Number:
			if _, err := strconv.ParseFloat(string(n), 64); err != nil {
				return "Invalid decimal"
			}
			return ""
		case float64, int, int64:
			return ""
		}
		return "Invalid decimal: expected a number, got " + jsonKind(val)
	}
	s, ok := val.(string)
	if !ok {
		return "Invalid " + typ + ": expected a string, got " + jsonKind(val)
	}
	if s == "" && (typ == "string" || typ == "markdown") {
		// An empty string is what the reference's own clients send for a
		// field left blank (the CLI's Bot.description); it accepts it.
		return ""
	}
	if strings.TrimSpace(s) == "" {
		return "Invalid " + typ + ": empty"
	}
	ok = true
	switch typ {
	case "code":
		ok = validCode(s)
	case "id":
		ok = ValidID(s)
	case "uri", "url", "canonical":
		ok = !strings.ContainsAny(s, " \t\r\n")
	case "oid":
		ok = oidPattern.MatchString(s)
	case "uuid":
		ok = uuidPattern.MatchString(s)
	case "base64Binary":
		ok = validBase64(s)
	case "date":
		ok = validDate(s)
	case "dateTime":
		ok = validDateTime(s, false)
	case "instant":
		ok = validDateTime(s, true)
	case "time":
		ok = validTime(s)
	}
	if !ok {
		return "Invalid " + typ + " format"
	}
	return ""
}

var (
	oidPattern  = regexp.MustCompile(`^urn:oid:[0-2](\.(0|[1-9][0-9]*))+$`)
	uuidPattern = regexp.MustCompile(`^urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

func integerValue(val any) (int64, bool) {
	switch n := val.(type) {
	case json.Number:
		i, err := strconv.ParseInt(string(n), 10, 64)
		return i, err == nil
	case float64:
		return int64(n), n == math.Trunc(n) && math.Abs(n) < 1<<53
	case int:
		return int64(n), true
	case int64:
		return n, true
	}
	return 0, false
}

// validCode: [^\s]+( [^\s]+)*
func validCode(s string) bool {
	prevSpace := true
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ':
			if prevSpace {
				return false
			}
			prevSpace = true
		case '\t', '\r', '\n':
			return false
		default:
			prevSpace = false
		}
	}
	return !prevSpace
}

func validBase64(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '=' || c == ' ' || c == '\r' || c == '\n' || c == '\t') {
			return false
		}
	}
	return true
}

func digits(s string, n int) (int, bool) {
	if len(s) < n {
		return 0, false
	}
	v := 0
	for i := 0; i < n; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

// dateLen is how much of s is a FHIR date (YYYY, YYYY-MM or YYYY-MM-DD),
// -1 when it does not start with one.
func dateLen(s string) int {
	if _, ok := digits(s, 4); !ok {
		return -1
	}
	if len(s) == 4 || s[4] != '-' {
		return 4
	}
	m, ok := digits(s[5:], 2)
	if !ok || m < 1 || m > 12 {
		return -1
	}
	if len(s) == 7 || s[7] != '-' {
		return 7
	}
	d, ok := digits(s[8:], 2)
	if !ok || d < 1 || d > 31 {
		return -1
	}
	return 10
}

func validDate(s string) bool { return dateLen(s) == len(s) }

// timeLen is how much of s is hh:mm:ss(.fraction), -1 when not.
func timeLen(s string) int {
	h, ok1 := digits(s, 2)
	if !ok1 || h > 23 || len(s) < 8 || s[2] != ':' || s[5] != ':' {
		return -1
	}
	m, ok2 := digits(s[3:], 2)
	sec, ok3 := digits(s[6:], 2)
	if !ok2 || !ok3 || m > 59 || sec > 60 {
		return -1
	}
	n := 8
	if n < len(s) && s[n] == '.' {
		n++
		start := n
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			n++
		}
		if n == start {
			return -1
		}
	}
	return n
}

func validTime(s string) bool { return timeLen(s) == len(s) }

// validDateTime: a date, or a full date with a time and (for an instant,
// always) a time zone (Z or ±hh:mm).
func validDateTime(s string, instant bool) bool {
	n := dateLen(s)
	if n < 0 {
		return false
	}
	if n == len(s) {
		return !instant
	}
	if n != 10 || s[n] != 'T' {
		return false
	}
	rest := s[n+1:]
	t := timeLen(rest)
	if t < 0 {
		return false
	}
	zone := rest[t:]
	switch {
	case zone == "":
		return !instant
	case zone == "Z":
		return true
	case len(zone) == 6 && (zone[0] == '+' || zone[0] == '-') && zone[3] == ':':
		h, ok1 := digits(zone[1:], 2)
		m, ok2 := digits(zone[4:], 2)
		return ok1 && ok2 && h <= 14 && m <= 59
	}
	return false
}
