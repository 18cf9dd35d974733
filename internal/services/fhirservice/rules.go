package fhirservice

import (
	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
)

// Role is what a principal is to the rules: exactly one of SuperAdmin,
// ProjectAdmin and Member, plus Bot when a bot acts through its own
// membership (its in-process FHIR calls); or System, the server itself. A
// rule binds a principal when it names one of the principal's roles.
type Role uint8

// Roles.
const (
	SuperAdmin   Role = 1 << iota // a member of a super-admin project
	ProjectAdmin                  // an admin membership (not super admin)
	Member                        // any other membership
	Bot                           // a bot's own membership (with one of the above)
	// System is the server itself (principal.System): logins, set-password
	// links, and the Users and memberships of the admin use-cases, which
	// decide themselves whether their caller may act.
	System

	NotSuperAdmin = ProjectAdmin | Member | Bot
	// Callers are every principal but the server.
	Callers  = SuperAdmin | ProjectAdmin | Member | Bot
	Everyone = Callers | System
)

// RolesOf is the roles of a principal.
func RolesOf(p *principal.Principal) Role {
	if p.IsSystem() {
		return System
	}
	var r Role
	switch {
	case p.SuperAdmin:
		r = SuperAdmin
	case p.Admin:
		r = ProjectAdmin
	default:
		r = Member
	}
	if p.IsBot() {
		r |= Bot
	}
	return r
}

// Op is a set of interactions.
type Op uint8

// Interactions, as rules name them.
const (
	OpRead   Op = 1 << iota // read, vread, history and search
	OpCreate                // create
	OpUpdate                // update and patch
	OpDelete                // delete

	// Operations the server runs on a type (Operations says what each
	// needs besides its own rows).
	OpExecute // Bot/$execute (synchronous or asynchronous)
	OpDeploy  // Bot/$deploy

	OpWrite = OpCreate | OpUpdate | OpDelete
	OpAll   = OpRead | OpWrite
)

// Operation is a FHIR operation the server runs on a type: whom the rows of
// Rules refuse it, and the interactions it needs, which a caller must be
// allowed (by the rows and by its access policy) to run it.
type Operation struct {
	Type string
	Op   Op
	Name string
	// Needs are the interactions the operation performs.
	Needs []Need
}

// Need is an interaction on a type.
type Need struct {
	Type string
	Op   Op
}

// Operations is the table of operations. Who may run each is the rows of
// Rules that deny its Op, and then its Needs; the README's table is
// generated from both (TestDocumentedRules).
var Operations = []Operation{
	// Whoever can read a Bot may run it: the execution then acts as the
	// Bot's own membership, never as the caller.
	{Type: "Bot", Op: OpExecute, Name: "$execute", Needs: []Need{{"Bot", OpRead}}},
	// Deploying writes the code as a Binary and points the Bot at it.
	{Type: "Bot", Op: OpDeploy, Name: "$deploy", Needs: []Need{{"Bot", OpUpdate}, {"Binary", OpCreate}}},
}

// AuthorizeOperation decides whether p may run an operation of Operations
// on typ at all (the rows of Rules and the operation's Needs, as p's role
// and access policy allow them); which resource it may run it on is the
// caller's read or update of that resource.
func AuthorizeOperation(p *principal.Principal, typ string, op Op) error {
	for _, o := range Operations {
		if o.Type != typ || o.Op != op {
			continue
		}
		if p == nil {
			return fhir.ErrUnauthorized
		}
		if err := authorizeType(p, typ, op); err != nil {
			return err
		}
		for _, n := range o.Needs {
			if err := Authorize(p, n.Type, n.Op); err != nil {
				return err
			}
		}
		return nil
	}
	return fhir.Errorf(fhir.ENotFound, "Unknown operation")
}

// Access is what a field rule does to its field.
type Access uint8

// Field accesses, weakest first: where several rules bind one field, the
// strongest applies.
const (
	// Managed fields are the server's: what a client sends there is
	// replaced by the stored value (dropped on create, where the server
	// sets them). Nobody is refused for sending them: clients echo meta back.
	Managed Access = iota + 1
	// Fixed fields are set when the resource is created and never change:
	// a later write may leave one out (a full update) or send it again, and
	// the stored value stays; one that changes it is refused (400: the
	// resource cannot be otherwise, whoever asks). A reference is the same
	// when its reference is (its display is the stored one's).
	Fixed
	// ReadOnly fields are shown; a write that changes one is refused (403
	// naming it). A full update that leaves one out keeps the stored value.
	ReadOnly
	// Hidden fields are never shown (read, vread, history, search); a write
	// that sets one is refused (403 naming it) and one that leaves it out
	// keeps the stored value, since the client never saw it.
	Hidden
)

func (a Access) String() string {
	switch a {
	case Managed:
		return "server-managed"
	case Fixed:
		return "fixed"
	case ReadOnly:
		return "read-only"
	case Hidden:
		return "hidden"
	}
	return ""
}

// Rule is one row of the server's own authorization table: who may do what
// with a resource type (Field empty) or with one field of it. Rows only
// take away: what no row refuses is allowed, within the project wall and the
// caller's access policy.
type Rule struct {
	Type string
	// Field is a dotted path into the resource; empty for the resource as a
	// whole.
	Field string
	// Roles are the principals the row binds.
	Roles Role
	// Deny, for a whole-resource row, is the interactions refused with 403.
	Deny Op
	// Access, for a field row, is what happens to the field.
	Access Access
	// Message is the text of a whole-resource row's refusal ("Forbidden"
	// when empty); a field refusal names the field.
	Message string
}

// Rules is the table. Adding a restriction is adding a row; the README's
// "who may write what" is generated from it (TestDocumentedRules).
var Rules = []Rule{
	// The server's own types: super admins only.
	{Type: "Login", Roles: NotSuperAdmin, Deny: OpAll},
	{Type: "JsonWebKey", Roles: NotSuperAdmin, Deny: OpAll},
	{Type: "DomainConfiguration", Roles: NotSuperAdmin, Deny: OpAll},

	// Project administration types: nothing for plain members (an access
	// policy never grants them), limited for project admins
	// (docs/decisions.md 5).
	{Type: "AccessPolicy", Roles: Member, Deny: OpAll},
	{Type: "Project", Roles: Member, Deny: OpAll},
	{Type: "ProjectMembership", Roles: Member, Deny: OpAll},
	{Type: "User", Roles: Member, Deny: OpAll},
	{Type: "UserSecurityRequest", Roles: Member, Deny: OpAll},
	{Type: "PasswordChangeRequest", Roles: Member, Deny: OpAll},
	{Type: "Cron", Roles: Member, Deny: OpAll, Message: "Only project admins read and write Cron resources"},
	{Type: "Project", Roles: ProjectAdmin, Deny: OpCreate | OpDelete},
	{Type: "ProjectMembership", Roles: ProjectAdmin, Deny: OpWrite,
		Message: "Project admins change memberships through /admin/projects/{projectId}/members/{membershipId} and invite through /admin/projects/{projectId}/invite"},
	{Type: "User", Roles: ProjectAdmin, Deny: OpWrite, Message: "A User can only be changed by the user themself"},
	{Type: "UserSecurityRequest", Roles: ProjectAdmin, Deny: OpWrite},
	{Type: "PasswordChangeRequest", Roles: ProjectAdmin, Deny: OpWrite},

	// Asynchronous jobs are the server's to write; a job's submitter reads
	// (and cancels) it through its status endpoint (internal/services/jobs), which
	// admins may also use; through /fhir/R4 only admins read them.
	{Type: "AsyncJob", Roles: NotSuperAdmin, Deny: OpWrite, Message: "AsyncJobs are written by the server: cancel one with DELETE on its status URL"},
	{Type: "AsyncJob", Roles: Member | Bot, Deny: OpRead},

	// A project's own terminology (beside the read-only base definitions,
	// which nobody writes) is its admins' to write.
	{Type: "ValueSet", Roles: Member | Bot, Deny: OpWrite, Message: "Only project admins write the project's ValueSets"},
	{Type: "CodeSystem", Roles: Member | Bot, Deny: OpWrite, Message: "Only project admins write the project's CodeSystems"},

	// A bot changes neither its project, the policies, any membership (its
	// own included) nor any Bot's limits or code.
	{Type: "Project", Roles: Bot, Deny: OpWrite},
	{Type: "AccessPolicy", Roles: Bot, Deny: OpWrite},
	{Type: "ProjectMembership", Roles: Bot, Deny: OpWrite},
	{Type: "Cron", Roles: Bot, Deny: OpWrite, Message: "A bot cannot schedule bots"},
	{Type: "Bot", Field: "timeout", Roles: Bot, Access: ReadOnly},
	{Type: "Bot", Field: "executableCode", Roles: Bot, Access: ReadOnly},
	{Type: "Bot", Field: "runtimeVersion", Roles: Bot, Access: ReadOnly},
	{Type: "Bot", Roles: Bot, Deny: OpDeploy, Message: "A bot cannot deploy bots"},

	// An Agent says which Bot runs the messages of an HL7 feed (the
	// listener is the operator's, internal/services/hl7feed): the project's
	// admins wire it, not its members or bots.
	{Type: "Agent", Roles: Member | Bot, Deny: OpWrite, Message: "Agents (which Bot an HL7 feed runs) are written by the project's admins"},

	// What a project admin may not see or change of its Project.
	{Type: "Project", Field: "superAdmin", Roles: NotSuperAdmin, Access: Hidden},
	{Type: "Project", Field: "systemSecret", Roles: NotSuperAdmin, Access: Hidden},
	{Type: "Project", Field: "strictMode", Roles: NotSuperAdmin, Access: Hidden},
	{Type: "Project", Field: "features", Roles: NotSuperAdmin, Access: ReadOnly},
	{Type: "Project", Field: "link", Roles: NotSuperAdmin, Access: ReadOnly},
	{Type: "Project", Field: "systemSetting", Roles: NotSuperAdmin, Access: ReadOnly},

	// A membership stays with its project and user (docs/decisions.md 4),
	// whoever writes it (the admin API writes memberships as the server).
	{Type: "ProjectMembership", Field: "project", Roles: Everyone, Access: Fixed},
	{Type: "ProjectMembership", Field: "user", Roles: Everyone, Access: Fixed},

	// Users: credentials are no caller's to read (the server checks them);
	// identity fields are the user's own.
	{Type: "User", Field: "passwordHash", Roles: Callers, Access: Hidden},
	{Type: "User", Field: "mfaSecret", Roles: Callers, Access: Hidden},
	{Type: "User", Field: "email", Roles: NotSuperAdmin, Access: ReadOnly},
	{Type: "User", Field: "emailVerified", Roles: NotSuperAdmin, Access: ReadOnly},
	{Type: "User", Field: "mfaEnrolled", Roles: NotSuperAdmin, Access: ReadOnly},
	{Type: "User", Field: "project", Roles: NotSuperAdmin, Access: ReadOnly},

	// Secrets.
	{Type: "ClientApplication", Field: "secret", Roles: Member | Bot, Access: Hidden},
	{Type: "Login", Field: "code", Roles: Callers, Access: Hidden},
	{Type: "Login", Field: "codeChallenge", Roles: Callers, Access: Hidden},
	{Type: "Login", Field: "refreshSecret", Roles: Callers, Access: Hidden},
	{Type: "UserSecurityRequest", Field: "secret", Roles: Callers, Access: Hidden},
	{Type: "PasswordChangeRequest", Field: "secret", Roles: Callers, Access: Hidden},

	// What the server keeps for itself on every resource.
	{Type: "*", Field: "meta.versionId", Roles: Everyone, Access: Managed},
	{Type: "*", Field: "meta.lastUpdated", Roles: Everyone, Access: Managed},
	{Type: "*", Field: "meta.author", Roles: Everyone, Access: Managed},
	{Type: "*", Field: "meta.project", Roles: Everyone, Access: Managed},
	{Type: "*", Field: "meta.account", Roles: Everyone, Access: Managed},
	{Type: "*", Field: "meta.compartment", Roles: Everyone, Access: Managed},
	{Type: "Binary", Field: "url", Roles: Everyone, Access: Managed},
}

// fieldRule is a field restriction in force for one principal and type.
type fieldRule struct {
	path   string
	parts  []string
	access Access
}

// ruleSet is what the table says for one type and set of roles.
type ruleSet struct {
	deny    Op
	message map[Op]string
	fields  []fieldRule
	// hidden are the Hidden ones among fields.
	hidden []fieldRule
}

type ruleKey struct {
	typ   string
	roles Role
}

// ruleCache holds the compiled rule sets: the table never changes, and
// every request asks.
var ruleCache = func() map[ruleKey]*ruleSet {
	m := map[ruleKey]*ruleSet{}
	types := append(fhir.KnownTypeNames(), "*")
	for _, typ := range types {
		for roles := Role(1); roles <= Everyone; roles++ {
			if !validRoles(roles) {
				continue
			}
			m[ruleKey{typ, roles}] = compileRules(typ, roles)
		}
	}
	return m
}()

// validRoles: exactly one of SuperAdmin, ProjectAdmin, Member, maybe Bot;
// or System alone.
func validRoles(r Role) bool {
	base := r &^ Bot
	return base == SuperAdmin || base == ProjectAdmin || base == Member || r == System
}

func compileRules(typ string, roles Role) *ruleSet {
	rs := &ruleSet{message: map[Op]string{}}
	byPath := map[string]int{}
	for _, r := range Rules {
		if r.Roles&roles == 0 || (r.Type != typ && r.Type != "*") {
			continue
		}
		if r.Field == "" {
			rs.deny |= r.Deny
			for op := OpRead; op <= OpDeploy; op <<= 1 {
				if r.Deny&op != 0 && r.Message != "" {
					rs.message[op] = r.Message
				}
			}
			continue
		}
		if i, ok := byPath[r.Field]; ok {
			rs.fields[i].access = max(rs.fields[i].access, r.Access)
			continue
		}
		byPath[r.Field] = len(rs.fields)
		rs.fields = append(rs.fields, fieldRule{path: r.Field, parts: splitPath(r.Field), access: r.Access})
	}
	rs.hidden = hiddenOf(rs.fields)
	return rs
}

// rulesFor is the table's rules for a principal and type.
func rulesFor(p *principal.Principal, typ string) *ruleSet {
	if rs, ok := ruleCache[ruleKey{typ, RolesOf(p)}]; ok {
		return rs
	}
	return compileRules(typ, RolesOf(p))
}

// authorizeType applies the whole-resource rows to an interaction.
func authorizeType(p *principal.Principal, typ string, op Op) error {
	rs := rulesFor(p, typ)
	if rs.deny&op == 0 {
		return nil
	}
	if m := rs.message[op]; m != "" {
		return fhir.Errorf(fhir.EForbidden, "%s", m)
	}
	return fhir.ErrForbidden
}

// adminTypes are the project-administration types: the role rows decide
// them alone, never an access policy (a "*" entry does not grant them).
var adminTypes = map[string]bool{
	"AccessPolicy": true, "Project": true, "ProjectMembership": true, "User": true, "UserSecurityRequest": true, "PasswordChangeRequest": true,
	"Login": true, "JsonWebKey": true, "DomainConfiguration": true, "Cron": true,
}

// forbiddenField is the refusal of a write to a field.
func forbiddenField(typ, path string, a Access) error {
	if a == Fixed {
		return fhir.Invalid(typ+"."+path+" cannot change", typ+"."+path)
	}
	if a == Hidden {
		return fhir.Errorf(fhir.EForbidden, "Forbidden: %s.%s cannot be written", typ, path)
	}
	return fhir.Errorf(fhir.EForbidden, "Forbidden: %s.%s is read-only", typ, path)
}

// SuperAdminOnly reports whether the table keeps typ from everyone but super
// admins (the server's own types), which the capability statement leaves out.
func SuperAdminOnly(typ string) bool {
	rs, ok := ruleCache[ruleKey{typ, ProjectAdmin}]
	if !ok {
		rs = compileRules(typ, ProjectAdmin)
	}
	return rs.deny&OpAll == OpAll
}
