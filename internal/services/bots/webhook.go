package bots

import (
	"context"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/store"
)

// errNoWebhook is the one answer to a public webhook that may not run: no
// such membership, not a Bot's, inactive, without an access policy, or a Bot
// without publicWebhook. They are alike to the caller, who has no token and
// learns nothing of which memberships exist (the reference answers 403 with
// the reason for most of them).
var errNoWebhook = fhir.Errorf(fhir.ENotFound, "Not found")

// Webhook runs the Bot whose own membership is membership for a public
// webhook (POST /webhook/{membership}, no credentials), as the reference
// does: the membership must be a Bot's, active, with an access policy
// (access or accessPolicy), and the Bot must have publicWebhook true. The
// execution is ex (its input and headers) as the Bot itself: the bot's FHIR
// calls act as that membership, under its access policy. Anything else is
// 404.
func (s *Service) Webhook(ctx context.Context, membership string, ex Execute) (*Result, error) {
	mrec, err := s.store.Read(ctx, store.AllProjects, "ProjectMembership", membership)
	if err != nil {
		if fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) {
			return nil, err
		}
		return nil, errNoWebhook
	}
	m, err := s.parsedOf(mrec)
	if err != nil {
		return nil, err
	}
	typ, botID, ok := fhir.SplitReference(m.Ref("profile"))
	if !ok || typ != "Bot" || m.Ref("user") != "Bot/"+botID {
		return nil, errNoWebhook
	}
	if active, ok := m["active"].(bool); ok && !active {
		return nil, errNoWebhook
	}
	if m.Ref("accessPolicy") == "" && !hasAccess(m["access"]) {
		return nil, errNoWebhook
	}
	brec, err := s.store.Read(ctx, store.ProjectScope(mrec.Project), "Bot", botID)
	if err != nil {
		if fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) {
			return nil, err
		}
		return nil, errNoWebhook
	}
	bot, err := s.parsedOf(brec)
	if err != nil {
		return nil, err
	}
	if !bot.Bool("publicWebhook") {
		return nil, errNoWebhook
	}
	ex.BotID, ex.Identifier = botID, ""
	ex.Caller = AsBot(mrec.Project, botID)
	ex.Trigger = TriggerWebhook
	ex.Async = false
	return s.Execute(ctx, ex)
}

// hasAccess reports whether a membership's access (its parameterized
// policies) names at least one policy.
func hasAccess(v any) bool {
	list, _ := v.([]any)
	for _, a := range list {
		if m, ok := a.(map[string]any); ok {
			if p, ok := m["policy"].(map[string]any); ok && p["reference"] != nil {
				return true
			}
		}
	}
	return false
}

// AsBot is the caller of an execution that the Bot starts itself (a tick of
// its schedule, its public webhook): the server, within the Bot's project,
// on the Bot's behalf (the event's requester and the AuditEvent's agent are
// the Bot). It finds the Bot whatever the Bot's own access policy says (as
// the reference reads it with its system repository); the bot's FHIR calls
// act as its own membership, as always.
func AsBot(project, botID string) *principal.Principal {
	p := principal.System(project, fhir.Reference{Reference: "Bot/" + botID})
	p.Profile = "Bot/" + botID
	return p
}
