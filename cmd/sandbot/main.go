// Command sandbot is the sandbot server: a FHIR R4 API with projects,
// memberships and WebAssembly bots. This package only wires the parts
// together: configuration, logger, store, routers, listeners and signals.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sandbot/sandbot/internal/logging"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

const usage = `sandbot: a FHIR server that runs WebAssembly bots.

Usage:
  sandbot serve [flags]         run the server (flags: sandbot serve -h)
  sandbot migrate [flags]       apply database migrations and exit
  sandbot backup [flags] FILE   copy the embedded store (SQLite) to FILE while the server runs
  sandbot version               print the version
  sandbot bot run <module.wasm|bot.js> [--content-type T] [--input FILE|-]
                                run a bot locally, without a server
  sandbot bot new [--lang go|js] <dir>
                                create a bot: a module that builds, a test, a README
  sandbot healthcheck [URL]     exit 0 when the server's /readyz answers (default http://127.0.0.1:9103/readyz)
`

func main() {
	// In the bot compiler's child process this compiles one module and
	// exits (runtime/compile.go); otherwise it returns at once.
	runtime.RunCompilerChild()
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "migrate":
		return migrate(ctx, args[1:], stderr)
	case "backup":
		return backup(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "sandbot", buildVersion())
		return 0
	case "healthcheck":
		return healthcheck(args[1:], stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	if code, ok := runExtraCommand(ctx, args, stdin, stdout, stderr); ok {
		return code
	}
	fmt.Fprintf(stderr, "sandbot: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func loadConfig(name string, args []string, stderr io.Writer) (*config, int) {
	fs := flag.NewFlagSet("sandbot "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := &config{}
	configFlags(fs, cfg)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(stderr, "sandbot: invalid configuration:\n%v\n", err)
		return nil, 2
	}
	return cfg, -1
}

func migrate(ctx context.Context, args []string, stderr io.Writer) int {
	cfg, code := loadConfig("migrate", args, stderr)
	if cfg == nil {
		return code
	}
	log := logging.New(stderr, cfg.LogLevel)
	st, err := sqlstore.Open(ctx, cfg.storeURL(), sqlstore.Options{Logger: log, Migrate: true})
	if err != nil {
		log.Error("migrate failed", "err", err)
		return 1
	}
	st.Close()
	log.Info("migrations applied", "dialect", sqlstore.DialectOf(cfg.storeURL()))
	return 0
}

// jsOffMessage is logged at start by a binary without the JavaScript engine.
const jsOffMessage = "JavaScript bots are off in this build (WebAssembly bots run): its JavaScript engine was not embedded. " +
	"Run `make run` (or `make js`, then build again; `make build` builds bin/sandbot with it) to serve JavaScript bots"

// gcBallastBytes is the size of the heap ballast serve keeps (see there).
const gcBallastBytes = 64 << 20

// procsPerCore is how many Ps (GOMAXPROCS) serve runs per core when the
// GOMAXPROCS variable is not set. A goroutine in a system call keeps its P
// until the scheduler's monitor takes it back, and every execution's
// AuditEvent waits for a disk sync (the audit journal's fdatasync, about
// 150-400 µs on the development machine), as the audit writer waits for
// SQLite's writes and syncs: with one P per core, runnable requests waited
// for a P while the cores had room. Twice the Ps raised the 8-connection
// rate of the C echo bot by 10-24% and halved its p99 (decision 62). The
// limits and the runtime still count executions per core (limits.Cores).
const procsPerCore = 2

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, code := loadConfig("serve", args, stderr)
	if cfg == nil {
		return code
	}
	// Access logs are buffered (one system call per flush, not per line).
	logOut := logging.NewBufferedWriter(stderr)
	defer logOut.Close()
	log := logging.New(logOut, cfg.LogLevel)
	if os.Getenv("GOGC") == "" {
		// Requests allocate briefly and little survives them (a live heap
		// of about 8 MiB), so the collector would run every 80 ms under
		// load. Each cycle's stop-the-world waits for every goroutine
		// running bot code to leave it (compiled WebAssembly cannot be
		// preempted), while the other cores idle. GOGC 200 and a 64 MiB
		// ballast (address space only: its pages are never written) set
		// the heap goal near 200 MiB and the cycles ~0.75 s apart: the C
		// echo's p99 fell from 288 to 120 µs and Go hello's from 30 to
		// 6.5 ms (bench/bots). Setting GOGC turns both off.
		debug.SetGCPercent(200)
		ballast := make([]byte, gcBallastBytes)
		defer goruntime.KeepAlive(ballast)
	}
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(signals)
	// A signal during start-up (migrations waiting for another replica's
	// lock, a database slow to answer) stops it; once the server listens,
	// signals start the shutdown below instead.
	started := make(chan struct{})
	startCtx, cancelStart := context.WithCancel(ctx)
	defer cancelStart()
	go func() {
		select {
		case sig := <-signals:
			cancelStart()
			signals <- sig // for the shutdown, should start-up have finished
		case <-started:
		}
	}()

	reg := prometheus.NewRegistry()
	st, err := sqlstore.Open(startCtx, cfg.storeURL(), sqlstore.Options{Logger: log, Migrate: true, Registerer: reg})
	if err != nil {
		log.Error("store unavailable", "err", err)
		return 1
	}
	defer st.Close()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewDBStatsCollector(st.DB(), string(st.Dialect())))

	rt, err := runtime.New(startCtx, runtime.Config{
		CacheDir:   filepath.Join(cfg.DataDir, "wasm-cache"),
		Limits:     cfg.Limits,
		Registerer: reg,
		Logger:     log,
		BaseURL:    cfg.BaseURL,
	})
	if err != nil {
		log.Error("bot runtime unavailable", "err", err)
		return 1
	}
	defer rt.Close(context.WithoutCancel(ctx))
	if !runtime.JSAvailable() {
		// Said once at start, so that whoever built the binary the plain Go
		// way learns before a JavaScript bot's deploy answers 400.
		log.Warn(jsOffMessage)
	}

	srv, err := server.New(startCtx, server.Config{
		BaseURL:           cfg.BaseURL,
		AdminClientID:     cfg.AdminClientID,
		AdminClientSecret: cfg.AdminClientSecret,
		TokenTTL:          cfg.TokenTTL,
		Limits:            cfg.Limits,
		Version:           buildVersion(),
		Dialect:           string(st.Dialect()),
		SMTPURL:           cfg.SMTPURL,
		ModuleArtifactKey: []byte(cfg.ModuleArtifactKey),
		AppBaseURL:        cfg.AppBaseURL,
		CORSOrigins:       cfg.corsOrigins,
		MLLP:              cfg.mllp,
		Pprof:             cfg.Pprof,
		AuditJournalDir:   cfg.auditJournalDir(),
		TrustedProxies:    cfg.Proxies,
		WebhookAllow:      cfg.webhookAllow,
		Runtime:           rt,
	}, st, reg, log)
	if err != nil {
		log.Error("server setup failed", "err", err)
		return 1
	}
	if b := srv.Bootstrap; b.Secret != "" {
		// Shown once: the store keeps it, but no API ever returns it again.
		fmt.Fprintf(stdout, "sandbot: created the super-admin client\n  client id:     %s\n  client secret: %s\n", b.ClientID, b.Secret)
	}

	// Raised only now: the limits and the runtime above have counted the
	// cores (limits.Cores) from the Ps the scheduler chose.
	if os.Getenv("GOMAXPROCS") == "" {
		defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(procsPerCore * limits.Cores()))
	}

	apiLis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		log.Error("listen", "addr", cfg.Addr, "err", err)
		return 1
	}
	opsLis, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		log.Error("listen", "addr", cfg.MetricsAddr, "err", err)
		return 1
	}
	api := &http.Server{Handler: srv.API, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	ops := &http.Server{Handler: srv.Ops, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- api.Serve(apiLis) }()
	go func() { errc <- ops.Serve(opsLis) }()
	log.Info("sandbot listening", "api", apiLis.Addr().String(), "ops", opsLis.Addr().String(),
		"base_url", cfg.BaseURL, "store", st.Dialect(), "version", buildVersion())
	close(started)

	var sig os.Signal
	select {
	case <-ctx.Done():
	case sig = <-signals:
	case err := <-errc:
		log.Error("listener failed", "err", err)
		return 1
	}
	// Readiness goes 503 at once, so that load balancers stop sending new
	// requests. On SIGTERM (what orchestrators send) the API then keeps
	// accepting for the drain delay, since a balancer needs a few health
	// checks to notice and may still send what it had already chosen to:
	// a closed port then would be a failed request. Answers during the
	// drain close their connections (server.closeWhileDraining). Then the
	// listener closes and in-flight requests get the shutdown timeout. An
	// interactive stop (SIGINT) or a second signal skips the drain.
	srv.SetReady(false)
	if sig == syscall.SIGTERM && cfg.ShutdownDrain > 0 {
		log.Info("draining: /readyz answers 503, still accepting", "drain", cfg.ShutdownDrain)
		select {
		case <-time.After(cfg.ShutdownDrain):
		case <-signals:
			log.Info("second signal: not waiting for the drain")
		case <-ctx.Done():
		}
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	// Asynchronous jobs stop being claimed now, and those running get the
	// same time as in-flight requests.
	jobsStopped := make(chan struct{})
	go func() { srv.StopJobs(shutdownCtx); close(jobsStopped) }()
	if err := api.Shutdown(shutdownCtx); err != nil {
		log.Error("api shutdown", "err", err)
	}
	ops.Shutdown(shutdownCtx)
	<-jobsStopped
	srv.Close()
	log.Info("stopped")
	return 0
}

func healthcheck(args []string, stderr io.Writer) int {
	target := "http://127.0.0.1:9103/readyz"
	if v := os.Getenv("SANDBOT_METRICS_ADDR"); v != "" {
		if host, port, err := net.SplitHostPort(v); err == nil {
			if host == "" || host == "0.0.0.0" || host == "::" {
				host = "127.0.0.1"
			}
			target = "http://" + net.JoinHostPort(host, port) + "/readyz"
		}
	}
	if len(args) > 0 {
		target = args[0]
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(target)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot healthcheck: %v\n", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "sandbot healthcheck: %s answered %d\n", target, resp.StatusCode)
		return 1
	}
	return 0
}
