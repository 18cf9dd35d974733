package fhir

import (
	"strings"
)

// The reference's Subscription extensions (its subscription docs).
const (
	ExtSubscriptionInteraction = "https://medplum.com/fhir/StructureDefinition/subscription-supported-interaction"
	ExtSubscriptionFHIRPath    = "https://medplum.com/fhir/StructureDefinition/fhir-path-criteria-expression"
	ExtSubscriptionMaxAttempts = "https://medplum.com/fhir/StructureDefinition/subscription-max-attempts"
)

// DefaultSubscriptionAttempts is how many times a delivery is tried when the
// Subscription does not say (the reference's default for its HTTP hooks).
const DefaultSubscriptionAttempts = 4

// Subscription is what a Subscription resource asks of the server: run a
// Bot (Endpoint "Bot/<id>") for the writes of ResourceType that Criteria
// matches and whose interaction is one of Interactions.
type Subscription struct {
	ID           string
	Active       bool
	ResourceType string
	Criteria     *SearchRequest
	BotID        string
	Interactions map[string]bool
	MaxAttempts  int
}

// ParseSubscription reads a Subscription. One whose channel is a rest-hook
// to Bot/<id> is refused with EInvalid (naming the element) when sandbot
// cannot deliver it: a criteria that is not a search of a known type
// (chained parameters, which need other resources at delivery time,
// included), an interaction other than create, update and delete, a
// FHIRPath criteria (not supported yet) or a max-attempts outside 1-18. Any
// other channel (an HTTP rest-hook, a websocket) is not delivered yet: it
// parses with an empty BotID, unchecked.
func ParseSubscription(r Resource) (*Subscription, error) {
	sub := &Subscription{ID: r.ID(), Active: r.String("status") == "active", MaxAttempts: DefaultSubscriptionAttempts}
	channel, _ := r["channel"].(map[string]any)
	endpoint, _ := channel["endpoint"].(string)
	typ, id, ok := SplitReference(endpoint)
	if t, _ := channel["type"].(string); t != "rest-hook" || !ok || typ != "Bot" {
		return sub, nil
	}
	sub.BotID = id
	criteria := r.String("criteria")
	sub.ResourceType, _, _ = strings.Cut(criteria, "?")
	_, query, _ := strings.Cut(criteria, "?")
	if !KnownType(sub.ResourceType) {
		return nil, Invalid("Subscription.criteria must be a search of a resource type, such as Patient or Observation?code=...", "Subscription.criteria")
	}
	req, err := ParseSearch(sub.ResourceType, query)
	if err != nil {
		return nil, Invalid("Subscription.criteria: "+err.Error(), "Subscription.criteria")
	}
	for _, f := range req.Filters {
		if f.Chain != nil {
			return nil, Invalid("Subscription.criteria may not chain parameters", "Subscription.criteria")
		}
	}
	sub.Criteria = req
	exts, _ := r["extension"].([]any)
	for _, x := range exts {
		m, _ := x.(map[string]any)
		switch m["url"] {
		case ExtSubscriptionInteraction:
			code, _ := m["valueCode"].(string)
			switch code {
			case "create", "update", "delete":
			default:
				return nil, Invalid("subscription-supported-interaction must be create, update or delete", "Subscription.extension")
			}
			if sub.Interactions == nil {
				sub.Interactions = map[string]bool{}
			}
			sub.Interactions[code] = true
		case ExtSubscriptionFHIRPath:
			return nil, Invalid("fhir-path-criteria-expression is not supported yet", "Subscription.extension")
		case ExtSubscriptionMaxAttempts:
			n, ok := m["valueInteger"].(interface{ Int64() (int64, error) })
			v, err := int64(0), error(nil)
			if ok {
				v, err = n.Int64()
			}
			if !ok || err != nil || v < 1 || v > 18 {
				return nil, Invalid("subscription-max-attempts must be an integer from 1 to 18", "Subscription.extension")
			}
			sub.MaxAttempts = int(v)
		}
	}
	if sub.Interactions == nil {
		sub.Interactions = map[string]bool{"create": true, "update": true}
	}
	return sub, nil
}

// Wants reports whether the subscription takes writes of this interaction
// and type at all (before its criteria are matched).
func (s *Subscription) Wants(interaction, resourceType string) bool {
	return s.Active && s.BotID != "" && s.Interactions[interaction] && resourceType == s.ResourceType
}

// Matches reports whether a resource version (r, with its index values from
// Extract) written by interaction is one the subscription delivers.
func (s *Subscription) Matches(interaction string, r Resource, values []IndexValue) bool {
	if !s.Wants(interaction, r.Type()) {
		return false
	}
	if len(s.Criteria.Filters) == 0 && len(s.Criteria.Expr) == 0 && len(s.Criteria.AnyOf) == 0 {
		return true
	}
	ok, err := MatchInMemory(s.Criteria, r, values)
	return err == nil && ok
}
