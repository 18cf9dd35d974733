package fhirservice

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/fhir/definitions"
	"github.com/sandbot/sandbot/internal/principal"
)

// ValidateRequest is a $validate: POST [type]/$validate or
// [type]/[id]/$validate.
type ValidateRequest struct {
	Type string
	// ID is set for the instance level.
	ID string
	// Body is the resource, or a Parameters with a resource parameter (and
	// mode, profile); empty at the instance level to validate the stored
	// resource.
	Body []byte
	// Mode and Profile are the query's (a Parameters body's win).
	Mode, Profile string
}

// Validate answers $validate: the checks every write runs (fhir.Validate,
// and fhir.ValidateStrict's in a project in strictMode: validation), as an
// OperationOutcome, nothing written. A valid resource answers "All
// OK"; an invalid one one issue per error. mode "create" (the default at
// the type level) and "update" (the default at the instance level, where
// the body's id must be the path's) check the body; "delete" only checks
// that the resource exists and p may see it. The profile parameter
// (query or Parameters) is checked as a meta.profile in strictMode, and
// ignored otherwise (decision 51).
func (s *Service) Validate(ctx context.Context, p *principal.Principal, req ValidateRequest) (*fhir.OperationOutcome, error) {
	if err := Authorize(p, req.Type, OpRead); err != nil {
		return nil, err
	}
	if !fhir.KnownType(req.Type) {
		return nil, fhir.Invalid("Unknown resource type: "+req.Type, "resourceType")
	}
	mode, profile := req.Mode, req.Profile
	var res fhir.Resource
	if len(strings.TrimSpace(string(req.Body))) > 0 {
		var err error
		res, mode, profile, err = validateBody(req.Body, mode, profile)
		if err != nil {
			return nil, err
		}
	}
	switch mode {
	case "":
		mode = "create"
		if req.ID != "" {
			mode = "update"
		}
	case "create", "update", "delete":
	default:
		return nil, fhir.Invalid("Invalid mode: "+mode, "mode")
	}
	if req.ID != "" && (mode == "delete" || res == nil) {
		rec, err := s.Read(ctx, p, req.Type, req.ID)
		if err != nil {
			return nil, err
		}
		if mode == "delete" {
			return fhir.AllOK(), nil
		}
		if res, err = rec.Resource(); err != nil {
			return nil, err
		}
	}
	if res == nil {
		return nil, fhir.Invalid("Missing resource")
	}
	if mode == "delete" {
		return nil, fhir.Invalid("mode delete needs an instance", "mode")
	}
	var issues []fhir.Issue
	if res.Type() != req.Type {
		issues = append(issues, fhir.Issue{Severity: "error", Code: "invalid",
			Details:    &fhir.IssueDetails{Text: "Incorrect resource type: expected " + req.Type + ", but found " + res.Type()},
			Expression: []string{"resourceType"}})
	}
	if mode == "update" && req.ID != "" && res.ID() != req.ID {
		issues = append(issues, fhir.Issue{Severity: "error", Code: "invalid",
			Details: &fhir.IssueDetails{Text: "Incorrect resource ID"}, Expression: []string{res.Type() + ".id"}})
	}
	more, err := validation(p, res)
	if err != nil {
		return nil, err
	}
	issues = append(issues, more...)
	if profile != "" && strict(p) {
		// The nominated profile, as a meta.profile would be (decision 51).
		if is := fhir.ProfileIssue(res.Type(), profile); is != nil {
			is.Expression = []string{"profile"}
			issues = append(issues, *is)
		}
	}
	if len(issues) == 0 {
		return fhir.AllOK(), nil
	}
	return &fhir.OperationOutcome{ResourceType: "OperationOutcome", Issue: issues}, nil
}

// validateBody reads a $validate body: a Parameters with resource (and
// mode), or the resource itself.
func validateBody(body []byte, mode, profile string) (fhir.Resource, string, string, error) {
	res, err := fhir.ParseResource(body)
	if err != nil {
		return nil, "", "", err
	}
	if res.Type() != "Parameters" {
		return res, mode, profile, nil
	}
	params, _ := res["parameter"].([]any)
	var inner fhir.Resource
	for _, v := range params {
		prm, _ := v.(map[string]any)
		switch prm["name"] {
		case "resource":
			r, ok := prm["resource"].(map[string]any)
			if !ok {
				return nil, "", "", fhir.Invalid("The resource parameter must hold a resource", "Parameters.parameter.resource")
			}
			raw, err := json.Marshal(r)
			if err != nil {
				return nil, "", "", fhir.Invalid("Invalid resource parameter")
			}
			if inner, err = fhir.ParseResource(raw); err != nil {
				return nil, "", "", err
			}
		case "mode":
			if m, ok := prm["valueCode"].(string); ok {
				mode = m
			}
		case "profile":
			for _, k := range []string{"valueCanonical", "valueUri"} {
				if u, ok := prm[k].(string); ok {
					profile = u
				}
			}
		}
	}
	if inner == nil {
		// A Parameters resource validated as itself.
		return res, mode, profile, nil
	}
	return inner, mode, profile, nil
}

// strict reports whether the caller's project is in strictMode: its writes
// are checked against required bindings and meta.profile too (decision 51).
// The server's own principals (no project resource) are not.
func strict(p *principal.Principal) bool {
	on, _ := p.Project["strictMode"].(bool)
	return on
}

// validation is the check of every write (decision 44), with the strict
// checks in a project in strictMode; $validate answers the same.
func validation(p *principal.Principal, res fhir.Resource) ([]fhir.Issue, error) {
	if !strict(p) {
		return fhir.Validate(res), nil
	}
	set, err := definitions.Load()
	if err != nil {
		return nil, err
	}
	return fhir.ValidateStrict(res, set), nil
}

// checkValid is validation as the error of a write.
func checkValid(p *principal.Principal, res fhir.Resource) error {
	issues, err := validation(p, res)
	if err != nil {
		return err
	}
	if len(issues) > 0 {
		return fhir.ValidationError(issues)
	}
	return nil
}
