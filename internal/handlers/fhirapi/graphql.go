package fhirapi

import (
	"encoding/json"
	"net/http"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirgraphql"
)

// graphql is GET and POST /fhir/R4/$graphql: a query in the JSON body
// {query, operationName, variables}, or in the query string of a GET. A
// query that cannot run is a 400 OperationOutcome; otherwise the answer is
// GraphQL's {data, errors}.
func (h *Handler) graphql(w http.ResponseWriter, r *http.Request) {
	if h.cfg.GraphQL == nil {
		h.fail(w, r, fhir.ErrNotFound)
		return
	}
	var req fhirgraphql.Request
	if r.Method == http.MethodGet {
		q := r.URL.Query()
		req.Query, req.OperationName = q.Get("query"), q.Get("operationName")
		if v := q.Get("variables"); v != "" {
			if err := json.Unmarshal([]byte(v), &req.Variables); err != nil {
				h.fail(w, r, fhir.Invalid("variables must be a JSON object", "variables"))
				return
			}
		}
	} else {
		body, err := httpx.ReadJSON(r, h.cfg.Limits.JSONBodyBytes)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if err := json.Unmarshal(body, &req); err != nil {
			h.fail(w, r, fhir.Invalid("Content could not be parsed"))
			return
		}
	}
	res, err := h.cfg.GraphQL.Do(r.Context(), principal.FromContext(r.Context()), &req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, "application/json", res)
}
