// Package mediatype reads Content-Type values, for the HTTP layer (httpx)
// and for the FHIR service's dispatcher alike, which takes content types as
// strings without HTTP.
package mediatype

import (
	"mime"
	"strings"
)

// FHIRJSON is the content type of FHIR JSON answers.
const FHIRJSON = "application/fhir+json; charset=utf-8"

// Of is a Content-Type value's media type, without parameters, lower-cased
// ("" for none).
func Of(contentType string) string {
	if contentType == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(strings.Split(contentType, ";")[0]))
	}
	return mt
}

// IsJSON reports whether a media type is JSON: application/json or any
// application/*+json.
func IsJSON(mt string) bool {
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
