package definitions

import (
	"strings"
	"sync"
	"time"

	"github.com/sandbot/sandbot/fhir"
)

// Expansion paging, as the reference's $expand has it.
const (
	DefaultExpandCount = 10
	MaxExpandCount     = 1000
	// maxExpandDepth bounds ValueSets including ValueSets; maxExpandCodes
	// the codes one expansion gathers before paging.
	maxExpandDepth = 8
	maxExpandCodes = 200_000
)

// Concept is one code of an expansion.
type Concept struct {
	System  string `json:"system,omitempty"`
	Code    string `json:"code"`
	Display string `json:"display,omitempty"`
}

// codeSystem is a CodeSystem's concepts flattened, with their parents.
type codeSystem struct {
	concepts []Concept
	parents  map[string][]string // code -> parent codes
}

var codeSystems sync.Map // url -> *codeSystem

func (s *Set) codeSystem(url string) *codeSystem {
	if cs, ok := codeSystems.Load(url); ok {
		return cs.(*codeSystem)
	}
	cs := &codeSystem{parents: map[string][]string{}}
	if r, ok := s.ByURL("CodeSystem", url); ok {
		if res, err := decode(r.JSON); err == nil {
			cs = flatten(url, res)
		}
	}
	v, _ := codeSystems.LoadOrStore(url, cs)
	return v.(*codeSystem)
}

// flatten is a CodeSystem's concepts, with their parents.
func flatten(url string, res fhir.Resource) *codeSystem {
	cs := &codeSystem{parents: map[string][]string{}}
	var walk func(list any, parent string)
	walk = func(list any, parent string) {
		items, _ := list.([]any)
		for _, it := range items {
			m, _ := it.(map[string]any)
			code, _ := m["code"].(string)
			if code == "" || len(cs.concepts) >= maxExpandCodes {
				continue
			}
			display, _ := m["display"].(string)
			cs.concepts = append(cs.concepts, Concept{System: url, Code: code, Display: display})
			if parent != "" {
				cs.parents[code] = append(cs.parents[code], parent)
			}
			walk(m["concept"], code)
		}
	}
	walk(res["concept"], "")
	return cs
}

// descends reports whether code is below ancestor in the hierarchy.
func (cs *codeSystem) descends(code, ancestor string, depth int) bool {
	if depth > 64 {
		return false
	}
	for _, p := range cs.parents[code] {
		if p == ancestor || cs.descends(p, ancestor, depth+1) {
			return true
		}
	}
	return false
}

// Expand answers ValueSet/$expand for the ValueSet with that url (or, with
// id set, that id): its codes, those whose code or display contains filter
// (case-insensitive), from offset, at most count. The codes come from the
// ValueSet's expansion when it has one, else from its compose: concepts
// listed, whole CodeSystems of the definitions, is-a and descendent-of
// filters, included ValueSets, less the excluded ones. Terminologies that
// are not in the definitions (SNOMED CT, LOINC, ...) expand to nothing.
func (s *Set) Expand(url, id, filter string, offset, count int) (fhir.Resource, error) {
	var vs *Resource
	var ok bool
	if id != "" {
		vs, ok = s.Read("ValueSet", id)
	} else {
		vs, ok = s.ByURL("ValueSet", url)
	}
	switch {
	case !ok && id != "":
		return nil, fhir.Errorf(fhir.ENotFound, "ValueSet not found: %s", id)
	case !ok:
		// An unknown url is a bad parameter, as the reference answers it
		// (400), not a missing resource.
		return nil, fhir.Invalid("ValueSet not found: "+url, "url")
	}
	res, err := decode(vs.JSON)
	if err != nil {
		return nil, err
	}
	return s.ExpandWith(res, filter, offset, count, nil), nil
}

// Local finds a project's own ValueSet or CodeSystem by url (nil when it
// has none), for the expansion of a project's ValueSet, which may name
// them beside the definitions'.
type Local func(resourceType, url string) fhir.Resource

// ExpandWith expands a ValueSet (the definitions' or a project's) as
// Expand does, looking up what it names in the definitions first, then
// through local (nil: the definitions only).
func (s *Set) ExpandWith(res fhir.Resource, filter string, offset, count int, local Local) fhir.Resource {
	all := s.expandCodes(res, 0, local)
	f := strings.ToLower(strings.TrimSpace(filter))
	var hits []any
	total := 0
	for _, c := range all {
		if f != "" && !strings.Contains(strings.ToLower(c.Display), f) && !strings.Contains(strings.ToLower(c.Code), f) {
			continue
		}
		if total >= offset && len(hits) < count {
			m := map[string]any{"system": c.System, "code": c.Code}
			if c.Display != "" {
				m["display"] = c.Display
			}
			hits = append(hits, m)
		}
		total++
	}
	out := fhir.Resource{"resourceType": "ValueSet", "id": res["id"], "url": res["url"], "status": res["status"],
		"expansion": map[string]any{
			"timestamp": time.Now().UTC().Format(fhir.TimeFormat),
			"total":     total,
			"offset":    offset,
			"contains":  hits,
		}}
	for _, k := range []string{"name", "title", "version"} {
		if v, ok := res[k]; ok {
			out[k] = v
		}
	}
	if hits == nil {
		out["expansion"].(map[string]any)["contains"] = []any{}
	}
	return out
}

func (s *Set) expandCodes(vs fhir.Resource, depth int, local Local) []Concept {
	if depth > maxExpandDepth {
		return nil
	}
	if exp, ok := vs["expansion"].(map[string]any); ok {
		var out []Concept
		var walk func(list any)
		walk = func(list any) {
			items, _ := list.([]any)
			for _, it := range items {
				m, _ := it.(map[string]any)
				if code, _ := m["code"].(string); code != "" && len(out) < maxExpandCodes {
					system, _ := m["system"].(string)
					display, _ := m["display"].(string)
					out = append(out, Concept{System: system, Code: code, Display: display})
				}
				walk(m["contains"])
			}
		}
		walk(exp["contains"])
		return out
	}
	compose, _ := vs["compose"].(map[string]any)
	included := s.composeCodes(compose["include"], depth, local)
	excluded := map[Concept]bool{}
	for _, c := range s.composeCodes(compose["exclude"], depth, local) {
		excluded[Concept{System: c.System, Code: c.Code}] = true
	}
	seen := map[Concept]bool{}
	var out []Concept
	for _, c := range included {
		key := Concept{System: c.System, Code: c.Code}
		if excluded[key] || seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, c)
	}
	return out
}

func (s *Set) composeCodes(list any, depth int, local Local) []Concept {
	items, _ := list.([]any)
	var out []Concept
	for _, it := range items {
		inc, _ := it.(map[string]any)
		system, _ := inc["system"].(string)
		if system == "" {
			vss, _ := inc["valueSet"].([]any)
			for _, v := range vss {
				url, _ := v.(string)
				if r, ok := s.ByURL("ValueSet", url); ok {
					if res, err := decode(r.JSON); err == nil {
						out = append(out, s.expandCodes(res, depth+1, local)...)
					}
				} else if local != nil {
					if res := local("ValueSet", url); res != nil {
						out = append(out, s.expandCodes(res, depth+1, local)...)
					}
				}
			}
			continue
		}
		cs := s.codeSystem(system)
		if len(cs.concepts) == 0 && local != nil {
			if res := local("CodeSystem", system); res != nil {
				cs = flatten(system, res)
			}
		}
		displays := map[string]string{}
		for _, c := range cs.concepts {
			displays[c.Code] = c.Display
		}
		if concepts, ok := inc["concept"].([]any); ok {
			for _, c := range concepts {
				m, _ := c.(map[string]any)
				code, _ := m["code"].(string)
				display, _ := m["display"].(string)
				if display == "" {
					display = displays[code]
				}
				if code != "" {
					out = append(out, Concept{System: system, Code: code, Display: display})
				}
			}
			continue
		}
		filters, _ := inc["filter"].([]any)
		for _, c := range cs.concepts {
			if len(out) >= maxExpandCodes {
				break
			}
			if matchesFilters(cs, c.Code, filters) {
				out = append(out, c)
			}
		}
	}
	return out
}

// matchesFilters applies a compose's filters: is-a and descendent-of on
// the concept hierarchy; any other filter matches nothing (the server
// cannot evaluate it, and listing too much would be wrong).
func matchesFilters(cs *codeSystem, code string, filters []any) bool {
	for _, f := range filters {
		m, _ := f.(map[string]any)
		op, _ := m["op"].(string)
		value, _ := m["value"].(string)
		switch op {
		case "is-a":
			if code != value && !cs.descends(code, value, 0) {
				return false
			}
		case "descendent-of":
			if !cs.descends(code, value, 0) {
				return false
			}
		default:
			return false
		}
	}
	return true
}
