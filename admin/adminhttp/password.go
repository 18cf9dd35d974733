package adminhttp

import (
	"net/http"
	"strings"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/auth"
	"github.com/sandbot/sandbot/internal/httpx"
)

// resetPassword is POST /auth/resetpassword, the app's "Reset Password"
// form: {email, projectId?, sendEmail?}. It answers ok whether or not the
// e-mail has an account; the account's owner gets a set-password link. A
// reCAPTCHA token, when sent, is ignored (the auth rate limit applies).
func (h *Handler) resetPassword(w http.ResponseWriter, r *http.Request) {
	body, err := httpx.ReadJSONObject(r, h.maxJSON)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	email, _ := body["email"].(string)
	email = strings.ToLower(strings.TrimSpace(email))
	if len(email) < 3 || len(email) > 72 || !auth.ValidEmail(email) {
		h.fail(w, r, fhir.Invalid("Valid email address between 3 and 72 characters is required", "email"))
		return
	}
	projectID, _ := body["projectId"].(string)
	if projectID != "" && !fhir.ValidID(projectID) {
		h.fail(w, r, fhir.Invalid("Invalid projectId", "projectId"))
		return
	}
	if send, ok := body["sendEmail"].(bool); !ok || send {
		if err := h.svc.RequestPasswordReset(r.Context(), email, projectID); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}
