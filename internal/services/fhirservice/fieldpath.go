package fhirservice

import (
	"reflect"
	"strings"
)

// A field path is a dotted path into a resource ("secret", "meta.author",
// "name.family"). Arrays on the way are looked through: "name.family" is the
// family of every name.

func splitPath(path string) []string { return strings.Split(path, ".") }

// removePath deletes every value at path.
func removePath(doc map[string]any, parts []string) {
	if len(parts) == 1 {
		delete(doc, parts[0])
		return
	}
	eachObject(doc[parts[0]], func(m map[string]any) { removePath(m, parts[1:]) })
}

// hasPath reports whether any value is present at path.
func hasPath(doc map[string]any, parts []string) bool {
	if len(parts) == 1 {
		_, ok := doc[parts[0]]
		return ok
	}
	found := false
	eachObject(doc[parts[0]], func(m map[string]any) { found = found || hasPath(m, parts[1:]) })
	return found
}

// valuesAt lists the values at path, in document order.
func valuesAt(doc map[string]any, parts []string) []any {
	if len(parts) == 1 {
		if v, ok := doc[parts[0]]; ok {
			return []any{v}
		}
		return nil
	}
	var out []any
	eachObject(doc[parts[0]], func(m map[string]any) { out = append(out, valuesAt(m, parts[1:])...) })
	return out
}

// samePath reports whether a and b hold the same values at path.
func samePath(a, b map[string]any, parts []string) bool {
	return reflect.DeepEqual(valuesAt(a, parts), valuesAt(b, parts))
}

// sameReferences is samePath where a Reference (an object with a
// reference) counts as its reference alone: a display is not part of what
// it points at.
func sameReferences(a, b map[string]any, parts []string) bool {
	key := func(vs []any) []any {
		for i, v := range vs {
			if m, ok := v.(map[string]any); ok {
				if r, ok := m["reference"].(string); ok {
					vs[i] = r
				}
			}
		}
		return vs
	}
	return reflect.DeepEqual(key(valuesAt(a, parts)), key(valuesAt(b, parts)))
}

// restorePath copies into next the values at path that cur has and next
// lacks. Objects are paired by key and arrays element by element; where next
// has no counterpart (a shorter array, a missing object) nothing is copied.
func restorePath(cur, next map[string]any, parts []string) {
	cv, ok := cur[parts[0]]
	if !ok {
		return
	}
	if len(parts) == 1 {
		if _, has := next[parts[0]]; !has {
			next[parts[0]] = cv
		}
		return
	}
	nv, ok := next[parts[0]]
	if !ok {
		return
	}
	switch c := cv.(type) {
	case map[string]any:
		if n, ok := nv.(map[string]any); ok {
			restorePath(c, n, parts[1:])
		}
	case []any:
		n, ok := nv.([]any)
		if !ok {
			return
		}
		for i := 0; i < len(c) && i < len(n); i++ {
			cm, ok1 := c[i].(map[string]any)
			nm, ok2 := n[i].(map[string]any)
			if ok1 && ok2 {
				restorePath(cm, nm, parts[1:])
			}
		}
	}
}

// eachObject calls fn with v when it is an object, or with each object of v
// when it is an array.
func eachObject(v any, fn func(map[string]any)) {
	switch t := v.(type) {
	case map[string]any:
		fn(t)
	case []any:
		for _, x := range t {
			if m, ok := x.(map[string]any); ok {
				fn(m)
			}
		}
	}
}
