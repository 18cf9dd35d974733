package principal

import (
	"context"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/access"
	"github.com/sandbot/sandbot/store"
)

// loadPolicy compiles the access policies a membership names (accessPolicy
// and access[].policy with their parameters); nil when it names none. A
// policy that no longer exists grants nothing (never everything).
func loadPolicy(ctx context.Context, s store.Store, m fhir.Resource) (*access.Policy, error) {
	profile := m.Ref("profile")
	type ref struct {
		ref    string
		params map[string]string
	}
	var refs []ref
	if r := m.Ref("accessPolicy"); r != "" {
		refs = append(refs, ref{r, map[string]string{"profile": profile}})
	}
	list, _ := m["access"].([]any)
	for _, x := range list {
		a, _ := x.(map[string]any)
		if a == nil {
			continue
		}
		pol, _ := a["policy"].(map[string]any)
		r, _ := pol["reference"].(string)
		params := map[string]string{"profile": profile}
		ps, _ := a["parameter"].([]any)
		for _, y := range ps {
			pm, _ := y.(map[string]any)
			name, _ := pm["name"].(string)
			if name == "" {
				continue
			}
			if vr, ok := pm["valueReference"].(map[string]any); ok {
				params[name], _ = vr["reference"].(string)
			} else if vs, ok := pm["valueString"].(string); ok {
				params[name] = vs
			}
		}
		refs = append(refs, ref{r, params})
	}
	if len(refs) == 0 {
		return nil, nil
	}
	_, projectID, _ := fhir.SplitReference(m.Ref("project"))
	var bindings []access.Binding
	for _, r := range refs {
		typ, id, ok := fhir.SplitReference(r.ref)
		if !ok || typ != "AccessPolicy" {
			continue
		}
		rec, err := s.Read(ctx, store.ProjectScope(projectID), "AccessPolicy", id)
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			continue
		}
		if err != nil {
			return nil, err
		}
		pol, err := rec.Resource()
		if err != nil {
			return nil, err
		}
		bindings = append(bindings, access.Binding{Policy: pol, Params: r.params})
	}
	p, err := access.Compile(bindings)
	if err != nil {
		// A stored policy that does not compile grants nothing.
		return &access.Policy{}, nil
	}
	return p, nil
}
