package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/store/storetest"
)

// clearEnv unsets every SANDBOT_* variable for the test.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "SANDBOT_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		what string
		args []string
		env  map[string]string
		want []string // every one must appear in stderr
	}{
		{"bad address", []string{"-addr", "bogus"}, nil, []string{`SANDBOT_ADDR="bogus"`}},
		{"bad address from env", nil, map[string]string{"SANDBOT_ADDR": "8103"}, []string{"SANDBOT_ADDR"}},
		{"bad metrics address", []string{"-metrics-addr", "localhost"}, nil, []string{"SANDBOT_METRICS_ADDR"}},
		{"same addresses", []string{"-addr", ":9000", "-metrics-addr", ":9000"}, nil, []string{"must differ"}},
		{"relative base URL", []string{"-base-url", "/api/"}, nil, []string{"SANDBOT_BASE_URL"}},
		{"ftp base URL", []string{"-base-url", "ftp://example.com/"}, nil, []string{"SANDBOT_BASE_URL"}},
		{"base URL without host", []string{"-base-url", "http:///x"}, nil, []string{"SANDBOT_BASE_URL"}},
		{"mysql database URL", []string{"-database-url", "mysql://u@h/db"}, nil, []string{"SANDBOT_DATABASE_URL"}},
		{"file database URL", nil, map[string]string{"SANDBOT_DATABASE_URL": "/var/lib/x.db"}, []string{"SANDBOT_DATABASE_URL"}},
		{"empty data dir", []string{"-data-dir", ""}, nil, []string{"SANDBOT_DATA_DIR"}},
		{"admin id without secret", []string{"-admin-client-id", "admin"}, nil, []string{"SANDBOT_ADMIN_CLIENT_ID and SANDBOT_ADMIN_CLIENT_SECRET"}},
		{"admin secret without id", nil, map[string]string{"SANDBOT_ADMIN_CLIENT_SECRET": "0123456789abcdef0123"}, []string{"SANDBOT_ADMIN_CLIENT_ID and SANDBOT_ADMIN_CLIENT_SECRET"}},
		{"short admin secret", []string{"-admin-client-id", "admin", "-admin-client-secret", "short"}, nil, []string{"SANDBOT_ADMIN_CLIENT_SECRET"}},
		{"invalid admin id", []string{"-admin-client-id", "a/b", "-admin-client-secret", "0123456789abcdef0123"}, nil, []string{"SANDBOT_ADMIN_CLIENT_ID"}},
		{"bad SMTP URL", []string{"-smtp-url", "http://mail"}, nil, []string{"SANDBOT_SMTP_URL"}},
		{"relative app base URL", []string{"-app-base-url", "app/"}, nil, []string{"SANDBOT_APP_BASE_URL"}},
		{"wildcard CORS origin", nil, map[string]string{"SANDBOT_CORS_ORIGINS": "https://app.example.com, *"}, []string{"SANDBOT_CORS_ORIGINS", "not *"}},
		{"MLLP listener without a project", nil, map[string]string{"SANDBOT_MLLP_ADDRS": ":2575"}, []string{"SANDBOT_MLLP_ADDRS", "ADDR=PROJECT"}},
		{"MLLP listener with a bad network", []string{"-mllp-addrs", ":2575=p;10.0.0.0"}, nil, []string{"SANDBOT_MLLP_ADDRS", "10.0.0.0"}},
		{"MLLP over TLS without its key", []string{"-mllp-addrs", ":2575=p;cert=/nonexistent.pem"}, nil, []string{"SANDBOT_MLLP_ADDRS", "key="}},
		{"MLLP over TLS with a missing file", []string{"-mllp-addrs", ":2575=p;cert=/nonexistent.pem;key=/nonexistent-key.pem"}, nil, []string{"SANDBOT_MLLP_ADDRS", "nonexistent.pem"}},
		{"CORS origin with a path", []string{"-cors-origins", "https://app.example.com/app"}, nil, []string{"SANDBOT_CORS_ORIGINS", "https://app.example.com/app"}},
		{"CORS origin without scheme", []string{"-cors-origins", "app.example.com"}, nil, []string{"SANDBOT_CORS_ORIGINS"}},
		{"bad log level", []string{"-log-level", "loud"}, nil, []string{"SANDBOT_LOG_LEVEL"}},
		{"unparsable TTL from env", nil, map[string]string{"SANDBOT_TOKEN_TTL": "soon"}, []string{"SANDBOT_TOKEN_TTL"}},
		{"TTL too short", []string{"-token-ttl", "10s"}, nil, []string{"SANDBOT_TOKEN_TTL"}},
		{"unparsable shutdown timeout", nil, map[string]string{"SANDBOT_SHUTDOWN_TIMEOUT": "a while"}, []string{"SANDBOT_SHUTDOWN_TIMEOUT"}},
		{"unparsable drain", nil, map[string]string{"SANDBOT_SHUTDOWN_DRAIN": "briefly"}, []string{"SANDBOT_SHUTDOWN_DRAIN"}},
		{"bad trusted proxy", []string{"-trusted-proxies", "10.0.0.0/8, the balancer"}, nil, []string{"SANDBOT_TRUSTED_PROXIES", "the balancer"}},
		{"unparsable size from env", nil, map[string]string{"SANDBOT_MAX_JSON_BYTES": "1MB"}, []string{"SANDBOT_MAX_JSON_BYTES"}},
		{"size too small", []string{"-max-json-bytes", "10"}, nil, []string{"SANDBOT_MAX_JSON_BYTES"}},
		{"size too large", []string{"-max-module-bytes", "99999999999"}, nil, []string{"SANDBOT_MAX_MODULE_BYTES"}},
		{"bot memory too small", []string{"-bot-memory-bytes", "5"}, nil, []string{"SANDBOT_BOT_MEMORY_BYTES"}},
		{"negative log bytes", nil, map[string]string{"SANDBOT_BOT_LOG_BYTES": "-1"}, []string{"SANDBOT_BOT_LOG_BYTES"}},
		{"several at once", []string{"-addr", "x", "-base-url", "nope", "-log-level", "x"}, nil, []string{"SANDBOT_ADDR", "SANDBOT_BASE_URL", "SANDBOT_LOG_LEVEL"}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			for _, cmd := range []string{"serve", "migrate"} {
				var stdout, stderr bytes.Buffer
				code := run(context.Background(), append([]string{cmd, "-data-dir", t.TempDir()}, tc.args...), strings.NewReader(""), &stdout, &stderr)
				if code != 2 {
					t.Errorf("%s: exit %d, want 2 (stderr %s)", cmd, code, stderr.String())
				}
				if !strings.Contains(stderr.String(), "invalid configuration") {
					t.Errorf("%s: stderr %q", cmd, stderr.String())
				}
				for _, w := range tc.want {
					if !strings.Contains(stderr.String(), w) {
						t.Errorf("%s: stderr does not name %s:\n%s", cmd, w, stderr.String())
					}
				}
				if stdout.Len() != 0 {
					t.Errorf("%s: stdout %q", cmd, stdout.String())
				}
			}
		})
	}
}

func TestCommandLine(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct {
		args        []string
		code        int
		out, errOut string
	}{
		{[]string{"version"}, 0, "sandbot ", ""},
		{[]string{"help"}, 0, "Usage:", ""},
		{nil, 2, "", "Usage:"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"serve", "-no-such-flag"}, 2, "", "flag provided but not defined"},
		{[]string{"serve", "-h"}, 0, "", "-base-url"},
		{[]string{"healthcheck", "http://127.0.0.1:1/readyz"}, 1, "", "sandbot healthcheck"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, strings.NewReader(""), &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.out) || !strings.Contains(stderr.String(), tc.errOut) {
			t.Errorf("%v: exit %d stdout %q stderr %q; want %d, %q, %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.out, tc.errOut)
		}
	}
	var stdout bytes.Buffer
	run(context.Background(), []string{"version"}, nil, &stdout, io.Discard)
	if !regexp.MustCompile(`^sandbot \S+\n$`).MatchString(stdout.String()) {
		t.Errorf("version output %q", stdout.String())
	}
}

type running struct {
	api, ops string
	cancel   context.CancelFunc
	done     chan int
	stdout   *servertest.SyncBuffer
	stderr   *servertest.SyncBuffer
}

// start runs `sandbot serve` in-process and waits until /readyz answers 200.
func start(t *testing.T, dataDir, databaseURL string) *running {
	t.Helper()
	r := &running{api: servertest.FreeAddr(t), ops: servertest.FreeAddr(t), done: make(chan int, 1), stdout: &servertest.SyncBuffer{}, stderr: &servertest.SyncBuffer{}}
	args := []string{"serve", "-addr", r.api, "-metrics-addr", r.ops, "-base-url", "http://" + r.api, "-data-dir", dataDir,
		"-shutdown-timeout", "20s", "-log-level", "warn"}
	if databaseURL != "" {
		args = append(args, "-database-url", databaseURL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		r.done <- run(ctx, args, strings.NewReader(""), r.stdout, r.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case code := <-r.done:
			t.Fatalf("serve exited early with %d: %s", code, r.stderr.String())
		default:
		}
		if resp, err := http.Get("http://" + r.ops + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return r
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("serve never became ready: %s", r.stderr.String())
	return nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var credRE = regexp.MustCompile(`client id:\s+(\S+)\n\s+client secret:\s+(\S+)\n`)

func token(t *testing.T, api, id, secret string) (int, string) {
	t.Helper()
	status, out := servertest.PostToken(t, "http://"+api+"/", url.Values{"grant_type": {"client_credentials"}, "client_id": {id}, "client_secret": {secret}})
	tok, _ := out["access_token"].(string)
	return status, tok
}

// TestServeLifecycle starts the real command twice over one store: the first
// start bootstraps and prints the generated super-admin secret once, the
// second does neither; cancelling the context drains in-flight requests,
// turns readiness off and exits 0.
func TestServeLifecycle(t *testing.T) {
	clearEnv(t)
	for _, be := range storetest.Backends(t) {
		t.Run(be.Name, func(t *testing.T) {
			dataDir := t.TempDir()
			dbURL := ""
			if be.Name == "postgres" {
				dbURL = be.NewURL(t)
			}
			procs := goruntime.GOMAXPROCS(0)
			first := start(t, dataDir, dbURL)
			// Twice the Ps per core while serving (decision 62); a set
			// GOMAXPROCS is left as it is.
			if want := 2 * limits.Cores(); os.Getenv("GOMAXPROCS") == "" && goruntime.GOMAXPROCS(0) != want {
				t.Errorf("GOMAXPROCS %d while serving, want %d", goruntime.GOMAXPROCS(0), want)
			}
			m := credRE.FindStringSubmatch(first.stdout.String())
			if m == nil || strings.Count(first.stdout.String(), "created the super-admin client") != 1 {
				t.Fatalf("first start did not print the generated credentials once:\n%s", first.stdout.String())
			}
			id, secret := m[1], m[2]
			if len(secret) < 32 {
				t.Errorf("generated secret %q is short", secret)
			}
			status, tok := token(t, first.api, id, secret)
			if status != 200 {
				t.Fatalf("token with the printed credentials: %d", status)
			}
			if code := run(context.Background(), []string{"healthcheck", "http://" + first.ops + "/readyz"}, nil, io.Discard, io.Discard); code != 0 {
				t.Errorf("healthcheck while serving: %d", code)
			}

			// A request in flight when shutdown starts still completes.
			pr, pw := io.Pipe()
			req, _ := http.NewRequest("POST", "http://"+first.api+"/fhir/R4/Patient", pr)
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/fhir+json")
			inflight := make(chan int, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					inflight <- -1
					return
				}
				resp.Body.Close()
				inflight <- resp.StatusCode
			}()
			pw.Write([]byte(`{"resourceType":"Patient",`))
			// Wait until the server is serving it (the in-flight gauge counts it).
			waitFor(t, "the request to be in flight", func() bool {
				resp, err := http.Get("http://" + first.ops + "/metrics")
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return regexp.MustCompile(`(?m)^sandbot_http_requests_in_flight [1-9]`).Match(b)
			})
			first.cancel()
			deadline := time.Now().Add(10 * time.Second)
			for {
				resp, err := http.Get("http://" + first.ops + "/readyz")
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == 503 {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("readiness never went 503 during the drain (%v)", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case code := <-first.done:
				t.Fatalf("serve exited (%d) with a request in flight", code)
			default:
			}
			pw.Write([]byte(`"gender":"female"}`))
			pw.Close()
			if got := <-inflight; got != 201 {
				t.Errorf("in-flight request: %d, want 201", got)
			}
			select {
			case code := <-first.done:
				if code != 0 {
					t.Errorf("serve exited with %d: %s", code, first.stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("serve did not exit after cancel")
			}
			if got := goruntime.GOMAXPROCS(0); got != procs {
				t.Errorf("GOMAXPROCS %d after serve returned, want %d as before", got, procs)
			}
			if c, err := net.DialTimeout("tcp", first.api, time.Second); err == nil {
				c.Close()
				t.Error("API port still open after exit")
			}
			if c, err := net.DialTimeout("tcp", first.ops, time.Second); err == nil {
				c.Close()
				t.Error("ops port still open after exit")
			}

			second := start(t, dataDir, dbURL)
			if strings.Contains(second.stdout.String(), "client secret") {
				t.Errorf("second start printed credentials again:\n%s", second.stdout.String())
			}
			if status, _ := token(t, second.api, id, secret); status != 200 {
				t.Errorf("first start's credentials on the second start: %d", status)
			}
			_, tok2 := token(t, second.api, id, secret)
			req2, _ := http.NewRequest("GET", "http://"+second.api+"/fhir/R4/Project?_total=accurate", nil)
			req2.Header.Set("Authorization", "Bearer "+tok2)
			resp, err := http.DefaultClient.Do(req2)
			if err != nil {
				t.Fatal(err)
			}
			var bundle struct{ Total int }
			json.NewDecoder(resp.Body).Decode(&bundle)
			resp.Body.Close()
			if bundle.Total != 1 {
				t.Errorf("%d projects after two starts, want 1 (bootstrap once)", bundle.Total)
			}
			second.cancel()
			select {
			case code := <-second.done:
				if code != 0 {
					t.Errorf("second serve exited with %d", code)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("second serve did not exit")
			}
			if be.Name == "sqlite" {
				if _, err := os.Stat(filepath.Join(dataDir, "sandbot.db")); err != nil {
					t.Errorf("no SQLite store in the data dir: %v", err)
				}
			}
		})
	}
}

func TestMigrateCommand(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"migrate", "-data-dir", dir}, nil, io.Discard, &stderr); code != 0 {
		t.Fatalf("migrate: %d %s", code, stderr.String())
	}
	if code := run(context.Background(), []string{"migrate", "-data-dir", dir}, nil, io.Discard, &stderr); code != 0 {
		t.Fatalf("migrate again: %d %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "migrations applied") {
		t.Errorf("stderr %s", stderr.String())
	}
	if code := run(context.Background(), []string{"migrate", "-database-url", "postgres://nobody@127.0.0.1:1/x?sslmode=disable&connect_timeout=1"}, nil, io.Discard, io.Discard); code != 1 {
		t.Errorf("migrate against an unreachable database: exit %d, want 1", code)
	}
}
