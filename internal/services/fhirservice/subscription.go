package fhirservice

import (
	"context"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
)

// checkSubscription holds a Subscription to a Bot that p writes to what the
// server can deliver (fhir.ParseSubscription), and wires a bot only for a writer who
// may run it: a Subscription is a standing order to run the Bot on other
// people's data, so it needs the same right as $execute (Operations) on a
// Bot the writer can read (docs/decisions.md 33).
func (s *Service) checkSubscription(ctx context.Context, p *principal.Principal, res fhir.Resource) error {
	sub, err := fhir.ParseSubscription(res)
	if err != nil || sub.BotID == "" {
		return err
	}
	if err := AuthorizeOperation(p, "Bot", OpExecute); err != nil {
		return err
	}
	if _, err := s.Load(ctx, p, "Bot", sub.BotID); err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return fhir.Invalid("Subscription.channel.endpoint: no Bot/"+sub.BotID+" that you can run", "Subscription.channel.endpoint")
		}
		return err
	}
	return nil
}
