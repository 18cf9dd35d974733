package definitions

import (
	"sync"

	"github.com/sandbot/sandbot/fhir"
)

// This file answers the required bindings of strict validation
// (fhir.Terminology): whether a code is in a ValueSet of the definitions.

// boundCodes is a ValueSet's codes when the definitions expand it
// completely; complete is false otherwise (a terminology they do not hold,
// a compose filter the expansion cannot evaluate, a ValueSet they do not
// have), and then no code is refused.
type boundCodes struct {
	complete bool
	codes    map[Concept]bool // (system, code)
	bare     map[string]bool  // code, whatever its system
}

var boundSets sync.Map // url -> *boundCodes

// InValueSet implements fhir.Terminology for the definitions' ValueSets: in
// is whether (system, code) is among the ValueSet's codes (a code without
// a system, as a code element has, is matched by its code alone); known is
// false when the definitions cannot expand the ValueSet completely.
func (s *Set) InValueSet(url, system, code string) (in, known bool) {
	b := s.bound(url)
	if !b.complete {
		return false, false
	}
	if system == "" {
		return b.bare[code], true
	}
	return b.codes[Concept{System: system, Code: code}], true
}

func (s *Set) bound(url string) *boundCodes {
	if b, ok := boundSets.Load(url); ok {
		return b.(*boundCodes)
	}
	b := &boundCodes{}
	if r, ok := s.ByURL("ValueSet", url); ok {
		if res, err := decode(r.JSON); err == nil && s.complete(res, 0) {
			codes := s.expandCodes(res, 0, nil)
			if len(codes) > 0 && len(codes) < maxExpandCodes {
				b.complete = true
				b.codes, b.bare = make(map[Concept]bool, len(codes)), make(map[string]bool, len(codes))
				for _, c := range codes {
					b.codes[Concept{System: c.System, Code: c.Code}] = true
					b.bare[c.Code] = true
				}
			}
		}
	}
	v, _ := boundSets.LoadOrStore(url, b)
	return v.(*boundCodes)
}

// complete reports whether expandCodes gives every code of a ValueSet:
// each include lists its concepts, or names a CodeSystem of the
// definitions whose content is complete with only is-a and descendent-of
// filters, or names ValueSets that are complete themselves. Excludes may
// be anything: excluding too little only accepts more.
func (s *Set) complete(vs fhir.Resource, depth int) bool {
	if depth > maxExpandDepth {
		return false
	}
	if _, ok := vs["expansion"].(map[string]any); ok {
		return true
	}
	compose, _ := vs["compose"].(map[string]any)
	items, _ := compose["include"].([]any)
	if len(items) == 0 {
		return false
	}
	for _, it := range items {
		inc, _ := it.(map[string]any)
		system, _ := inc["system"].(string)
		vss, _ := inc["valueSet"].([]any)
		if system != "" && len(vss) > 0 {
			return false // an intersection expandCodes does not make
		}
		for _, v := range vss {
			url, _ := v.(string)
			r, ok := s.ByURL("ValueSet", url)
			if !ok {
				return false
			}
			res, err := decode(r.JSON)
			if err != nil || !s.complete(res, depth+1) {
				return false
			}
		}
		if system == "" {
			if len(vss) == 0 {
				return false
			}
			continue
		}
		if _, listed := inc["concept"].([]any); listed {
			continue
		}
		r, ok := s.ByURL("CodeSystem", system)
		if !ok {
			return false
		}
		cs, err := decode(r.JSON)
		if err != nil || cs["content"] != "complete" {
			return false
		}
		filters, _ := inc["filter"].([]any)
		for _, f := range filters {
			m, _ := f.(map[string]any)
			if op := m["op"]; op != "is-a" && op != "descendent-of" {
				return false
			}
		}
	}
	return true
}
