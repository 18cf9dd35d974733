// Package servertest starts real sandbot servers for tests: the same
// assembly as cmd/sandbot (internal/server) on a real loopback listener, over
// a fresh database of each backend (store/storetest.Backends).
package servertest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/services/admin"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// AdminClientID and AdminClientSecret are the bootstrap super-admin client
// of every test server.
const (
	AdminClientID     = "test-super-admin"
	AdminClientSecret = "test-super-admin-secret"
)

// Server is a running test server.
type Server struct {
	*server.Server
	URL      string // base URL with trailing slash
	HTTP     *httptest.Server
	Ops      *httptest.Server
	Store    *sqlstore.Store
	Registry *prometheus.Registry
	Backend  string
}

// Option adjusts the server configuration before it starts.
type Option func(*server.Config)

// ForEachBackend runs fn against a fresh server on every backend.
func ForEachBackend(t *testing.T, fn func(t *testing.T, s *Server), opts ...Option) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) { fn(t, Start(t, b, opts...)) })
	}
}

// Start starts a server on backend b; it stops when the test ends.
func Start(t testing.TB, b storetest.Backend, opts ...Option) *Server {
	t.Helper()
	return StartURL(t, b.Name, b.NewURL(t), opts...)
}

// StartURL starts a server over an existing database (a URL made by a
// storetest.Backend's NewURL, possibly used by another server before: this is
// a restart). backend is the backend's name.
func StartURL(t testing.TB, backend, databaseURL string, opts ...Option) *Server {
	t.Helper()
	ctx := context.Background()
	// The store's metrics go to the server's registry, as in cmd/sandbot.
	reg := prometheus.NewRegistry()
	st, err := sqlstore.Open(ctx, databaseURL, sqlstore.Options{Migrate: true, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// The listener is opened first so that the base URL is known to the
	// server (it signs tokens and builds links with it).
	hs := httptest.NewUnstartedServer(nil)
	base := "http://" + hs.Listener.Addr().String() + "/"
	cfg := server.Config{BaseURL: base, AdminClientID: AdminClientID, AdminClientSecret: AdminClientSecret, Version: "test", Dialect: backend,
		Runtime: sharedRuntime(t), AuditJournalDir: t.TempDir()}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := server.New(ctx, cfg, st, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	hs.Config.Handler = srv.API
	hs.Start()
	ops := httptest.NewServer(srv.Ops)
	t.Cleanup(func() { hs.Close(); ops.Close(); srv.Close() })
	return &Server{Server: srv, URL: base, HTTP: hs, Ops: ops, Store: st, Registry: reg, Backend: backend}
}

// Client is an HTTP client authenticated as one principal.
type Client struct {
	t     testing.TB
	base  string
	Token string
	// ProjectID is the caller's project.
	ProjectID string
	// Profile is the caller's profile reference.
	Profile string
	// ClientID and Secret are the caller's client credentials (clients made
	// by NewProject and NewMember).
	ClientID, Secret string
}

// PostToken posts form to base's /oauth2/token and returns the status and
// the decoded answer. base ends with a slash.
func PostToken(t testing.TB, base string, form url.Values) (int, map[string]any) {
	t.Helper()
	resp, err := http.PostForm(base+"oauth2/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// ClientToken gets an access token from base with client credentials.
func ClientToken(t testing.TB, base, clientID, secret string) string {
	t.Helper()
	status, out := PostToken(t, base, url.Values{"grant_type": {"client_credentials"}, "client_id": {clientID}, "client_secret": {secret}})
	tok, _ := out["access_token"].(string)
	if status != 200 || tok == "" {
		t.Fatalf("token for %s: %d %v", clientID, status, out)
	}
	return tok
}

// Token gets an access token with client credentials.
func (s *Server) Token(t testing.TB, clientID, secret string) string {
	t.Helper()
	return ClientToken(t, s.URL, clientID, secret)
}

// SuperAdmin is a client of the bootstrap super-admin.
func (s *Server) SuperAdmin(t testing.TB) *Client {
	return &Client{t: t, base: s.URL, Token: s.Token(t, AdminClientID, AdminClientSecret),
		ProjectID: s.Bootstrap.ProjectID, Profile: "ClientApplication/" + AdminClientID,
		ClientID: AdminClientID, Secret: AdminClientSecret}
}

// Anonymous is a client that sends no credentials.
func (s *Server) Anonymous(t testing.TB) *Client { return &Client{t: t, base: s.URL} }

// As is a client of the server with the given access token.
func (s *Server) As(t testing.TB, token string) *Client { return NewClient(t, s.URL, token) }

// NewClient is a client of the server at base (ending in "/"), for servers
// started as separate processes; token may be "".
func NewClient(t testing.TB, base, token string) *Client {
	return &Client{t: t, base: base, Token: token}
}

// NewMember adds a ClientApplication to an existing project, directly in the
// store, with a membership that is admin or not, and returns a client logged
// in as it.
func (s *Server) NewMember(t testing.TB, projectID, name string, isAdmin bool) *Client {
	t.Helper()
	ctx := context.Background()
	secret := admin.NewSecret()
	var clientID string
	err := s.Store.InTx(ctx, func(tx store.Store) error {
		system := store.Write{Project: projectID, Author: fhir.Reference{Reference: "system"}}
		c, err := tx.Create(ctx, fhir.Resource{"resourceType": "ClientApplication", "name": name, "secret": secret}, system)
		if err != nil {
			return err
		}
		clientID = c.ID
		_, err = tx.Create(ctx, admin.NewMembership(projectID, name, "ClientApplication/"+c.ID, "ClientApplication/"+c.ID, name, isAdmin), system)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return &Client{t: t, base: s.URL, Token: s.Token(t, clientID, secret), ProjectID: projectID,
		Profile: "ClientApplication/" + clientID, ClientID: clientID, Secret: secret}
}

// NewProject creates a project with an admin ClientApplication directly in
// the store and returns a client logged in as it.
func (s *Server) NewProject(t testing.TB, name string) *Client {
	t.Helper()
	return s.NewProjectWithID(t, uuid.NewString(), name)
}

// NewProjectWithID is NewProject with the project's id chosen (for a
// configuration that names the project before it exists, an MLLP listener).
func (s *Server) NewProjectWithID(t testing.TB, id, name string) *Client {
	t.Helper()
	ctx := context.Background()
	secret := admin.NewSecret()
	var projectID, clientID string
	err := s.Store.InTx(ctx, func(tx store.Store) error {
		// A project belongs to itself: its id is its meta.project.
		if _, err := tx.Create(ctx, fhir.Resource{"resourceType": "Project", "name": name, "strictMode": true}, store.Write{Project: id, ID: id, Author: fhir.Reference{Reference: "system"}}); err != nil {
			return err
		}
		projectID = id
		c, err := tx.Create(ctx, fhir.Resource{"resourceType": "ClientApplication", "name": name + " client", "secret": secret}, store.Write{Project: id, Author: fhir.Reference{Reference: "system"}})
		if err != nil {
			return err
		}
		clientID = c.ID
		_, err = tx.Create(ctx, admin.NewMembership(id, name, "ClientApplication/"+c.ID, "ClientApplication/"+c.ID, name+" client", true), store.Write{Project: id, Author: fhir.Reference{Reference: "system"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return &Client{t: t, base: s.URL, Token: s.Token(t, clientID, secret), ProjectID: projectID, Profile: "ClientApplication/" + clientID,
		ClientID: clientID, Secret: secret}
}

// Base is the server's base URL (with a trailing slash).
func (c *Client) Base() string { return c.base }

// Response is a decoded answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into a map (nil if it is not a JSON object).
func (r *Response) JSON() map[string]any {
	var m map[string]any
	json.Unmarshal(r.Body, &m)
	return m
}

// Issue is the details.text of the first issue of an OperationOutcome body.
func (r *Response) Issue() string {
	var o fhir.OperationOutcome
	if json.Unmarshal(r.Body, &o) != nil || len(o.Issue) == 0 || o.Issue[0].Details == nil {
		return ""
	}
	return o.Issue[0].Details.Text
}

// Do sends a request. body may be nil, a string, []byte or a value to encode
// as JSON; contentType defaults to application/fhir+json when there is a body.
func (c *Client) Do(method, path string, body any, contentType string) *Response {
	c.t.Helper()
	return c.DoWith(method, path, body, contentType, nil)
}

// DoWith is Do with extra request headers.
func (c *Client) DoWith(method, path string, body any, contentType string, headers map[string]string) *Response {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, c.base+strings.TrimPrefix(path, "/"), rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		if contentType == "" {
			contentType = "application/fhir+json"
		}
		req.Header.Set("Content-Type", contentType)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: out}
}

// Create creates a resource and fails the test unless it answers 201.
func (c *Client) Create(res map[string]any) map[string]any {
	c.t.Helper()
	r := c.Do("POST", "fhir/R4/"+res["resourceType"].(string), res, "")
	if r.Status != 201 {
		c.t.Fatalf("create %v: %d %s", res["resourceType"], r.Status, r.Body)
	}
	return r.JSON()
}

var (
	runtimeOnce sync.Once
	runtimeVal  *runtime.Runtime
	runtimeErr  error
	runtimeReg  = prometheus.NewRegistry()
)

// RuntimeRegistry holds the metrics of the runtime every test server of the
// process shares (each Server's Registry has only its own metrics).
func RuntimeRegistry() *prometheus.Registry { return runtimeReg }

// sharedRuntime is one bot runtime for the whole test process: compiled
// modules are reused across tests, and wazero's disk cache across runs.
func sharedRuntime(t testing.TB) *runtime.Runtime {
	runtimeOnce.Do(func() {
		runtimeVal, runtimeErr = runtime.New(context.Background(), runtime.Config{
			CacheDir: filepath.Join(os.TempDir(), "sandbot-test-wasm-cache"),
			// Tests run a project's bots several at a time; admission has
			// its own tests (runtime, cmd/sandbot's TestHostileBots). A
			// deploy's compilation gets a minute, not the default 4 s:
			// `go test ./...` runs packages side by side, and a starved
			// compilation would answer 429 (runtime's own tests hold the
			// limit).
			Limits:     limits.Limits{ExecutionMemoryBytes: 1 << 40, CompileSeconds: 60},
			Registerer: runtimeReg,
		})
	})
	if runtimeErr != nil {
		t.Fatal(runtimeErr)
	}
	return runtimeVal
}

// BuildBinary builds cmd/sandbot (with the JavaScript engine when `make js`
// has fetched it) into a temporary directory, for tests that run the server
// as a process: crash tests.
func BuildBinary(t testing.TB) string {
	t.Helper()
	_, self, _, _ := goruntime.Caller(0)
	root := filepath.Join(filepath.Dir(self), "..", "..")
	bin := filepath.Join(t.TempDir(), "sandbot")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sandbot")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// Process is a sandbot binary serving as a process of its own.
type Process struct {
	Cmd *exec.Cmd
	// Base is its API's base URL (with a trailing slash).
	Base string
	// Ops is its ops listener's base URL (/metrics, /readyz), with a
	// trailing slash.
	Ops string
	// Output is what it logged.
	Output *SyncBuffer
}

// ProcessStore is where a server process started by StartProcess on
// backend b keeps its data: a fresh data directory, and a fresh PostgreSQL
// database on the postgres backend (empty on SQLite: the store is in the
// data directory). A restarted process is given the same two.
func ProcessStore(t testing.TB, b storetest.Backend) (dataDir, databaseURL string) {
	t.Helper()
	if b.Name == "postgres" {
		databaseURL = b.NewURL(t)
	}
	return t.TempDir(), databaseURL
}

// StartProcess starts bin serve over dataDir (SQLite, when databaseURL is
// empty) or databaseURL, with the test super-admin client (AdminClientID)
// and env (KEY=value) added to the environment, and waits until it answers;
// it is killed when the test ends.
func StartProcess(t testing.TB, bin, dataDir, databaseURL string, env ...string) *Process {
	t.Helper()
	addr, ops := FreeAddr(t), FreeAddr(t)
	base := "http://" + addr + "/"
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "SANDBOT_ADDR="+addr, "SANDBOT_METRICS_ADDR="+ops, "SANDBOT_BASE_URL="+base,
		"SANDBOT_DATA_DIR="+dataDir, "SANDBOT_ADMIN_CLIENT_ID="+AdminClientID, "SANDBOT_ADMIN_CLIENT_SECRET="+AdminClientSecret,
		// A starved compilation answers 429 (sharedRuntime); env may
		// set another limit.
		"SANDBOT_COMPILE_SECONDS=60")
	if databaseURL != "" {
		cmd.Env = append(cmd.Env, "SANDBOT_DATABASE_URL="+databaseURL)
	}
	cmd.Env = append(cmd.Env, env...)
	out := &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "healthcheck")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return &Process{Cmd: cmd, Base: base, Ops: "http://" + ops + "/", Output: out}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start: %s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill kills the process with SIGKILL (no drain, nothing flushed) and
// waits for it to end.
func (p *Process) Kill() {
	p.Cmd.Process.Kill()
	p.Cmd.Wait()
}

// SuperAdmin is a client of the process logged in as the test super admin.
func (p *Process) SuperAdmin(t testing.TB) *Client {
	t.Helper()
	return NewClient(t, p.Base, ClientToken(t, p.Base, AdminClientID, AdminClientSecret))
}

// FreeAddr returns a loopback address with a port free at the time of the
// call, for servers started as separate processes.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// SyncBuffer collects what a server writes while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Field is a nested field of a decoded JSON object, or nil:
// Field(m, "meta", "versionId").
func Field(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// MetricValue is the value of the first series of a counter or gauge in g.
func MetricValue(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
