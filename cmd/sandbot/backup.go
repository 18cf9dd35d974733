package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sandbot/sandbot/store/sqlstore"
)

// pgDumpHint is what `sandbot backup` answers on PostgreSQL, whose own
// tools copy a live database consistently (README: Backups).
const pgDumpHint = `sandbot backup: the store is PostgreSQL (SANDBOT_DATABASE_URL); back it up with PostgreSQL's own tools:
  pg_dump --format=custom --file=sandbot.dump "$SANDBOT_DATABASE_URL"
and restore into an empty database, before starting sandbot on it, with:
  pg_restore --no-owner --dbname="$SANDBOT_DATABASE_URL" sandbot.dump
`

// backup copies the embedded store, while servers run on it, to a new
// file: `sandbot backup [-data-dir DIR] FILE`. It reads the same
// SANDBOT_DATA_DIR and SANDBOT_DATABASE_URL as serve, and only those, so
// that a setting the copy does not need cannot stop it.
func backup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sandbot backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: sandbot backup [flags] FILE\n\nWrites a consistent copy of the embedded store (SQLite) to FILE, a new file, while the server runs.\n\n")
		fs.PrintDefaults()
	}
	var dataDir, databaseURL string
	str := func(p *string, name, env, def, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			def = v
		}
		fs.StringVar(p, name, def, usage+" ($"+env+")")
	}
	str(&dataDir, "data-dir", "SANDBOT_DATA_DIR", "./sandbot-data", "directory of the embedded store")
	str(&databaseURL, "database-url", "SANDBOT_DATABASE_URL", "", "postgres:// URL: refused, use pg_dump")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	if databaseURL != "" {
		fmt.Fprint(stderr, pgDumpHint)
		return 2
	}
	if dataDir == "" {
		fmt.Fprintln(stderr, "sandbot backup: SANDBOT_DATA_DIR must not be empty")
		return 2
	}
	// An interrupted copy leaves nothing behind (sqlstore.Backup removes its
	// temporary file).
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	src := (&config{DataDir: dataDir}).storeURL()
	start := time.Now()
	size, err := sqlstore.Backup(ctx, src, fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "sandbot backup: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "sandbot: backed up %s to %s (%d bytes in %s)\n", src, fs.Arg(0), size, time.Since(start).Round(time.Millisecond))
	return 0
}
