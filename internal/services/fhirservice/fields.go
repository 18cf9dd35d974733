package fhirservice

import (
	"encoding/json"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/access"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// hiddenOf lists the hidden rules among rules.
func hiddenOf(rules []fieldRule) []fieldRule {
	var out []fieldRule
	for _, f := range rules {
		if f.access == Hidden {
			out = append(out, f)
		}
	}
	return out
}

// withPolicy adds an access-policy entry's fields to the table's rules.
func withPolicy(rules []fieldRule, e *access.FieldEntry) []fieldRule {
	if e == nil || len(e.HiddenFields)+len(e.ReadonlyFields) == 0 {
		return rules
	}
	out := append([]fieldRule(nil), rules...)
	for _, f := range e.HiddenFields {
		out = append(out, fieldRule{path: f, parts: splitPath(f), access: Hidden})
	}
	for _, f := range e.ReadonlyFields {
		out = append(out, fieldRule{path: f, parts: splitPath(f), access: ReadOnly})
	}
	return out
}

// hide removes the hidden fields of rules from res, in place.
func hide(res fhir.Resource, rules []fieldRule) {
	for _, f := range rules {
		if f.access == Hidden {
			removePath(res, f.parts)
		}
	}
}

// enforce applies field rules to a write of next, the new version of cur
// (nil on create). replace is set for a full update, where a field the client
// left out is kept; a patch (whose result already carries everything it did
// not touch) does not set it. next is changed in place: managed fields take
// the stored values, and hidden and kept read-only fields are restored.
func enforce(typ string, cur, next fhir.Resource, rules []fieldRule, replace bool) error {
	for _, f := range rules {
		switch f.access {
		case Managed:
			removePath(next, f.parts)
			if cur != nil {
				restorePath(cur, next, f.parts)
			}
		case Hidden:
			if hasPath(next, f.parts) {
				return forbiddenField(typ, f.path, Hidden)
			}
			if cur != nil {
				restorePath(cur, next, f.parts)
			}
		case Fixed:
			if cur == nil {
				continue
			}
			if replace && !hasPath(next, f.parts) {
				restorePath(cur, next, f.parts)
			}
			if !sameReferences(cur, next, f.parts) {
				return forbiddenField(typ, f.path, Fixed)
			}
			removePath(next, f.parts)
			restorePath(cur, next, f.parts)
		case ReadOnly:
			if cur == nil {
				if hasPath(next, f.parts) {
					return forbiddenField(typ, f.path, ReadOnly)
				}
				continue
			}
			if replace && !hasPath(next, f.parts) {
				restorePath(cur, next, f.parts)
			}
			if !samePath(cur, next, f.parts) {
				return forbiddenField(typ, f.path, ReadOnly)
			}
		}
	}
	return nil
}

// Present is the JSON of a stored record as p may see it under the table's
// rules (without an access policy's hidden fields, which the FHIR service
// adds for its own answers): for use-cases that answer with records they
// wrote themselves.
func Present(p *principal.Principal, rec *store.Record) (json.RawMessage, error) {
	return presentJSON(rec, rulesFor(p, rec.ResourceType).hidden)
}

// presentJSON is rec's JSON without the hidden fields of rules.
func presentJSON(rec *store.Record, rules []fieldRule) (json.RawMessage, error) {
	if len(rules) == 0 || rec.JSON == nil {
		return rec.JSON, nil
	}
	res, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	changed := false
	for _, f := range rules {
		if hasPath(res, f.parts) {
			removePath(res, f.parts)
			changed = true
		}
	}
	if !changed {
		return rec.JSON, nil
	}
	return res.Marshal()
}
