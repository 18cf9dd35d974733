// Package store defines sandbot's storage contract: versioned FHIR resources
// walled into projects, their search index, a small key-value space for
// server secrets, the change feed that tells every process (replica) on the
// database what changed, and counters they share. The one implementation
// lives in store/sqlstore (PostgreSQL and SQLite), which also holds River's
// tables and driver for the background jobs (internal/services/jobs);
// store/storetest is the conformance suite every backend passes.
package store

import (
	"context"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/outage"
)

// Record is one stored version of a resource (fhir.Record: the domain's
// type, so that packages above the services need not import the store).
type Record = fhir.Record

// Scope is the set of projects an operation may see. A resource outside it
// does not exist for the caller (fhir.ENotFound), never fhir.EForbidden.
type Scope struct {
	// All lets the operation see every project (super admins, the system).
	All bool
	// Projects the operation may see when All is false.
	Projects []string
}

// AllProjects is the scope of the server itself.
var AllProjects = Scope{All: true}

// ProjectScope is the scope of a caller in one project.
func ProjectScope(project string) Scope { return Scope{Projects: []string{project}} }

// Allows reports whether a project is within the scope.
func (s Scope) Allows(project string) bool {
	if s.All {
		return true
	}
	for _, p := range s.Projects {
		if p == project {
			return true
		}
	}
	return false
}

// Write says who writes and where.
type Write struct {
	// Project receives a created resource (ignored on update: a resource never
	// changes project).
	Project string
	// Author becomes meta.author.
	Author fhir.Reference
	// ID, when set on create, is used instead of a new UUID.
	ID string
	// IfMatch, when set on update or delete, must equal the current versionId
	// (fhir.EPrecondition otherwise).
	IfMatch string
	// CheckReferences makes the write fail with fhir.EInvalid when a relative
	// reference does not resolve to a live resource of the same project. Every
	// write on behalf of a caller sets it: it is what keeps projects apart.
	CheckReferences bool
}

// UpdateFunc receives the current resource (a copy) and returns the new one.
// Returning an error aborts the update with that error.
type UpdateFunc func(current fhir.Resource) (fhir.Resource, error)

// SearchResult is one page of a search.
type SearchResult struct {
	Records []Record
	// More is true when another page exists.
	More bool
	// Total is set when the request asked for it.
	Total *int
}

// Store is the storage contract.
type Store interface {
	// Create stores a new resource with a new id (or w.ID) in w.Project.
	Create(ctx context.Context, res fhir.Resource, w Write) (*Record, error)
	// CreateMany creates many resources in w.Project in one transaction,
	// with as few statements as the database allows: for high-volume writes
	// such as execution audit events. A resource without an id gets a new
	// one; one with an id keeps it (its caller made it unique: fhir.EConflict
	// when it is not).
	CreateMany(ctx context.Context, resources []fhir.Resource, w Write) error
	// Read returns the current version: fhir.ENotFound when absent or outside
	// the scope, fhir.EGone (with the deletion Record) when deleted.
	Read(ctx context.Context, scope Scope, resourceType, id string) (*Record, error)
	// ReadCached is Read for what every bot execution reads (its Bot and
	// Project): on PostgreSQL it may answer from this process's copy,
	// which another process's change reaches moments after its commit
	// (at once for this process's own). It is for callers whose writers
	// wait until every live process has seen their change (the bots
	// service, docs/decisions.md 58); elsewhere it is Read.
	ReadCached(ctx context.Context, scope Scope, resourceType, id string) (*Record, error)
	// ReadVersion returns one version from history.
	ReadVersion(ctx context.Context, scope Scope, resourceType, id, versionID string) (*Record, error)
	// Update is a read-modify-write in one transaction: fn sees the current
	// resource and returns the next one. id, resourceType and meta are the
	// store's to keep.
	Update(ctx context.Context, scope Scope, resourceType, id string, w Write, fn UpdateFunc) (*Record, error)
	// Delete marks the resource deleted, keeping its history. Deleting a
	// deleted resource succeeds.
	Delete(ctx context.Context, scope Scope, resourceType, id string, w Write) error
	// History lists the versions of a resource, newest first.
	History(ctx context.Context, scope Scope, resourceType, id string, count, offset int) ([]Record, error)
	// Search runs a search within the scope.
	Search(ctx context.Context, scope Scope, req *fhir.SearchRequest) (*SearchResult, error)
	// InTx runs fn in one transaction: either everything fn wrote is kept or
	// nothing is. The Store passed to fn must be used for every operation of
	// the transaction.
	InTx(ctx context.Context, fn func(tx Store) error) error
	// Lock, inside InTx, holds a lock on each key until the transaction
	// ends, so that transactions taking the same key run one after the other
	// (two invitations of one new e-mail must not both create its User).
	// Several keys are taken in sorted order, with one round trip.
	Lock(ctx context.Context, keys ...string) error
	// KeyValue returns the value stored under name, storing the value made by
	// create when there is none yet. Concurrent callers (replicas) all get the
	// value that won.
	KeyValue(ctx context.Context, name string, create func() (string, error)) (string, error)
	// Subscribe calls fn with the changes (ChangeTypes) that any process on
	// the database commits, until stop is called: those of this process as
	// soon as they commit, before the writing call returns, and those of
	// other processes moments later. A change may come more than once, and
	// a Change with an empty ResourceType means that changes may have been
	// missed (drop everything). fn must be quick: it runs on the goroutine
	// that delivers the changes.
	Subscribe(fn func([]Change)) (stop func())
	// CountHit counts a hit on key and returns the hits of its current
	// window, and when that window ends. A window lasts window and begins at
	// the first hit after the previous one ended. Every process on the
	// database shares the counters (the auth rate limit holds across
	// replicas).
	CountHit(ctx context.Context, key string, window time.Duration) (hits int64, ends time.Time, err error)
	// CountHitValue is CountHit that also returns the value kept with the
	// key's current window: "" in a window that begins with this hit, else
	// what SetHitValue last kept in it.
	CountHitValue(ctx context.Context, key string, window time.Duration) (hits int64, ends time.Time, value string, err error)
	// SetHitValue keeps value with key's current window if the value kept
	// there is still old, and reports whether it did. A window that has
	// ended (or was never begun) is not written, so a writer whose window
	// ended, or was forgotten and began again, cannot write into the next
	// one. The value goes with its window when ended windows are deleted.
	SetHitValue(ctx context.Context, key, old, value string) (bool, error)
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
	// Close releases the store.
	Close() error
}

// Change is a committed update or deletion of a resource of one of the
// ChangeTypes, as Subscribe delivers it.
type Change struct {
	// Seq orders the changes of one database (commit order).
	Seq          int64
	ResourceType string
	ID           string
	Project      string
	// Local: committed by this process, delivered on the writing goroutine
	// right after the commit, before the write returns (the same change
	// comes again later, not Local, from the changes table).
	Local bool
}

// Written is one write of a transaction, as a write hook sees it before the
// transaction commits (sqlstore.Store.SetWriteHook): what was written, and
// what it replaced.
type Written struct {
	// Interaction is "create", "update" or "delete".
	Interaction string
	// Record is the version written (for a delete: the deletion, without
	// JSON).
	Record Record
	// Previous is the JSON of the version replaced (nil on create).
	Previous []byte
	// Resource and Values are the version written, decoded, and its search
	// index values, as the store indexed them; nil on delete. A hook that
	// matches writes against searches needs not decode and extract again.
	Resource fhir.Resource
	Values   []fhir.IndexValue
}

// ChangeTypes are the resource types whose updates and deletions every
// process on the database hears about (Store.Subscribe), because servers keep
// what they derive from them: principals from logins, memberships, access
// policies, projects (with their secrets) and clients; bots' compiled code.
// A resource of another type changes without a word. Creations are never
// announced: nothing can have been derived from a resource before it existed.
var ChangeTypes = map[string]bool{
	"Login":             true,
	"ProjectMembership": true,
	"AccessPolicy":      true,
	"Project":           true,
	"ClientApplication": true,
	"Bot":               true,
}

// CachedTypes are the ChangeTypes whose rows ReadCached may serve from a
// process's copy: what every bot execution reads besides its input (its
// Bot, and its Project for the settings and secrets).
var CachedTypes = map[string]bool{"Bot": true, "Project": true}

// IsUnavailable reports whether err says that the database could not be
// reached or went away, or aborted this transaction to break a deadlock: the
// request may succeed if retried later, so it is a 503, not a 500
// (outage.Is, where the classification lives).
func IsUnavailable(err error) bool { return outage.Is(err) }

// SearchResources runs a search given as a query string ("name=x&_count=5")
// and decodes what it finds: for use-cases that look resources up.
func SearchResources(ctx context.Context, s Store, scope Scope, resourceType, query string) ([]fhir.Resource, error) {
	req, err := fhir.ParseSearch(resourceType, query)
	if err != nil {
		return nil, err
	}
	res, err := s.Search(ctx, scope, req)
	if err != nil {
		return nil, err
	}
	out := make([]fhir.Resource, 0, len(res.Records))
	for i := range res.Records {
		r, err := res.Records[i].Resource()
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// ModuleArtifact is a bot module's compiled machine code, kept for every
// replica (runtime.Artifact; docs/decisions.md 41).
type ModuleArtifact struct {
	ModuleHash string
	Platform   string
	Name       string
	Code       []byte
	Prepared   []byte
	MAC        string
}

// ModuleArtifacts is implemented by stores that keep compiled bot modules
// for every process on the database (sqlstore).
type ModuleArtifacts interface {
	// ModuleArtifact returns the artifact of moduleHash for platform, or
	// nil when there is none.
	ModuleArtifact(ctx context.Context, moduleHash, platform string) (*ModuleArtifact, error)
	// PutModuleArtifact keeps a unless one of the same module and platform
	// is kept already.
	PutModuleArtifact(ctx context.Context, a *ModuleArtifact) error
}

// Replicas is implemented by stores that several processes may share
// (sqlstore): it tells which replicas are running and which deployed
// modules each holds ready, so that a deploy can answer once the others can
// run the new module without compiling or loading it (docs/decisions.md 56).
type Replicas interface {
	// ReplicaAlive records that replica was running at at, and forgets
	// the replicas (and their modules) not seen since forgetBefore.
	ReplicaAlive(ctx context.Context, replica string, at, forgetBefore time.Time) error
	// ReplicaGone forgets replica and its modules (a clean shutdown).
	ReplicaGone(ctx context.Context, replica string) error
	// LiveReplicas are the replicas seen at or after since.
	LiveReplicas(ctx context.Context, since time.Time) ([]string, error)
	// ModuleReady records that replica holds the module of moduleHash.
	ModuleReady(ctx context.Context, replica, moduleHash string, at time.Time) error
	// ModuleReadyOn are the replicas that hold the module of moduleHash.
	ModuleReadyOn(ctx context.Context, moduleHash string) ([]string, error)
	// ReplicaSawChanges records that replica has delivered the changes up
	// to seq (Change.Seq) to its caches; a lower seq than recorded before
	// changes nothing.
	ReplicaSawChanges(ctx context.Context, replica string, seq int64) error
	// ReplicasBehind are the replicas seen at or after since, other than
	// except, that have not recorded seeing the change seq.
	ReplicasBehind(ctx context.Context, except string, seq int64, since time.Time) ([]string, error)
}
