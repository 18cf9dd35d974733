package authapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/admin"
	"github.com/sandbot/sandbot/internal/services/auth"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/storetest"
)

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("not JSON (%d): %s", a.status, a.body)
	}
	return m
}

func send(t *testing.T, method, u, body string, header map[string]string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

func basic(id, secret string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(id+":"+secret))
}

const form = "application/x-www-form-urlencoded"

// tokenRequest posts a form to /oauth2/token.
func tokenRequest(t *testing.T, s *servertest.Server, values url.Values, header map[string]string) answer {
	t.Helper()
	h := map[string]string{"Content-Type": form}
	for k, v := range header {
		h[k] = v
	}
	return send(t, "POST", s.URL+"oauth2/token", values.Encode(), h)
}

// newClient makes a ClientApplication in project (with a membership unless
// noMembership) directly in the store.
func newClient(t *testing.T, s *servertest.Server, project string, fields map[string]any, noMembership bool) (id, secret string) {
	t.Helper()
	ctx := context.Background()
	secret = admin.NewSecret()
	res := fhir.Resource{"resourceType": "ClientApplication", "name": "c", "secret": secret}
	for k, v := range fields {
		res[k] = v
	}
	err := s.Store.InTx(ctx, func(tx store.Store) error {
		w := store.Write{Project: project, Author: fhir.Reference{Reference: "system"}}
		rec, err := tx.Create(ctx, res, w)
		if err != nil {
			return err
		}
		id = rec.ID
		if noMembership {
			return nil
		}
		_, err = tx.Create(ctx, admin.NewMembership(project, "p", "ClientApplication/"+id, "ClientApplication/"+id, "c", false), w)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, secret
}

func TestTokenEndpointErrors(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "oauth")
		inactive, inactiveSecret := newClient(t, s, c.ProjectID, map[string]any{"status": "off"}, false)
		lonely, lonelySecret := newClient(t, s, c.ProjectID, nil, true)
		cc := func(kv ...string) url.Values {
			v := url.Values{"grant_type": {"client_credentials"}}
			for i := 0; i < len(kv); i += 2 {
				v.Set(kv[i], kv[i+1])
			}
			return v
		}
		for _, tc := range []struct {
			what   string
			form   url.Values
			header map[string]string
			desc   string
		}{
			{"no grant_type", url.Values{"client_id": {c.ClientID}, "client_secret": {c.Secret}}, nil, "Missing grant_type"},
			{"unknown grant", url.Values{"grant_type": {"password"}, "client_id": {c.ClientID}}, nil, "Unsupported grant_type"},
			{"no client_id", cc("client_secret", c.Secret), nil, "Missing client_id"},
			{"no client_secret", cc("client_id", c.ClientID), nil, "Missing client_secret"},
			{"empty client_secret", cc("client_id", c.ClientID, "client_secret", ""), nil, "Missing client_secret"},
			{"unknown client", cc("client_id", "00000000-0000-0000-0000-000000000000", "client_secret", c.Secret), nil, "Invalid client"},
			{"malformed client id", cc("client_id", "../../x", "client_secret", c.Secret), nil, "Invalid client"},
			{"inactive client", cc("client_id", inactive, "client_secret", inactiveSecret), nil, "Invalid client"},
			{"client without membership", cc("client_id", lonely, "client_secret", lonelySecret), nil, "Invalid client"},
			{"wrong secret", cc("client_id", c.ClientID, "client_secret", c.Secret+"x"), nil, "Invalid secret"},
			{"secret of another client", cc("client_id", c.ClientID, "client_secret", inactiveSecret), nil, "Invalid secret"},
			{"Bearer header", cc(), map[string]string{"Authorization": "Bearer " + c.Token}, "Invalid authorization header"},
			{"Basic header not base64", cc(), map[string]string{"Authorization": "Basic !!!"}, "Invalid authorization header"},
			{"Basic header without colon", cc(), map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("nocolon"))}, "Invalid authorization header"},
			{"Basic header with wrong secret", cc("client_id", c.ClientID, "client_secret", c.Secret), map[string]string{"Authorization": basic(c.ClientID, "wrong")}, "Invalid secret"},
		} {
			a := tokenRequest(t, s, tc.form, tc.header)
			if a.status != 400 || !strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
				t.Errorf("%s: %d %q %s", tc.what, a.status, a.header.Get("Content-Type"), a.body)
				continue
			}
			got := a.json(t)
			if len(got) != 2 || got["error"] != "invalid_request" || got["error_description"] != tc.desc {
				t.Errorf("%s: %s, want {error: invalid_request, error_description: %s}", tc.what, a.body, tc.desc)
			}
		}
		for _, ct := range []string{"application/json", "text/plain", "multipart/form-data; boundary=x", ""} {
			a := send(t, "POST", s.URL+"oauth2/token", `{"grant_type":"client_credentials"}`, map[string]string{"Content-Type": ct})
			if a.status != 400 || !strings.Contains(string(a.body), "Unsupported content type") {
				t.Errorf("content type %q: %d %s", ct, a.status, a.body)
			}
		}
		// GET is not a token request.
		if a := send(t, "GET", s.URL+"oauth2/token", "", nil); a.status < 400 || a.status >= 500 {
			t.Errorf("GET /oauth2/token: %d", a.status)
		}
	})
}

func decodeJWT(t *testing.T, tok string) (header, payload map[string]any) {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", tok)
	}
	dec := func(s string) map[string]any {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			t.Fatalf("JWT part: %v", err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("JWT part: %v", err)
		}
		return m
	}
	return dec(parts[0]), dec(parts[1])
}

func TestClientCredentials(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "Token Project")
		sa := s.SuperAdmin(t)
		good := url.Values{"grant_type": {"client_credentials"}, "client_id": {c.ClientID}, "client_secret": {c.Secret}}
		for _, tc := range []struct {
			what   string
			form   url.Values
			header map[string]string
		}{
			{"form", good, nil},
			{"Basic header", url.Values{"grant_type": {"client_credentials"}}, map[string]string{"Authorization": basic(c.ClientID, c.Secret)}},
			// Basic wins: the form fields are ignored (medplum login sends both).
			{"Basic header beats wrong form fields", url.Values{"grant_type": {"client_credentials"}, "client_id": {"00000000-0000-0000-0000-000000000000"}, "client_secret": {"wrong"}},
				map[string]string{"Authorization": basic(c.ClientID, c.Secret)}},
			{"lower-case basic", url.Values{"grant_type": {"client_credentials"}}, map[string]string{"Authorization": "basic " + base64.StdEncoding.EncodeToString([]byte(c.ClientID+":"+c.Secret))}},
		} {
			before := time.Now().Add(-2 * time.Second)
			a := tokenRequest(t, s, tc.form, tc.header)
			if a.status != 200 {
				t.Errorf("%s: %d %s", tc.what, a.status, a.body)
				continue
			}
			got := a.json(t)
			if got["token_type"] != "Bearer" || got["expires_in"] != float64(3600) || got["scope"] != "openid" ||
				got["id_token"] == nil || got["refresh_token"] != nil {
				t.Errorf("%s: response %s", tc.what, a.body)
			}
			if ref, _ := got["project"].(map[string]any); ref["reference"] != "Project/"+c.ProjectID || ref["display"] != "Token Project" {
				t.Errorf("%s: project %v", tc.what, got["project"])
			}
			if ref, _ := got["profile"].(map[string]any); ref["reference"] != c.Profile {
				t.Errorf("%s: profile %v", tc.what, got["profile"])
			}
			tok, _ := got["access_token"].(string)
			hdr, claims := decodeJWT(t, tok)
			if hdr["alg"] != "ES256" || hdr["kid"] == nil || hdr["kid"] == "" {
				t.Errorf("%s: JWT header %v", tc.what, hdr)
			}
			iat, _ := claims["iat"].(float64)
			exp, _ := claims["exp"].(float64)
			if claims["client_id"] != c.ClientID || claims["sub"] != c.ClientID || claims["profile"] != c.Profile ||
				claims["scope"] != "openid" || claims["iss"] != strings.TrimSuffix(s.URL, "/") {
				t.Errorf("%s: claims %v", tc.what, claims)
			}
			if time.Unix(int64(iat), 0).Before(before) || time.Unix(int64(iat), 0).After(time.Now().Add(2*time.Second)) || exp-iat != 3600 {
				t.Errorf("%s: iat %v exp %v", tc.what, iat, exp)
			}
			loginID, _ := claims["login_id"].(string)
			if loginID == "" {
				t.Fatalf("%s: no login_id", tc.what)
			}
			// login_id names a real Login of this client.
			login := sa.Do("GET", "fhir/R4/Login/"+loginID, nil, "")
			if login.Status != 200 || !strings.Contains(string(login.Body), `"ClientApplication/`+c.ClientID+`"`) {
				t.Errorf("%s: Login %s: %d %s", tc.what, loginID, login.Status, login.Body)
			}
			// The token works.
			if a := send(t, "GET", s.URL+"fhir/R4/Patient", "", map[string]string{"Authorization": "Bearer " + tok}); a.status != 200 {
				t.Errorf("%s: token refused: %d %s", tc.what, a.status, a.body)
			}
			_, idClaims := decodeJWT(t, got["id_token"].(string))
			if idClaims["login_id"] != loginID || idClaims["sub"] != c.ClientID {
				t.Errorf("%s: id_token claims %v", tc.what, idClaims)
			}
		}
		// A custom scope is echoed.
		sc := url.Values{"grant_type": {"client_credentials"}, "client_id": {c.ClientID}, "client_secret": {c.Secret}, "scope": {"openid profile"}}
		if a := tokenRequest(t, s, sc, nil); a.json(t)["scope"] != "openid profile" {
			t.Errorf("scope: %s", a.body)
		}
	})
}

func TestBasicAuthOnAPI(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "basic")
		id := c.Create(map[string]any{"resourceType": "Patient"})["id"].(string)
		for _, tc := range []struct {
			what, auth string
			status     int
		}{
			{"right secret", basic(c.ClientID, c.Secret), 200},
			{"wrong secret", basic(c.ClientID, c.Secret+"x"), 401},
			{"unknown client", basic("00000000-0000-0000-0000-000000000000", c.Secret), 401},
			{"empty id", basic("", c.Secret), 401},
			{"not base64", "Basic %%%", 401},
		} {
			for _, p := range []string{"fhir/R4/Patient/" + id, "auth/me"} {
				a := send(t, "GET", s.URL+p, "", map[string]string{"Authorization": tc.auth})
				if a.status != tc.status {
					t.Errorf("%s %s: %d, want %d: %s", tc.what, p, a.status, tc.status, a.body)
				}
			}
		}
		a := send(t, "POST", s.URL+"fhir/R4/Patient", `{"resourceType":"Patient"}`, map[string]string{"Authorization": basic(c.ClientID, c.Secret), "Content-Type": "application/fhir+json"})
		if a.status != 201 || !strings.Contains(string(a.body), `"reference":"`+c.Profile+`"`) {
			t.Errorf("create with Basic: %d %s", a.status, a.body)
		}
	})
}

func TestAuthMe(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "Me Project")
		for _, authz := range []string{"Bearer " + c.Token, basic(c.ClientID, c.Secret)} {
			a := send(t, "GET", s.URL+"auth/me", "", map[string]string{"Authorization": authz})
			if a.status != 200 {
				t.Fatalf("/auth/me: %d %s", a.status, a.body)
			}
			if strings.Contains(string(a.body), c.Secret) || strings.Contains(string(a.body), `"secret"`) {
				t.Errorf("/auth/me leaks the client secret: %s", a.body)
			}
			me := a.json(t)
			project, _ := me["project"].(map[string]any)
			if project["resourceType"] != "Project" || project["id"] != c.ProjectID || project["name"] != "Me Project" || project["superAdmin"] != false {
				t.Errorf("project %v", project)
			}
			m, _ := me["membership"].(map[string]any)
			if m["resourceType"] != "ProjectMembership" || m["id"] == nil || m["admin"] != true ||
				get(m, "profile", "reference") != c.Profile || get(m, "user", "reference") != c.Profile {
				t.Errorf("membership %v", m)
			}
			profile, _ := me["profile"].(map[string]any)
			if profile["resourceType"] != "ClientApplication" || profile["id"] != c.ClientID || profile["name"] != "Me Project client" {
				t.Errorf("profile %v", profile)
			}
			if _, ok := me["config"].(map[string]any); !ok {
				t.Errorf("config %v", me["config"])
			}
		}
		sa := s.SuperAdmin(t)
		me := send(t, "GET", s.URL+"auth/me", "", map[string]string{"Authorization": "Bearer " + sa.Token}).json(t)
		if get(me, "project", "superAdmin") != true || get(me, "project", "id") != s.Bootstrap.ProjectID {
			t.Errorf("super admin /auth/me project %v", me["project"])
		}
	})
}

// get is servertest.Field, the nested field of a decoded JSON object.
var get = servertest.Field

// TestRejectedTokens: every forged, damaged or stale credential is 401 with
// the unauthorized OperationOutcome, on FHIR routes and /auth/me.
func TestRejectedTokens(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "tokens")
		_, claims := decodeJWT(t, c.Token)
		loginID := claims["login_id"].(string)
		iss := strings.TrimSuffix(s.URL, "/")
		valid := func() auth.Claims {
			cl := auth.Claims{ClientID: c.ClientID, LoginID: loginID, Profile: c.Profile, Scope: "openid"}
			cl.Subject = c.ClientID
			return cl
		}
		sign := func(cl auth.Claims) string {
			tok, err := s.Auth.Tokens().Sign(cl)
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}
		b64 := func(v any) string { js, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(js) }
		now := time.Now().Unix()
		payload := map[string]any{"client_id": c.ClientID, "login_id": loginID, "sub": c.ClientID, "iss": iss, "iat": now, "exp": now + 3600}

		// Sanity: a token signed the same way but valid is accepted.
		if a := send(t, "GET", s.URL+"fhir/R4/Patient", "", map[string]string{"Authorization": "Bearer " + sign(valid())}); a.status != 200 {
			t.Fatalf("freshly signed token refused: %d %s", a.status, a.body)
		}
		expired := valid()
		expired.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour))
		noLogin := valid()
		noLogin.LoginID = ""
		unknownLogin := valid()
		unknownLogin.LoginID = "00000000-0000-0000-0000-000000000000"
		parts := strings.Split(c.Token, ".")
		sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
		sig[len(sig)/2] ^= 0x01
		flipped := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig)
		tampered := parts[0] + "." + b64(map[string]any{"client_id": c.ClientID, "login_id": loginID, "sub": "someone-else", "iss": iss, "iat": now, "exp": now + 3600}) + "." + parts[2]
		hs, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(payload)).SignedString([]byte("some key"))
		if err != nil {
			t.Fatal(err)
		}
		jwks := send(t, "GET", s.URL+".well-known/jwks.json", "", nil)
		hsPub, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(payload)).SignedString(jwks.body)
		// A token from another server (another signing key) with the same claims.
		other := servertest.Start(t, storetest.Backends(t)[0])
		foreign, err := other.Auth.Tokens().Sign(valid())
		if err != nil {
			t.Fatal(err)
		}

		for _, tc := range []struct{ what, authz string }{
			{"no header", ""},
			{"empty bearer", "Bearer "},
			{"garbage token", "Bearer garbage"},
			{"three garbage parts", "Bearer a.b.c"},
			{"flipped signature byte", "Bearer " + flipped},
			{"tampered payload", "Bearer " + tampered},
			{"truncated signature", "Bearer " + c.Token[:len(c.Token)-4]},
			{"expired", "Bearer " + sign(expired)},
			{"alg none", "Bearer " + b64(map[string]any{"alg": "none", "typ": "JWT"}) + "." + b64(payload) + "."},
			{"alg none upper", "Bearer " + b64(map[string]any{"alg": "NONE", "typ": "JWT"}) + "." + b64(payload) + "."},
			{"HS256 with some key", "Bearer " + hs},
			{"HS256 with the JWKS as key", "Bearer " + hsPub},
			{"signed by another server", "Bearer " + foreign},
			{"no login_id", "Bearer " + sign(noLogin)},
			{"unknown login", "Bearer " + sign(unknownLogin)},
			{"unknown scheme", "Token " + c.Token},
			{"token without scheme", c.Token},
		} {
			for _, p := range []string{"fhir/R4/Patient", "auth/me", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000"} {
				h := map[string]string{}
				if tc.authz != "" {
					h["Authorization"] = tc.authz
				}
				a := send(t, "GET", s.URL+p, "", h)
				if a.status != 401 {
					t.Errorf("%s on %s: %d, want 401: %.200s", tc.what, p, a.status, a.body)
					continue
				}
				o := a.json(t)
				issue, _ := o["issue"].([]any)
				if o["resourceType"] != "OperationOutcome" || o["id"] != "unauthorized" || len(issue) != 1 ||
					get(issue[0], "code") != "login" || get(issue[0], "details", "text") != "Unauthorized" {
					t.Errorf("%s on %s: outcome %s", tc.what, p, a.body)
				}
			}
		}
		// The original token still works after all of that.
		if a := send(t, "GET", s.URL+"fhir/R4/Patient", "", map[string]string{"Authorization": "Bearer " + c.Token}); a.status != 200 {
			t.Errorf("original token: %d", a.status)
		}
	})
}

// TestSigningKeySurvivesRestart: two servers over one database (a restart, or
// two replicas) share the signing key and the bootstrap.
func TestSigningKeySurvivesRestart(t *testing.T) {
	for _, be := range storetest.Backends(t) {
		t.Run(be.Name, func(t *testing.T) {
			dbURL := be.NewURL(t)
			first := servertest.StartURL(t, be.Name, dbURL)
			if !first.Bootstrap.Created {
				t.Fatal("first start did not bootstrap")
			}
			c := first.NewProject(t, "restart")
			// Same public base URL (issuer), as after a real restart.
			sameBase := func(cfg *server.Config) { cfg.BaseURL = first.URL }
			second := servertest.StartURL(t, be.Name, dbURL, sameBase)
			if second.Bootstrap.Created || second.Bootstrap.ProjectID != first.Bootstrap.ProjectID {
				t.Errorf("second start bootstrapped again: %+v vs %+v", second.Bootstrap, first.Bootstrap)
			}
			a := send(t, "GET", second.HTTP.URL+"/fhir/R4/Patient", "", map[string]string{"Authorization": "Bearer " + c.Token})
			if a.status != 200 {
				t.Errorf("token of the first server on the second: %d %s", a.status, a.body)
			}
			tok, err := second.Auth.Tokens().Sign(func() auth.Claims {
				_, cl := decodeJWT(t, c.Token)
				v := auth.Claims{ClientID: c.ClientID, LoginID: cl["login_id"].(string), Profile: c.Profile}
				v.Subject = c.ClientID
				return v
			}())
			if err != nil {
				t.Fatal(err)
			}
			if a := send(t, "GET", first.HTTP.URL+"/fhir/R4/Patient", "", map[string]string{"Authorization": "Bearer " + tok}); a.status != 200 {
				t.Errorf("token of the second server on the first: %d %s", a.status, a.body)
			}
			j1 := send(t, "GET", first.HTTP.URL+"/.well-known/jwks.json", "", nil)
			j2 := send(t, "GET", second.HTTP.URL+"/.well-known/jwks.json", "", nil)
			if j1.status != 200 || string(j1.body) != string(j2.body) || !strings.Contains(string(j1.body), `"kid"`) {
				t.Errorf("JWKS differ:\n%s\n%s", j1.body, j2.body)
			}
			// The super admin still logs in with the configured secret, once.
			if tok := second.Token(t, servertest.AdminClientID, servertest.AdminClientSecret); tok == "" {
				t.Error("super admin cannot log in on the second server")
			}
			r := second.SuperAdmin(t).Do("GET", "fhir/R4/Project?_total=accurate&name=super", nil, "")
			if total, _ := r.JSON()["total"].(float64); total != 1 {
				t.Errorf("super-admin projects after restart: %v (%s)", r.JSON()["total"], r.Body)
			}
			// A changed configured secret is applied at the next start.
			const newSecret = "test-super-admin-secret-rotated"
			third := servertest.StartURL(t, be.Name, dbURL, sameBase, func(cfg *server.Config) { cfg.AdminClientSecret = newSecret })
			if third.Token(t, servertest.AdminClientID, newSecret) == "" {
				t.Error("the rotated secret does not log in")
			}
			old := url.Values{"grant_type": {"client_credentials"}, "client_id": {servertest.AdminClientID}, "client_secret": {servertest.AdminClientSecret}}
			if a := tokenRequest(t, third, old, nil); a.status != 400 {
				t.Errorf("the old secret after rotation: %d %s", a.status, a.body)
			}
		})
	}
}

// TestAuthRateLimit: past the limit, /oauth2/token answers 429 with an
// OperationOutcome (docs/decisions.md 16), while /auth/me and the FHIR API are not
// limited.
func TestAuthRateLimit(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "limited") // one token request
		good := url.Values{"grant_type": {"client_credentials"}, "client_id": {c.ClientID}, "client_secret": {c.Secret}}
		for i := 0; i < 4; i++ {
			if a := tokenRequest(t, s, good, nil); a.status != 200 {
				t.Fatalf("request %d within the limit: %d %s", i+2, a.status, a.body)
			}
		}
		a := tokenRequest(t, s, good, nil)
		if a.status != 429 || a.header.Get("Retry-After") == "" || a.header.Get("RateLimit-Limit") != "5" {
			t.Fatalf("over the limit: %d %v %s", a.status, a.header, a.body)
		}
		o := a.json(t)
		issue, _ := o["issue"].([]any)
		if o["resourceType"] != "OperationOutcome" || o["id"] != "too-many-requests" || len(issue) != 1 || get(issue[0], "code") != "throttled" {
			t.Errorf("429 body %s", a.body)
		}
		for _, p := range []string{"auth/me", "fhir/R4/Patient"} {
			if a := send(t, "GET", s.URL+p, "", map[string]string{"Authorization": "Bearer " + c.Token}); a.status != 200 {
				t.Errorf("%s after the auth limit: %d", p, a.status)
			}
		}
	}, func(cfg *server.Config) { cfg.Limits.AuthRequestsPerMinute = 5 })
}

// TestRevokedLogin: a token whose Login is revoked (or whose membership is
// deactivated) stops working at once: the store's change feed drops the
// cached principals.
func TestRevokedLogin(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "revoke")
		m := s.NewMember(t, c.ProjectID, "member", false)
		ctx := context.Background()
		_, claims := decodeJWT(t, c.Token)
		loginID := claims["login_id"].(string)
		bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
		if a := send(t, "GET", s.URL+"fhir/R4/Patient", "", bearer(c.Token)); a.status != 200 {
			t.Fatalf("before revocation: %d", a.status)
		}
		_, err := s.Store.Update(ctx, store.AllProjects, "Login", loginID, store.Write{Author: fhir.Reference{Reference: "system"}},
			func(l fhir.Resource) (fhir.Resource, error) { l["revoked"] = true; return l, nil })
		if err != nil {
			t.Fatal(err)
		}
		// A deactivated membership ends its tokens and its Basic credentials.
		// (The admin's token is revoked already, at once: ask as the super admin.)
		mid := entryIDsOf(t, send(t, "GET", s.URL+"fhir/R4/ProjectMembership?profile="+m.Profile, "", bearer(s.SuperAdmin(t).Token)))
		if len(mid) != 1 {
			t.Fatalf("member's membership: %v", mid)
		}
		if _, err := s.Store.Update(ctx, store.AllProjects, "ProjectMembership", mid[0], store.Write{Author: fhir.Reference{Reference: "system"}},
			func(r fhir.Resource) (fhir.Resource, error) { r["active"] = false; return r, nil }); err != nil {
			t.Fatal(err)
		}
		// Written straight to the store: its change announcements reach the
		// principal cache without a word from the test.
		for what, h := range map[string]map[string]string{
			"revoked login":         bearer(c.Token),
			"inactive member token": bearer(m.Token),
			"inactive member basic": {"Authorization": basic(m.ClientID, m.Secret)},
		} {
			if a := send(t, "GET", s.URL+"fhir/R4/Patient", "", h); a.status != 401 {
				t.Errorf("%s: %d, want 401", what, a.status)
			}
		}
		if a := tokenRequest(t, s, url.Values{"grant_type": {"client_credentials"}, "client_id": {m.ClientID}, "client_secret": {m.Secret}}, nil); a.status != 400 || a.json(t)["error_description"] != "Invalid client" {
			t.Errorf("token for an inactive member: %d %s", a.status, a.body)
		}
		// A new login of the admin client works again.
		if tok := s.Token(t, c.ClientID, c.Secret); send(t, "GET", s.URL+"fhir/R4/Patient", "", bearer(tok)).status != 200 {
			t.Error("new login refused")
		}
	})
}

func entryIDsOf(t *testing.T, a answer) []string {
	t.Helper()
	var b struct {
		Entry []struct {
			Resource struct{ ID string } `json:"resource"`
		} `json:"entry"`
	}
	if err := json.Unmarshal(a.body, &b); err != nil || a.status != 200 {
		t.Fatalf("bundle: %d %s", a.status, a.body)
	}
	var out []string
	for _, e := range b.Entry {
		out = append(out, e.Resource.ID)
	}
	return out
}
