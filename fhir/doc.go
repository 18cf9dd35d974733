// Package fhir holds sandbot's domain: the FHIR resource envelope, the one error
// type every layer returns, OperationOutcome and Bundle shapes, the search
// parameter table (generated from the FHIR definitions into
// searchparams_gen.go), the FHIRPath subset its expressions are evaluated
// with, and the parsing of search requests and _filter expressions.
//
// It knows nothing of SQL or HTTP. The store indexes resources with the
// values Extract gives; the HTTP layer maps *Error to a status in one place
// (internal/handlers/httpx) and renders the outcomes built here.
package fhir
