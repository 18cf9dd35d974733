// Package admin holds the project-administration use-cases: bootstrapping
// the super-admin project, creating projects, clients and bots, inviting
// users, managing memberships and mailing set-password links. Its own rules
// (who may administer which project, what an invite or a membership change
// may do) are here; resources are written through the FHIR service
// (internal/services/fhirservice), whose Rules decide their fields: as the caller
// where the caller's own rights apply (a project, a client, a profile), and
// as the server acting for the caller (principal.System) for what only these
// use-cases may write once they have decided the caller may act: Users,
// memberships, set-password requests, a new project's contents. Its HTTP
// layer is internal/handlers/adminapi.
package admin
