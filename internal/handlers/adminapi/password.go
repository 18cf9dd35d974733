package adminapi

import (
	"net/http"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
)

// resetPassword is POST /auth/resetpassword, the app's "Reset Password"
// form: {email, projectId?, sendEmail?}. It answers ok whether or not the
// e-mail has an account (admin.Service.RequestPasswordReset). A reCAPTCHA
// token, when sent, is ignored (the auth rate limit applies).
func (h *Handler) resetPassword(w http.ResponseWriter, r *http.Request) {
	body, err := httpx.ReadJSONObject(r, h.maxJSON)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	email, _ := body["email"].(string)
	projectID, _ := body["projectId"].(string)
	send, ok := body["sendEmail"].(bool)
	if err := h.svc.RequestPasswordReset(r.Context(), email, projectID, !ok || send); err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}
