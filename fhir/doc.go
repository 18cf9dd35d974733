// Package fhir holds sandbot's domain: the FHIR resource envelope, the one error
// type every layer returns, OperationOutcome and Bundle shapes, the search
// parameter table and the parsing of search requests.
//
// It knows nothing of SQL or HTTP. The store indexes resources with the
// extractors declared here; the HTTP layer maps *Error to a status in one place
// (internal/httpx) and renders the outcomes built here.
package fhir
