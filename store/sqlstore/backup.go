package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
)

// ErrBackupExists is returned by Backup when its destination exists: a
// backup never replaces a file.
var ErrBackupExists = errors.New("the backup file already exists")

// Backup writes a consistent copy of the SQLite database at path to dest
// (a new file) while servers keep reading and writing it, and returns its
// size. The copy is SQLite's VACUUM INTO, which reads the database in one
// read transaction: in WAL mode that is a snapshot of every transaction
// committed when it began, and writers are not held up (the WAL only grows
// until the copy ends, since a checkpoint cannot pass an open reader). The
// copy is written beside dest under a temporary name, checked with PRAGMA
// quick_check, synced (SQLite does not sync what VACUUM INTO writes) and
// then renamed to dest, so dest is either absent or complete.
//
// The database's "-versions" file (the read cache's counters, readcache.go)
// is not part of a backup: the counters only order the writes seen by the
// processes running on one file, and a server started on a restored
// database begins with an empty cache, so fresh counters are correct.
func Backup(ctx context.Context, path, dest string) (int64, error) {
	if DialectOf(path) != SQLite {
		return 0, errors.New("sqlstore: Backup copies the embedded SQLite store; back PostgreSQL up with pg_dump")
	}
	src, err := filepath.Abs(path)
	if err != nil {
		return 0, err
	}
	// Opening a missing database would create an empty one.
	if _, err := os.Stat(src); err != nil {
		return 0, fmt.Errorf("database: %w", err)
	}
	out, err := filepath.Abs(dest)
	if err != nil {
		return 0, err
	}
	if _, err := os.Lstat(out); err == nil {
		return 0, fmt.Errorf("%s: %w", dest, ErrBackupExists)
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial-*")
	if err != nil {
		return 0, err
	}
	tmpName := tmp.Name()
	tmp.Close()
	// Once linked to dest, the temporary name goes too.
	defer os.Remove(tmpName)

	// mode=rw: never create; busy_timeout: wait for the brief locks a
	// reader takes on the WAL index while the server checkpoints.
	q := url.Values{}
	q.Set("mode", "rw")
	q.Add("_pragma", "busy_timeout(10000)")
	db, err := sql.Open("sqlite", "file:"+src+"?"+q.Encode())
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	// VACUUM INTO wants a missing or empty file: the temporary one is empty.
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, tmpName); err != nil {
		return 0, fmt.Errorf("copy %s: %w", path, err)
	}
	if err := quickCheck(ctx, tmpName); err != nil {
		return 0, err
	}
	if err := syncFile(tmpName); err != nil {
		return 0, err
	}
	// Link rather than rename, so that a file created at dest meanwhile is
	// not replaced; rename where the file system has no links.
	if err := os.Link(tmpName, out); errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("%s: %w", dest, ErrBackupExists)
	} else if err != nil {
		if err := os.Rename(tmpName, out); err != nil {
			return 0, err
		}
	}
	if err := syncFile(filepath.Dir(out)); err != nil {
		return 0, err
	}
	st, err := os.Stat(out)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// quickCheck runs PRAGMA quick_check on the SQLite file at path.
func quickCheck(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=rw")
	if err != nil {
		return err
	}
	defer db.Close()
	var res string
	if err := db.QueryRowContext(ctx, `PRAGMA quick_check`).Scan(&res); err != nil {
		return fmt.Errorf("check the copy: %w", err)
	}
	if res != "ok" {
		return fmt.Errorf("check the copy: %s", res)
	}
	return nil
}

// syncFile flushes a file, or a directory's entries, to the disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
