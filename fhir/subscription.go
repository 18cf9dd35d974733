package fhir

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// The reference's Subscription extensions (its subscription docs).
const (
	ExtSubscriptionInteraction  = "https://medplum.com/fhir/StructureDefinition/subscription-supported-interaction"
	ExtSubscriptionFHIRPath     = "https://medplum.com/fhir/StructureDefinition/fhir-path-criteria-expression"
	ExtSubscriptionMaxAttempts  = "https://medplum.com/fhir/StructureDefinition/subscription-max-attempts"
	ExtSubscriptionSuccessCodes = "https://medplum.com/fhir/StructureDefinition/subscription-success-codes"
	// The secret of an HTTP hook's X-Signature: the reference's profile
	// declares the first, its server reads the second and once read the
	// third; each is accepted.
	ExtSubscriptionSecret       = "https://medplum.com/fhir/StructureDefinition/subscription-secret"
	extSubscriptionSecretWWW    = "https://www.medplum.com/fhir/StructureDefinition/subscription-secret"
	extSubscriptionSecretLegacy = "https://www.medplum.com/fhir/StructureDefinition-subscriptionSecret"
)

// DefaultSubscriptionAttempts is how many times a delivery is tried when the
// Subscription does not say (the reference's default for its HTTP hooks).
const DefaultSubscriptionAttempts = 4

// Subscription is what a Subscription resource asks of the server: for the
// writes of ResourceType that Criteria (and FHIRPath, when set) matches and
// whose interaction is one of Interactions, run a Bot (BotID, from an
// endpoint "Bot/<id>") or post to an HTTP hook (URL).
type Subscription struct {
	ID           string
	Active       bool
	ResourceType string
	Criteria     *SearchRequest
	// FHIRPath is the fhir-path-criteria-expression, evaluated with
	// %current and %previous; nil when there is none.
	FHIRPath     *PathExpr
	BotID        string
	URL          string
	Interactions map[string]bool
	MaxAttempts  int
	// An HTTP hook's secret (X-Signature), its channel.header lines, in
	// order, and the statuses that count as delivered (nil: 200-399).
	Secret       string
	Headers      [][2]string
	SuccessCodes [][2]int
}

// Delivered reports whether an HTTP hook's answer status counts as a
// delivery.
func (s *Subscription) Delivered(status int) bool {
	if s.SuccessCodes == nil {
		return status >= 200 && status < 400
	}
	for _, r := range s.SuccessCodes {
		if status >= r[0] && status <= r[1] {
			return true
		}
	}
	return false
}

// ParseSubscription reads a Subscription. One whose channel is a rest-hook
// to Bot/<id> or to an http(s) URL is refused with EInvalid (naming the
// element) when sandbot cannot deliver it: a criteria that is not a search
// of a known type (chained parameters, which need other resources at
// delivery time, included), a FHIRPath criteria outside the subset
// (ParseCriteria), an interaction other than create, update and delete, a
// max-attempts outside 1-18, success codes that are not ranges of statuses,
// or a header line without a name. Any other channel (a websocket, a
// rest-hook to anything else) is not delivered: it parses with neither
// BotID nor URL, unchecked.
func ParseSubscription(r Resource) (*Subscription, error) {
	sub := &Subscription{ID: r.ID(), Active: r.String("status") == "active", MaxAttempts: DefaultSubscriptionAttempts}
	channel, _ := r["channel"].(map[string]any)
	endpoint, _ := channel["endpoint"].(string)
	if t, _ := channel["type"].(string); t != "rest-hook" {
		return sub, nil
	}
	if typ, id, ok := SplitReference(endpoint); ok && typ == "Bot" {
		sub.BotID = id
	} else if u, err := url.Parse(endpoint); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		if u.Host == "" || u.User != nil {
			return nil, Invalid("Subscription.channel.endpoint must be an http or https URL with a host and no credentials", "Subscription.channel.endpoint")
		}
		sub.URL = endpoint
		for _, h := range anySlice(channel["header"]) {
			line, _ := h.(string)
			name, value, ok := strings.Cut(line, ":")
			name = strings.TrimSpace(name)
			if !ok || name == "" || strings.ContainsAny(line, "\r\n\x00") || strings.ContainsAny(name, " \t") {
				return nil, Invalid(`Subscription.channel.header lines are "Name: value"`, "Subscription.channel.header")
			}
			sub.Headers = append(sub.Headers, [2]string{name, strings.TrimSpace(value)})
		}
	} else {
		return sub, nil
	}
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
	if len(req.Has) > 0 {
		return nil, Invalid("Subscription.criteria may not use _has", "Subscription.criteria")
	}
	sub.Criteria = req
	for _, x := range anySlice(r["extension"]) {
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
			src, _ := m["valueString"].(string)
			expr, err := ParseCriteria(src)
			if err != nil || strings.TrimSpace(src) == "" {
				msg := "fhir-path-criteria-expression is empty"
				if err != nil {
					msg = "fhir-path-criteria-expression: " + err.Error()
				}
				return nil, Invalid(msg, "Subscription.extension")
			}
			sub.FHIRPath = expr
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
		case ExtSubscriptionSuccessCodes:
			src, _ := m["valueString"].(string)
			codes, err := parseStatusRanges(src)
			if err != nil {
				return nil, Invalid("subscription-success-codes: "+err.Error(), "Subscription.extension")
			}
			sub.SuccessCodes = codes
		case ExtSubscriptionSecret, extSubscriptionSecretWWW, extSubscriptionSecretLegacy:
			sub.Secret, _ = m["valueString"].(string)
		}
	}
	if sub.Interactions == nil {
		sub.Interactions = map[string]bool{"create": true, "update": true}
	}
	return sub, nil
}

// parseStatusRanges parses success codes such as "200-399,404".
func parseStatusRanges(src string) ([][2]int, error) {
	var out [][2]int
	for _, part := range strings.Split(src, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.Atoi(strings.TrimSpace(lo))
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(strings.TrimSpace(hi))
		}
		if err1 != nil || err2 != nil || a < 100 || b > 599 || a > b {
			return nil, fmt.Errorf("%q is not a status or a range of statuses (such as 200-399,404)", strings.TrimSpace(part))
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

func anySlice(v any) []any { s, _ := v.([]any); return s }

// Wants reports whether the subscription takes writes of this interaction
// and type at all (before its criteria are matched).
func (s *Subscription) Wants(interaction, resourceType string) bool {
	return s.Active && (s.BotID != "" || s.URL != "") && s.Interactions[interaction] && resourceType == s.ResourceType
}

// Matches reports whether a resource version (r, with its index values from
// Extract) written by interaction is one the subscription delivers;
// previous is the version it replaced (nil on create), the FHIRPath
// criteria's %previous.
func (s *Subscription) Matches(interaction string, r Resource, values []IndexValue, previous Resource) bool {
	if !s.Wants(interaction, r.Type()) {
		return false
	}
	if len(s.Criteria.Filters) != 0 || len(s.Criteria.Expr) != 0 || len(s.Criteria.AnyOf) != 0 {
		if ok, err := MatchInMemory(s.Criteria, r, values); err != nil || !ok {
			return false
		}
	}
	return s.FHIRPath == nil || s.FHIRPath.EvalCriteria(r, previous)
}
