package admin

import (
	"context"
	"net/mail"
	"regexp"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	smtpmail "github.com/sandbot/sandbot/internal/mail"
	"github.com/sandbot/sandbot/internal/password"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// InviteRequest is the body of POST /admin/projects/:id/invite.
type InviteRequest struct {
	ResourceType string
	FirstName    string
	LastName     string
	Email        string
	ExternalID   string
	Password     string
	Scope        string
	Patient      string // reference
	// SendEmail is false only when the caller said false (or "false").
	SendEmail          bool
	Upsert             bool
	ForceNewMembership bool
	// Template is the membership template: the top-level admin, accessPolicy,
	// access and externalId with the membership object spread over them.
	// The invitation sets the membership's project, user and profile over
	// it; the FHIR service's rules decide the rest (its id and meta are the
	// server's, and an existing membership's project and user are fixed).
	Template map[string]any
	// ProfileRef is membership.profile, when given.
	ProfileRef string
}

// ParseInvite validates an invite body. Every failed rule is one issue with
// its expression (the either-email-or-externalId rule has none).
func ParseInvite(body map[string]any) (*InviteRequest, error) {
	str := func(k string) string { s, _ := body[k].(string); return strings.TrimSpace(s) }
	truthy := func(k string) bool {
		switch v := body[k].(type) {
		case bool:
			return v
		case string:
			return v == "true"
		}
		return false
	}
	req := &InviteRequest{
		ResourceType: str("resourceType"), FirstName: str("firstName"), LastName: str("lastName"),
		Email: strings.ToLower(str("email")), ExternalID: str("externalId"), Scope: str("scope"),
		Upsert: truthy("upsert"), ForceNewMembership: truthy("forceNewMembership"), SendEmail: true,
	}
	req.Password, _ = body["password"].(string)
	switch v := body["sendEmail"].(type) {
	case bool:
		req.SendEmail = v
	case string:
		req.SendEmail = !strings.EqualFold(strings.TrimSpace(v), "false")
	}
	var issues []fhir.Issue
	add := func(text string, expr ...string) {
		issues = append(issues, fhir.Issue{Severity: "error", Code: "invalid", Details: &fhir.IssueDetails{Text: text}, Expression: expr})
	}
	switch req.ResourceType {
	case "Patient", "Practitioner", "RelatedPerson":
	default:
		add("Resource type is required", "resourceType")
	}
	if req.FirstName == "" {
		add("First name is required", "firstName")
	}
	if req.LastName == "" {
		add("Last name is required", "lastName")
	}
	if req.Email != "" {
		if a, err := mail.ParseAddress(req.Email); err != nil || a.Address != req.Email {
			if req.ExternalID == "" {
				add("Either email or externalId is required")
			}
			req.Email = ""
		}
	} else if req.ExternalID == "" {
		add("Either email or externalId is required")
	}
	if _, ok := body["password"]; ok {
		if err := password.Check(req.Password, "password"); err != nil {
			e := err.(*fhir.Error)
			add(e.Message, e.Expression...)
		}
	}
	switch req.Scope {
	case "", "project", "server":
	default:
		add("Scope must be project or server", "scope")
	}
	if pv, ok := body["patient"]; ok {
		pm, _ := pv.(map[string]any)
		pr, _ := pm["reference"].(string)
		if !patientRef.MatchString(pr) {
			add("Patient must be a reference to a Patient resource", "patient")
		}
		req.Patient = pr
	}
	tmpl := map[string]any{}
	for _, k := range []string{"externalId", "accessPolicy", "access", "admin"} {
		if v, ok := body[k]; ok && v != nil {
			tmpl[k] = v
		}
	}
	if mv, ok := body["membership"]; ok && mv != nil {
		m, ok := mv.(map[string]any)
		if !ok {
			add("membership must be an object", "membership")
		}
		for k, v := range m {
			if k == "profile" {
				// Which profile the membership is for, not a field to copy:
				// the invitation finds or makes it.
				pm, _ := v.(map[string]any)
				req.ProfileRef, _ = pm["reference"].(string)
				continue
			}
			tmpl[k] = v
		}
	}
	if v, ok := tmpl["admin"]; ok {
		if _, isBool := v.(bool); !isBool {
			add("admin must be a boolean", "admin")
		}
	}
	if v, ok := tmpl["access"]; ok {
		if _, isList := v.([]any); !isList {
			add("access must be an array", "access")
		}
	}
	req.Template = tmpl
	if len(issues) > 0 {
		return nil, &fhir.Error{Code: fhir.EInvalid, Message: issues[0].Details.Text, Expression: issues[0].Expression,
			Outcome: &fhir.OperationOutcome{ResourceType: "OperationOutcome", Issue: issues}}
	}
	return req, nil
}

var patientRef = regexp.MustCompile(`^Patient/[^/]+$`)

// ProjectScoped tells whether the invited User lives in the project.
func (r *InviteRequest) ProjectScoped() bool {
	return (r.ResourceType == "Patient" && r.Scope != "server") || r.ExternalID != "" || r.Scope == "project"
}

// policyRefs lists the AccessPolicy references of a membership template.
func policyRefs(m map[string]any) []string {
	var out []string
	if ap, ok := m["accessPolicy"].(map[string]any); ok {
		r, _ := ap["reference"].(string)
		out = append(out, r)
	}
	list, _ := m["access"].([]any)
	for _, x := range list {
		a, _ := x.(map[string]any)
		pol, _ := a["policy"].(map[string]any)
		r, _ := pol["reference"].(string)
		out = append(out, r)
	}
	return out
}

// Invite creates (or reuses) the User, creates (or reuses) the profile and
// creates the membership, all in one transaction, then sends the invitation.
// The answer is the membership; a mail failure does not change it. Once
// projectFor has decided that c may invite into pid, the User, its
// set-password request and the membership, which c's role may not write
// through /fhir/R4, are written through the FHIR service as the server
// acting for c (principal.System): the service's rules decide their fields
// (the membership's project and user are fixed, meta is the server's). The
// profile is c's own create.
func (s *Service) Invite(ctx context.Context, c Caller, pid string, req *InviteRequest) (*store.Record, error) {
	_, project, err := s.projectFor(ctx, c, pid)
	if err != nil {
		return nil, err
	}
	projectScoped := req.ProjectScoped()
	var passwordHash string
	if req.Password != "" {
		if passwordHash, err = password.Hash(req.Password); err != nil {
			return nil, err
		}
	}
	var (
		out        *store.Record
		newUser    bool
		userRef    string
		linkSecret string
		requestID  string
	)
	err = s.Store.InTx(ctx, func(tx store.Store) error {
		out, newUser, userRef, requestID, linkSecret = nil, false, "", "", ""
		svc := s.FHIR.WithStore(tx)
		var user fhir.Resource
		if req.Email != "" {
			// Concurrent invitations of one e-mail would each find no User
			// and each create one.
			if err := tx.Lock(ctx, "user-email:"+req.Email); err != nil {
				return err
			}
			users, err := svc.UsersByEmail(ctx, principal.System("", c.author()), req.Email)
			if err != nil {
				return err
			}
			for _, u := range users {
				up := u.Ref("project")
				sameScope := (projectScoped && up == "Project/"+pid) || (!projectScoped && up == "")
				if sameScope {
					if user == nil {
						user = u
					}
					continue
				}
				if req.ForceNewMembership || (up != "" && up != "Project/"+pid) {
					continue
				}
				// The same e-mail at the other scope, already in this project.
				ms, err := store.SearchResources(ctx, tx, store.ProjectScope(pid), "ProjectMembership", "user=User/"+u.ID()+"&_count=1")
				if err != nil {
					return err
				}
				if len(ms) > 0 {
					return fhir.Errorf(fhir.EConflict, "User is already a member of this project")
				}
			}
		}
		if user == nil {
			newUser = true
			user = fhir.Resource{"resourceType": "User", "firstName": req.FirstName, "lastName": req.LastName}
			if req.Email != "" {
				user["email"] = req.Email
			}
			if req.ExternalID != "" {
				user["externalId"] = req.ExternalID
			}
			if passwordHash != "" {
				user["passwordHash"] = passwordHash
			}
			home := s.SuperProjectID
			if projectScoped {
				user["project"] = refDisplay("Project/"+pid, project.String("name"))
				home = pid
			}
			rec, err := svc.Create(ctx, principal.System(home, c.author()), user)
			if err != nil {
				return err
			}
			user["id"] = rec.ID
			if req.Email != "" && req.SendEmail {
				linkSecret = password.NewSecret()
				usr := fhir.Resource{"resourceType": "UserSecurityRequest", "type": "invite",
					"user": ref("User/" + rec.ID), "secret": password.HashSecret(linkSecret), "used": false}
				urec, err := svc.Create(ctx, principal.System(home, system), usr)
				if err != nil {
					return err
				}
				requestID = urec.ID
			}
		}
		userRef = "User/" + user.ID()

		profile, err := s.inviteProfile(ctx, tx, c, pid, req)
		if err != nil {
			return err
		}
		profileRef := profile.Type() + "/" + profile.ID()

		if err := checkPolicies(ctx, tx, pid, policyRefs(req.Template)); err != nil {
			return err
		}
		tmpl := fhir.Resource{}
		for k, v := range req.Template {
			tmpl[k] = v
		}
		if c.User != "" {
			tmpl["invitedBy"] = ref(c.User)
		}
		if ext, _ := tmpl["externalId"].(string); ext != "" {
			dups, err := store.SearchResources(ctx, tx, store.ProjectScope(pid), "ProjectMembership", "external-id:exact="+esc(ext)+"&_count=2")
			if err != nil {
				return err
			}
			for _, d := range dups {
				if d.Ref("user") != userRef || req.ForceNewMembership || !req.Upsert {
					return fhir.Errorf(fhir.EConflict, "Membership with externalId %s already exists in this project", ext)
				}
			}
		}
		if s.BeforeMembershipWrite != nil {
			if err := s.BeforeMembershipWrite(); err != nil {
				return err
			}
		}
		if !req.ForceNewMembership {
			existing, err := store.SearchResources(ctx, tx, store.ProjectScope(pid), "ProjectMembership", "user="+userRef+"&_count=1")
			if err != nil {
				return err
			}
			if len(existing) > 0 {
				cur := existing[0]
				if !req.Upsert {
					return fhir.Errorf(fhir.EConflict, "User is already a member of this project")
				}
				if cur.Ref("profile") != profileRef {
					return fhir.Errorf(fhir.EConflict, "User is already a member of this project with a different profile")
				}
				out, err = svc.Modify(ctx, c.server(pid), "ProjectMembership", cur.ID(), func(m fhir.Resource) (fhir.Resource, error) {
					for k, v := range tmpl {
						m[k] = v
					}
					return m, nil
				})
				return err
			}
		}
		// The template, under what the invitation itself decides: whose
		// membership of which project, with which profile.
		m := tmpl
		for k, v := range NewMembership(pid, project.String("name"), userRef, profileRef, req.FirstName+" "+req.LastName, false) {
			m[k] = v
		}
		if d := req.Email; d != "" {
			m["user"] = refDisplay(userRef, d)
		}
		out, err = svc.Create(ctx, c.server(pid), m)
		return err
	})
	if err != nil {
		return nil, err
	}
	if req.Email != "" && req.SendEmail {
		s.sendInvite(ctx, req, project.String("name"), newUser, requestID, linkSecret)
	}
	return out, nil
}

// inviteProfile reads membership.profile, reuses the project's profile of
// that type with the e-mail, or creates one as c (in pid, the project c
// administers).
func (s *Service) inviteProfile(ctx context.Context, tx store.Store, c Caller, pid string, req *InviteRequest) (fhir.Resource, error) {
	if req.ProfileRef != "" {
		typ, id, ok := fhir.SplitReference(req.ProfileRef)
		if !ok {
			return nil, fhir.Invalid("Profile does not belong to project", "membership.profile")
		}
		rec, err := tx.Read(ctx, store.ProjectScope(pid), typ, id)
		if err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return nil, fhir.Invalid("Profile does not belong to project", "membership.profile")
			}
			return nil, err
		}
		if typ != req.ResourceType {
			return nil, fhir.Invalid("Profile resourceType does not match request", "membership.profile")
		}
		return rec.Resource()
	}
	if req.Email != "" {
		found, err := store.SearchResources(ctx, tx, store.ProjectScope(pid), req.ResourceType, "email="+esc(req.Email)+"&_count=1")
		if err != nil {
			return nil, err
		}
		if len(found) > 0 {
			return found[0], nil
		}
	}
	prof := fhir.Resource{"resourceType": req.ResourceType,
		"name": []any{map[string]any{"given": []any{req.FirstName}, "family": req.LastName}}}
	if req.Email != "" {
		prof["telecom"] = []any{map[string]any{"system": "email", "use": "work", "value": req.Email}}
	}
	if req.ResourceType == "RelatedPerson" {
		if req.Patient == "" {
			return nil, fhir.Invalid("Patient is required to create a RelatedPerson", "patient")
		}
		_, id, _ := fhir.SplitReference(req.Patient)
		prec, err := tx.Read(ctx, store.AllProjects, "Patient", id)
		if err != nil {
			if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
				return nil, fhir.Invalid("Patient "+req.Patient+" does not exist", "patient")
			}
			return nil, err
		}
		if prec.Project != pid {
			return nil, fhir.Invalid("Patient does not belong to project", "patient")
		}
		prof["patient"] = ref(req.Patient)
	}
	// meta.project names pid for a super admin (a project admin's creates
	// are in its own project, which pid is).
	prof["meta"] = map[string]any{"project": pid}
	rec, err := s.FHIR.WithStore(tx).Create(ctx, c.Principal, prof)
	if err != nil {
		return nil, err
	}
	prof["id"] = rec.ID
	return prof, nil
}

// sendInvite mails the invitation. Failures are logged (never the body or
// the link) and counted; the membership stays.
func (s *Service) sendInvite(ctx context.Context, req *InviteRequest, projectName string, newUser bool, requestID, secret string) {
	msg := smtpmail.Message{To: req.Email}
	if newUser && requestID != "" {
		msg.Subject = "Welcome to sandbot"
		msg.Link = s.setPasswordLink(requestID, secret)
		msg.Body = "Hello " + req.FirstName + ",\n\nYou were invited to the project " + projectName + ".\n" +
			"Set your password here:\n\n" + msg.Link + "\n\nThe link can be used once.\n"
	} else {
		msg.Subject = "sandbot: Welcome to " + projectName
		msg.Body = "Hello " + req.FirstName + ",\n\nYou were added to the project " + projectName + ".\n" +
			"Sign in with your existing account at " + s.BaseURL + "\n"
	}
	// The membership exists now: a client hanging up must not cancel its mail.
	s.deliver(ctx, msg, "invitation e-mail could not be sent; the membership was kept")
}
