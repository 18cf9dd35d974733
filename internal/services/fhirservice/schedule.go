package fhirservice

import (
	"context"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// checkSchedule holds a Bot's schedule (cronString, cronTiming) and a Cron
// resource to what the server can run (fhir.BotSchedule, fhir.ParseCron):
// an invalid schedule is a 400 on write, whoever writes it, rather than a
// schedule that silently never runs. A Cron's target Bot and onBehalfOf
// membership must be of the project it is written to. Who may write a Cron
// at all is the Rules table's (project admins).
func (s *Service) checkSchedule(ctx context.Context, st store.Store, project string, res fhir.Resource) error {
	seconds := s.lim.CronFields == 6
	switch res.Type() {
	case "Bot":
		_, err := fhir.BotSchedule(res, seconds)
		return err
	case "Cron":
		c, err := fhir.ParseCron(res, seconds)
		if err != nil {
			return err
		}
		scope := store.ProjectScope(project)
		if _, err := st.Read(ctx, scope, "Bot", c.BotID); err != nil {
			if fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) {
				return err
			}
			return fhir.Invalid("Cron.targetReference: no Bot/"+c.BotID+" in the project", "Cron.targetReference")
		}
		if _, err := st.Read(ctx, scope, "ProjectMembership", c.Membership); err != nil {
			if fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) {
				return err
			}
			return fhir.Invalid("Cron.onBehalfOf: no ProjectMembership/"+c.Membership+" in the project", "Cron.onBehalfOf")
		}
	}
	return nil
}

// scheduled reports whether writes of typ are checked by checkSchedule.
func scheduled(typ string) bool { return typ == "Bot" || typ == "Cron" }
