package auth

import (
	"context"
	"net/url"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// GET /auth/me: the caller's project, membership and profile, and what the
// web app builds its pages from: the user configuration (the sidebar menu)
// and, for users, the security page's sessions. Shapes as the reference's
// auth/me.

// Me is the answer of GET /auth/me for p.
func (a *Authenticator) Me(ctx context.Context, p *principal.Principal) (map[string]any, error) {
	typ, id, _ := fhir.SplitReference(p.Profile)
	profile, err := a.store.Read(ctx, store.AllProjects, typ, id)
	if err != nil {
		return nil, err
	}
	prof, err := profile.Resource()
	if err != nil {
		return nil, err
	}
	delete(prof, "secret")
	project := map[string]any{"resourceType": "Project", "id": p.ProjectID, "name": p.Project["name"],
		"strictMode": p.Project["strictMode"], "superAdmin": p.SuperAdmin}
	if d, ok := p.Project["description"]; ok {
		project["description"] = d
	}
	membership := map[string]any{"resourceType": "ProjectMembership", "id": p.MembershipID(),
		"user": p.Membership["user"], "profile": p.Membership["profile"], "admin": p.Admin}
	config, err := a.userConfiguration(ctx, p)
	if err != nil {
		return nil, err
	}
	me := map[string]any{
		"project":    project,
		"membership": membership,
		"profile":    prof,
		"config":     config,
	}
	sec, err := a.security(ctx, p)
	if err != nil {
		return nil, err
	}
	if sec != nil {
		me["security"] = sec
	}
	return me, nil
}

// sessionWindow is how far back a login counts as a session on the security
// page (the reference lists the logins updated within the last hour).
const sessionWindow = time.Hour

// favoriteTypes are the resource types of the default menu's Favorites.
var favoriteTypes = []string{"Patient", "Practitioner", "Organization", "ServiceRequest", "DiagnosticReport", "Questionnaire"}

// userConfiguration is the membership's UserConfiguration when it names one,
// else the default menu: Favorites, Admin for project administrators, Super
// Admin for the super-admin project.
func (a *Authenticator) userConfiguration(ctx context.Context, p *principal.Principal) (fhir.Resource, error) {
	if typ, id, ok := fhir.SplitReference(p.Membership.Ref("userConfiguration")); ok && typ == "UserConfiguration" {
		rec, err := a.store.Read(ctx, store.AllProjects, typ, id)
		if err == nil {
			return rec.Resource()
		}
		if !fhir.IsCode(err, fhir.ENotFound) && !fhir.IsCode(err, fhir.EGone) {
			return nil, err
		}
	}
	links := func(pairs ...string) []any {
		out := make([]any, 0, len(pairs)/2)
		for i := 0; i+1 < len(pairs); i += 2 {
			out = append(out, map[string]any{"name": pairs[i], "target": pairs[i+1]})
		}
		return out
	}
	var fav []string
	for _, t := range favoriteTypes {
		fav = append(fav, t, "/"+t)
	}
	menu := []any{map[string]any{"title": "Favorites", "link": links(fav...)}}
	if p.Admin {
		admin := []string{"Project", "/admin/project", "AccessPolicy", "/AccessPolicy", "Subscriptions", "/Subscription", "Batch", "/batch"}
		if !p.SuperAdmin {
			admin = append(admin, "Config", "/admin/config")
		}
		menu = append(menu, map[string]any{"title": "Admin", "link": links(admin...)})
	}
	if p.SuperAdmin {
		menu = append(menu, map[string]any{"title": "Super Admin", "link": links("Projects", "/Project", "Super Config", "/admin/super")})
	}
	return fhir.Resource{"resourceType": "UserConfiguration", "menu": menu}, nil
}

// security is the security page's {mfaEnrolled, sessions} for a User (nil
// for clients and bots): the user's logins of the last hour that chose a
// membership and are not revoked. sandbot has no multi-factor
// authentication, so mfaEnrolled is always false.
func (a *Authenticator) security(ctx context.Context, p *principal.Principal) (map[string]any, error) {
	typ, _, _ := fhir.SplitReference(p.User)
	if typ != "User" {
		return nil, nil
	}
	since := time.Now().Add(-sessionWindow).UTC().Format(fhir.TimeFormat)
	logins, err := store.SearchResources(ctx, a.store, store.AllProjects, "Login",
		"user="+url.QueryEscape(p.User)+"&_lastUpdated=gt"+url.QueryEscape(since)+"&_sort=-_lastUpdated&_count=100")
	if err != nil {
		return nil, err
	}
	sessions := []any{}
	for _, l := range logins {
		if l.Ref("membership") == "" || l.Bool("revoked") {
			continue
		}
		s := map[string]any{"id": l.ID(), "lastUpdated": lastUpdated(l), "authMethod": l.String("authMethod"),
			"remoteAddress": l.String("remoteAddress")}
		sessions = append(sessions, s)
	}
	return map[string]any{"mfaEnrolled": false, "sessions": sessions}, nil
}
