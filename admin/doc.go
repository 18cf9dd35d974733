// Package admin holds the project-administration use-cases: bootstrapping
// the super-admin project, creating projects, clients and bots, inviting
// users and managing memberships. Its own rules (who may administer which
// project, what an invite or a membership change may do) are here; resources
// are read and written through the FHIR service (internal/fhirservice), or,
// for memberships, which only these use-cases write, under its field rules
// (ApplyFieldRules). Its HTTP layer is admin/adminhttp.
package admin
