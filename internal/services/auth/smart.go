package auth

// SMARTConfiguration is the server's SMART App Launch discovery document
// (/.well-known/smart-configuration), naming only what sandbot has: the
// token endpoint and its three grants, the keys that verify its tokens and
// PKCE (its /auth/me and /auth/revoke are the reference's, not OpenID's
// userinfo or RFC 7009's revocation, so they are not named). It has no /oauth2/authorize (the web
// app signs users in through /auth/login and exchanges the code at the
// token endpoint), so it claims no launch capability: SMART makes the
// authorization endpoint a condition of those only. base is the server's
// public base URL, ending in "/".
func SMARTConfiguration(base string) map[string]any {
	return map[string]any{
		"issuer":                                trimSlash(base),
		"jwks_uri":                              base + ".well-known/jwks.json",
		"token_endpoint":                        base + "oauth2/token",
		"grant_types_supported":                 []string{"client_credentials", "authorization_code", "refresh_token"},
		"token_endpoint_auth_methods_supported": []string{"client_secret_basic", "client_secret_post"},
		"response_types_supported":              []string{"code"},
		"code_challenge_methods_supported":      []string{"S256"},
		"scopes_supported":                      []string{"openid", "offline_access"},
		"capabilities":                          []string{"client-confidential-symmetric"},
	}
}

func trimSlash(s string) string {
	if len(s) > 0 && s[len(s)-1] == '/' {
		return s[:len(s)-1]
	}
	return s
}
