package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/handlers/httpx"
	"github.com/sandbot/sandbot/internal/services/hl7feed"
	"github.com/sandbot/sandbot/internal/webhook"
	"github.com/sandbot/sandbot/limits"
)

// config is everything the server reads from its environment and flags.
// Every SANDBOT_* variable has a flag of the same name in kebab case; a flag
// given on the command line wins over the variable.
type config struct {
	Addr              string
	MetricsAddr       string
	BaseURL           string
	DatabaseURL       string
	DataDir           string
	AdminClientID     string
	AdminClientSecret string
	SMTPURL           string
	// ModuleArtifactKey authenticates the compiled modules replicas share
	// (docs/decisions.md 41); empty uses a key kept in the database.
	ModuleArtifactKey string
	// AppBaseURL is where the web app is served (its set-password page
	// receives invitation links); empty means BaseURL.
	AppBaseURL string
	// CORSOrigins is the comma-separated list of other origins allowed to
	// call the API from a browser.
	CORSOrigins string
	// corsOrigins is CORSOrigins parsed by validate.
	corsOrigins []string
	// MLLPAddrs is SANDBOT_MLLP_ADDRS: the MLLP listeners and the project
	// each feeds; validate parses it into mllp.
	MLLPAddrs string
	mllp      []hl7feed.Listener
	LogLevel  string
	// Pprof serves Go's profiles on the ops listener (SANDBOT_PPROF).
	Pprof bool
	// AuditMemory answers an execution once its AuditEvent is queued in
	// memory instead of on disk in the audit journal
	// (SANDBOT_BOT_AUDIT_QUEUE=memory).
	AuditMemory     bool
	TokenTTL        time.Duration
	ShutdownTimeout time.Duration
	ShutdownDrain   time.Duration
	// TrustedProxies is the raw SANDBOT_TRUSTED_PROXIES; validate parses it
	// into Proxies.
	TrustedProxies string
	Proxies        httpx.TrustedProxies
	// WebhookAllow is the raw SANDBOT_WEBHOOK_ALLOW; validate parses it
	// into webhookAllow.
	WebhookAllow string
	webhookAllow []netip.Prefix
	// Limits are set through the rows of limits.Settings; fields without a
	// row keep their defaults.
	Limits limits.Limits
}

// configFlags binds the flags of cfg on fs, with defaults from the environment.
func configFlags(fs *flag.FlagSet, cfg *config) {
	str := func(p *string, name, env, def, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			def = v
		}
		fs.StringVar(p, name, def, usage+" ($"+env+")")
	}
	dur := func(p *time.Duration, name, env string, def time.Duration, usage string) {
		s := def.String()
		if v, ok := os.LookupEnv(env); ok {
			s = v
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			d = -1 // reported by validate
		}
		fs.DurationVar(p, name, d, usage+" ($"+env+")")
	}
	str(&cfg.Addr, "addr", "SANDBOT_ADDR", ":8103", "API listen address")
	str(&cfg.MetricsAddr, "metrics-addr", "SANDBOT_METRICS_ADDR", ":9103", "ops listen address for /metrics, /livez, /readyz")
	str(&cfg.BaseURL, "base-url", "SANDBOT_BASE_URL", "http://localhost:8103/", "public base URL")
	str(&cfg.DatabaseURL, "database-url", "SANDBOT_DATABASE_URL", "", "postgres:// URL; empty uses the embedded SQLite store in the data dir")
	str(&cfg.DataDir, "data-dir", "SANDBOT_DATA_DIR", "./sandbot-data", "directory of the embedded store and the module compilation cache")
	str(&cfg.AdminClientID, "admin-client-id", "SANDBOT_ADMIN_CLIENT_ID", "", "id of the bootstrap super-admin ClientApplication (generated if empty)")
	str(&cfg.AdminClientSecret, "admin-client-secret", "SANDBOT_ADMIN_CLIENT_SECRET", "", "secret of the bootstrap super-admin ClientApplication (generated if empty)")
	str(&cfg.ModuleArtifactKey, "module-artifact-key", "SANDBOT_MODULE_ARTIFACT_KEY", "", "key (32 characters or more, the same on every replica, kept out of the database) that authenticates the compiled bot modules replicas share through the database; empty: a key kept in the database")
	str(&cfg.SMTPURL, "smtp-url", "SANDBOT_SMTP_URL", "", "smtp://user:pass@host:port for invitation e-mails; empty logs them")
	str(&cfg.AppBaseURL, "app-base-url", "SANDBOT_APP_BASE_URL", "", "base URL of the web app: invitation links point at <app>setpassword/…, and its origin may call the API (empty: the base URL)")
	str(&cfg.MLLPAddrs, "mllp-addrs", "SANDBOT_MLLP_ADDRS", "", "HL7 over MLLP: comma-separated ADDR=PROJECT[;CIDR...][;cert=FILE;key=FILE[;clientca=FILE]] listeners (\":2575=<project id>\"), each feeding one project's Agent channel, over TLS with cert= and key=")
	str(&cfg.CORSOrigins, "cors-origins", "SANDBOT_CORS_ORIGINS", "", "comma-separated origins (https://app.example.com) whose browser apps may call the API")
	str(&cfg.LogLevel, "log-level", "SANDBOT_LOG_LEVEL", "info", "debug, info, warn or error")
	fs.BoolVar(&cfg.AuditMemory, "bot-audit-memory", os.Getenv("SANDBOT_BOT_AUDIT_QUEUE") == "memory", "answer a bot execution once its AuditEvent is queued in memory rather than on disk in the audit journal: faster on a slow disk, but a crash loses the events of its last moments ($SANDBOT_BOT_AUDIT_QUEUE=memory; default disk)")
	fs.BoolVar(&cfg.Pprof, "pprof", os.Getenv("SANDBOT_PPROF") == "true", "serve Go's profiles (/debug/pprof/) on the ops listener ($SANDBOT_PPROF=true)")
	dur(&cfg.TokenTTL, "token-ttl", "SANDBOT_TOKEN_TTL", time.Hour, "access token lifetime")
	dur(&cfg.ShutdownTimeout, "shutdown-timeout", "SANDBOT_SHUTDOWN_TIMEOUT", 30*time.Second, "how long in-flight requests may take to finish on shutdown")
	dur(&cfg.ShutdownDrain, "shutdown-drain", "SANDBOT_SHUTDOWN_DRAIN", 5*time.Second, "on SIGTERM, how long /readyz answers 503 while the API still accepts connections, before it stops accepting (a Kubernetes preStop)")
	str(&cfg.TrustedProxies, "trusted-proxies", "SANDBOT_TRUSTED_PROXIES", "", "comma-separated CIDRs of the load balancers whose X-Forwarded-For / Forwarded give the client address")
	str(&cfg.WebhookAllow, "webhook-allow", "SANDBOT_WEBHOOK_ALLOW", "", "comma-separated CIDRs that Subscriptions' HTTP hooks may call although they are not public addresses (loopback, private, link-local are refused otherwise)")
	limitFlags(fs, &cfg.Limits)
}

// limitFlags binds a flag for every row of limits.Settings on fs, with
// defaults from the environment, and sets the other fields of l to their
// defaults. Values are checked by validateLimits.
func limitFlags(fs *flag.FlagSet, l *limits.Limits) {
	*l = limits.Default()
	l.ExecutionMemoryBytes = defaultExecutionMemory()
	for _, s := range limits.Settings() {
		p := s.Field(l)
		if v, ok := os.LookupEnv(s.Env); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				n = -1 // below every Min: reported by validateLimits
			}
			*p = n
		}
		fs.Int64Var(p, s.Flag, *p, s.Usage+" ($"+s.Env+")")
	}
}

// validateLimits checks every row of limits.Settings in l, naming the
// variable, and stores a 0 given for a setting where 0 means "no limit" as
// the limits package has it.
func validateLimits(l *limits.Limits) []error {
	var errs []error
	for _, s := range limits.Settings() {
		p := s.Field(l)
		if *p < s.Min || *p > s.Max {
			errs = append(errs, fmt.Errorf("%s=%d must be a number between %d and %d", s.Env, *p, s.Min, s.Max))
		} else if *p == 0 && s.ZeroIsOff {
			*p = -1
		}
	}
	return errs
}

// validate checks the configuration and normalises it, with messages that
// say which setting is wrong and how.
func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, a := range []struct{ name, v string }{{"SANDBOT_ADDR", c.Addr}, {"SANDBOT_METRICS_ADDR", c.MetricsAddr}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			bad("%s=%q is not a listen address like :8103 or 127.0.0.1:8103", a.name, a.v)
		}
	}
	if c.Addr == c.MetricsAddr {
		bad("SANDBOT_ADDR and SANDBOT_METRICS_ADDR must differ (both %q)", c.Addr)
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("SANDBOT_BASE_URL=%q must be an absolute http(s) URL", c.BaseURL)
	} else if !strings.HasSuffix(c.BaseURL, "/") {
		c.BaseURL += "/"
	}
	if c.AppBaseURL != "" {
		if u, err := url.Parse(c.AppBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("SANDBOT_APP_BASE_URL=%q must be an absolute http(s) URL", c.AppBaseURL)
		} else if !strings.HasSuffix(c.AppBaseURL, "/") {
			c.AppBaseURL += "/"
		}
	}
	if ls, err := hl7feed.ParseListeners(c.MLLPAddrs); err != nil {
		bad("%v", err)
	} else {
		c.mllp = ls
	}
	c.corsOrigins = nil
	for _, o := range strings.Split(c.CORSOrigins, ",") {
		switch o = strings.TrimSpace(o); {
		case o == "":
		case o == "*":
			bad("SANDBOT_CORS_ORIGINS must list origins, not *: the API takes credentials, and browsers refuse a wildcard with them")
		default:
			n, err := httpx.ParseOrigin(o)
			if err != nil {
				bad("SANDBOT_CORS_ORIGINS: %v", err)
				continue
			}
			c.corsOrigins = append(c.corsOrigins, n)
		}
	}
	if c.DatabaseURL != "" && !strings.HasPrefix(c.DatabaseURL, "postgres://") && !strings.HasPrefix(c.DatabaseURL, "postgresql://") {
		bad("SANDBOT_DATABASE_URL must be a postgres:// URL (leave it empty for the embedded store)")
	}
	if c.DataDir == "" {
		bad("SANDBOT_DATA_DIR must not be empty")
	}
	if c.AdminClientID != "" && !fhir.ValidID(c.AdminClientID) {
		bad("SANDBOT_ADMIN_CLIENT_ID=%q must be 1-64 letters, digits, '-' or '.'", c.AdminClientID)
	}
	if (c.AdminClientID == "") != (c.AdminClientSecret == "") {
		bad("SANDBOT_ADMIN_CLIENT_ID and SANDBOT_ADMIN_CLIENT_SECRET go together: set both or neither")
	}
	if c.AdminClientSecret != "" && len(c.AdminClientSecret) < 16 {
		bad("SANDBOT_ADMIN_CLIENT_SECRET must be at least 16 characters")
	}
	if c.ModuleArtifactKey != "" && len(c.ModuleArtifactKey) < 32 {
		bad("SANDBOT_MODULE_ARTIFACT_KEY must be at least 32 characters")
	}
	if c.SMTPURL != "" {
		if su, err := url.Parse(c.SMTPURL); err != nil || (su.Scheme != "smtp" && su.Scheme != "smtps") || su.Host == "" {
			// The URL is not echoed: it may carry a password.
			bad("SANDBOT_SMTP_URL must look like smtp://user:password@host:587 or smtps://…")
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("SANDBOT_LOG_LEVEL=%q must be debug, info, warn or error", c.LogLevel)
	}
	if c.TokenTTL < time.Minute {
		bad("SANDBOT_TOKEN_TTL must be a duration of at least 1m (e.g. 1h)")
	}
	if c.ShutdownTimeout < 0 {
		bad("SANDBOT_SHUTDOWN_TIMEOUT must be a duration (e.g. 30s)")
	}
	if c.ShutdownDrain < 0 {
		bad("SANDBOT_SHUTDOWN_DRAIN must be a duration (e.g. 5s, or 0s for none)")
	}
	if p, err := httpx.ParseTrustedProxies(c.TrustedProxies); err != nil {
		bad("SANDBOT_TRUSTED_PROXIES: %v", err)
	} else {
		c.Proxies = p
	}
	if a, err := webhook.ParseAllow(c.WebhookAllow); err != nil {
		bad("SANDBOT_WEBHOOK_ALLOW: %v", err)
	} else {
		c.webhookAllow = a
	}
	errs = append(errs, validateLimits(&c.Limits)...)
	return errors.Join(errs...)
}

// storeURL is the database URL: PostgreSQL, or the SQLite file in the data dir.
func (c *config) storeURL() string {
	if c.DatabaseURL != "" {
		return c.DatabaseURL
	}
	return filepath.Join(c.DataDir, "sandbot.db")
}

// defaultExecutionMemory is the execution memory budget when the operator
// sets none: a quarter of the memory this process may use (its cgroup's
// memory.max, else the machine's MemTotal), at least 512 MiB; the limits
// package's default when neither can be read.
func defaultExecutionMemory() int64 {
	total := int64(0)
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64); err == nil {
					total = kb << 10
				}
			}
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 && (total == 0 || n < total) {
			total = n
		}
	}
	if total == 0 {
		return limits.Default().ExecutionMemoryBytes
	}
	return max(total/4, 512<<20)
}

// auditJournalDir is where the bot audit journal lives; empty keeps the
// events in memory until they are stored.
func (c *config) auditJournalDir() string {
	if c.AuditMemory {
		return ""
	}
	return filepath.Join(c.DataDir, "audit-journal")
}
