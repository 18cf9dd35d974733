package fhirservice

import (
	"context"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
)

// usersPage is how many Users UsersByEmail reads at a time.
const usersPage = 100

// UsersByEmail is the one lookup of accounts by e-mail (a password login, a
// password reset, an invitation): the Users p may read whose email is email,
// compared whole and without regard to case, as p sees them. Nothing else
// matches: not bob@example.com for bob@example.co (a string search alone
// would match that prefix). The server (principal.System) sees every
// project's Users.
func (s *Service) UsersByEmail(ctx context.Context, p *principal.Principal, email string) ([]fhir.Resource, error) {
	email = strings.TrimSpace(email)
	if email == "" {
		return nil, nil
	}
	param := fhir.LookupParam("User", "email")
	// iexact is the store's case-insensitive equality of a string
	// parameter (what _filter's eq compares).
	value, err := fhir.ParseValue(param, "iexact", email)
	if err != nil {
		return nil, err
	}
	var out []fhir.Resource
	for offset := 0; ; offset += usersPage {
		req := &fhir.SearchRequest{ResourceType: "User", Count: usersPage, Offset: offset,
			Filters: []fhir.Filter{{Param: param, Modifier: "iexact", Values: []fhir.FilterValue{value}}}}
		res, err := s.Search(ctx, p, req)
		if err != nil {
			return nil, err
		}
		for i := range res.Records {
			u, err := res.Records[i].Resource()
			if err != nil {
				return nil, err
			}
			// The store compares normalised values; an address is the same
			// only when it is equal but for case.
			if strings.EqualFold(strings.TrimSpace(u.String("email")), email) {
				out = append(out, u)
			}
		}
		if !res.More {
			return out, nil
		}
	}
}
