// fhir-patient reads and creates Patients through the server's FHIR API
// (the sandbot.fhir import), acting as the bot's own project membership.
//
//	POST application/fhir+json, a Patient   -> creates it, answers it with status 201
//	POST application/json {"id": "123"}     -> reads Patient/123 (404 if absent)
//	POST application/json {"family": "X"}   -> searches Patients by family name
//
// Build (a reactor module): GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o fhir-patient.wasm .
package main

import (
	"errors"
	"net/url"

	"github.com/sandbot/sandbot/sdk"
)

func main() {}

func init() {
	sdk.Handle(patient)
}

func patient(ctx sdk.Context, e sdk.Event) (any, error) {
	fhir := ctx.FHIR()
	if e.ContentType == sdk.FHIRJSON {
		r, err := e.Resource()
		if err != nil {
			return nil, err
		}
		if r.ResourceType() != "Patient" {
			return nil, sdk.Errorf(400, "expected a Patient, got %s", r.ResourceType())
		}
		created, err := fhir.Create(r)
		if err != nil {
			return nil, err
		}
		sdk.Logf("created Patient/%s", created.ID())
		return sdk.Response{Status: 201, Body: created}, nil
	}
	var in struct {
		ID     string `json:"id"`
		Family string `json:"family"`
	}
	if err := e.JSON(&in); err != nil {
		return nil, err
	}
	switch {
	case in.ID != "":
		p, err := fhir.Read("Patient", in.ID)
		var fe *sdk.FHIRError
		if errors.As(err, &fe) && fe.Status == 404 {
			return nil, sdk.Errorf(404, "Patient %s not found", in.ID)
		}
		return p, err
	case in.Family != "":
		found, err := fhir.Search("Patient", url.Values{"family": {in.Family}}.Encode())
		if err != nil {
			return nil, err
		}
		sdk.Logf("%d patients named %s", len(found), in.Family)
		return found, nil
	}
	return nil, sdk.Errorf(400, "expected a Patient resource, {\"id\": ...} or {\"family\": ...}")
}
