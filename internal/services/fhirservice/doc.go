// Package fhirservice is the FHIR API for a principal: every read and write
// of a resource on behalf of a caller goes through it, whoever the caller is
// (the /fhir/R4 handlers, the admin use-cases, a bot's in-process calls, and
// Bundle entries). It sits between the handlers and the store and knows
// nothing of HTTP. It owns, in one place:
//
//   - the project wall: a principal sees its project only (store scopes;
//     super admins see all), and another project's resources do not exist
//     for it (404);
//   - the role rules and the server's field rules, as data: the table Rules
//     (whole-resource rows refuse interactions to roles, field rows make a
//     field Hidden, ReadOnly, Fixed or Managed for roles; README "Who may
//     write what" is generated from it);
//   - access-policy enforcement (internal/access): types, criteria on
//     reads, searches and writes, and each entry's hiddenFields and
//     readonlyFields.
//
// # Typed API
//
// Each method takes a context and a *principal.Principal and returns records
// as the principal may see them (hidden fields removed); errors are
// *fhir.Error (their code is the status) or internal errors.
//
//	Authorize(p, typ, op) error                         // type-level decision, before anything is read
//	(*Service).Read(ctx, p, typ, id) (*store.Record, error)
//	(*Service).VRead(ctx, p, typ, id, vid) (*store.Record, error)
//	(*Service).History(ctx, p, typ, id, count, offset) ([]store.Record, error)
//	(*Service).Search(ctx, p, *fhir.SearchRequest) (*store.SearchResult, error)
//	(*Service).Create(ctx, p, fhir.Resource) (*store.Record, error)
//	(*Service).CreateBot(ctx, p, fhir.Resource, accessPolicy) (*store.Record, error) // the admin API's bot route
//	(*Service).Update(ctx, p, typ, id, fhir.Resource, ifMatch) (*store.Record, error)
//	(*Service).Patch(ctx, p, typ, id, jsonpatch.Patch, ifMatch) (*store.Record, error)
//	(*Service).Modify(ctx, p, typ, id, fn) (*store.Record, error) // read-modify-write under Patch's rules
//	(*Service).Delete(ctx, p, typ, id, ifMatch) error
//	(*Service).CreateIfNoneExist(ctx, p, fhir.Resource, query) (*store.Record, created bool, error)
//	(*Service).UpdateWhere(ctx, p, typ, query, fhir.Resource, ifMatch) (*store.Record, created bool, error)
//	(*Service).PatchWhere(ctx, p, typ, query, jsonpatch.Patch, ifMatch) (*store.Record, error)
//	(*Service).DeleteWhere(ctx, p, typ, query, ifMatch) error  // conditional.go: 0/1/several matches
//	(*Service).Load / LoadForUpdate(ctx, p, typ, id)    // authorized stored record, for use-cases only
//	(*Service).UsersByEmail(ctx, p, email) ([]fhir.Resource, error) // whole address, case aside
//
// Writes: the server chooses ids (a Project's id is its own meta.project; a
// Binary gets url "Binary/<id>"); meta is the server's; a super admin may
// create into another project by naming it in meta.project. An update keeps
// what the principal may not see and refuses what it may not change (403
// naming the field, whatever the method); a patch runs on the resource as the
// principal sees it, so that a hidden field can be neither tested, copied nor
// moved. Deleting a ClientApplication, a Bot or a User deletes its
// memberships in the same transaction: its tokens and secret stop working at
// once (caches learn of it through the store's change feed). Creating a Bot
// creates its own membership in the same transaction, whatever the path
// (CreateBot names its access policy; docs/decisions.md 32).
//
// Use-cases that decide themselves whether their caller may act (the admin
// API's invitations and memberships, logins) write through the same methods
// as the server, principal.System (the role System of Rules), and answer
// their caller through Present. UsersByEmail is the one lookup of accounts
// by e-mail.
//
// # Dispatcher
//
// Do is the one router of the REST interactions, for every caller that has a
// request rather than a typed call:
//
//	(*Service).Do(ctx, p, *Request) *Response
//
// A Request is {Method, URL, Body, ContentType, IfMatch, IfNoneExist, Accept}, with URL
// relative to the FHIR base ("Patient?name=x", "Patient/1",
// "Patient/1/_history/2", "Patient/_search"); the Response is {Status, Body
// (FHIR JSON, or a Binary's raw content), ContentType, ETag, LastModified,
// Location, Err, Outcome}. Do never fails: an error is an answer whose Body is
// its OperationOutcome and whose Err keeps the error. It routes read, vread,
// search (GET, and POST _search with a form body), history, create (a non-JSON
// POST to Binary stores it raw), update, patch (application/json-patch+json)
// and delete, and their conditional forms (If-None-Exist on a create; PUT,
// PATCH and DELETE on "Type?query"); operations ($execute, $deploy, …) are not routed, so a bot's
// call cannot start a bot. The types served from the FHIR definitions
// (fhir/definitions: StructureDefinition, SearchParameter, ValueSet,
// CodeSystem) are answered from them, read-only, for every caller. Bodies are
// bounded as BodyLimit says.
//
// # Transactions
//
// A Service bound to a store transaction runs every call in it:
//
//	svc.InTx(ctx, func(tx *fhirservice.Service) error { … tx.Do(…) … })
//
// so that a transaction Bundle's entries are kept together or not at all
// (return an error to roll back; a refused entry's Response has Err set).
// WithStore(tx) binds the service to a transaction a use-case opened itself.
package fhirservice
