package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

const (
	backupAdminID     = "backup-admin"
	backupAdminSecret = "backup-admin-secret-0123456789"
)

// serveProcess starts this test binary as `sandbot serve` on the SQLite
// store in dataDir, a process of its own as in production, and returns its
// API base URL once /readyz answers.
func serveProcess(t *testing.T, dataDir string) (api string, kill func()) {
	t.Helper()
	addr, ops := servertest.FreeAddr(t), servertest.FreeAddr(t)
	cmd := exec.Command(os.Args[0], "serve", "-addr", addr, "-metrics-addr", ops, "-base-url", "http://"+addr+"/",
		"-data-dir", dataDir, "-log-level", "warn")
	cmd.Env = []string{"SANDBOT_TEST_SERVE=1", "PATH=" + os.Getenv("PATH"),
		"SANDBOT_ADMIN_CLIENT_ID=" + backupAdminID, "SANDBOT_ADMIN_CLIENT_SECRET=" + backupAdminSecret}
	out := &servertest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	t.Cleanup(kill)
	waitFor(t, "the server in "+dataDir, func() bool {
		resp, err := http.Get("http://" + ops + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return "http://" + addr + "/", kill
}

// TestBackupUnderWriteLoad is issue 24's test of `sandbot backup`: while
// four clients keep creating Patients through a running server, the backup
// command, another process, copies the store; the copy, put alone in a
// fresh data directory, is served by a new server that has every Patient
// acknowledged (201) before the backup began, and answers reads, writes and
// searches as usual.
func TestBackupUnderWriteLoad(t *testing.T) {
	dataDir := t.TempDir()
	api, kill := serveProcess(t, dataDir)
	client := servertest.NewClient(t, api, servertest.ClientToken(t, api, backupAdminID, backupAdminSecret))

	var mu sync.Mutex
	var acked []string
	var failure string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"resourceType":"Patient","name":[{"family":"Backup","given":["w%d-%d"]}]}`, w, i)
				status, id, err := postPatient(api, client.Token, body)
				mu.Lock()
				if err != nil || status != 201 {
					failure = fmt.Sprintf("a create answered %d, %v", status, err)
					mu.Unlock()
					return
				}
				acked = append(acked, id)
				mu.Unlock()
			}
		}()
	}
	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	failed := func() bool { mu.Lock(); defer mu.Unlock(); return failure != "" }
	waitFor(t, "the first writes", func() bool { return ackedCount() >= 300 || failed() })

	mu.Lock()
	before := append([]string(nil), acked...)
	mu.Unlock()
	dest := filepath.Join(t.TempDir(), "sandbot-backup.db")
	cmd := exec.Command(os.Args[0], "backup", "-data-dir", dataDir, dest)
	cmd.Env = []string{"SANDBOT_TEST_SERVE=1", "PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	afterBackup := ackedCount()
	if err != nil {
		t.Fatalf("sandbot backup: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "backed up") {
		t.Errorf("backup output %q", out)
	}
	// The server keeps taking writes once the copy is done.
	waitFor(t, "writes after the backup", func() bool { return ackedCount() >= afterBackup+50 || failed() })
	close(stop)
	wg.Wait()
	if failure != "" {
		t.Fatal(failure)
	}
	t.Logf("%s; %d Patients acknowledged before the backup began, %d while it ran, %d in all",
		strings.TrimSpace(string(out)), len(before), afterBackup-len(before), len(acked))
	kill()

	// Restore: the copy alone in a fresh data directory (no -wal, -shm or
	// -versions beside it).
	restoredDir := t.TempDir()
	copyFile(t, dest, filepath.Join(restoredDir, "sandbot.db"))
	api2, _ := serveProcess(t, restoredDir)
	restored := servertest.NewClient(t, api2, servertest.ClientToken(t, api2, backupAdminID, backupAdminSecret))
	missing := 0
	for _, id := range before {
		if r := restored.Do("GET", "fhir/R4/Patient/"+id, nil, ""); r.Status != 200 {
			missing++
			if missing <= 5 {
				t.Errorf("Patient/%s, acknowledged before the backup began: %d %s", id, r.Status, r.Body)
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d Patients acknowledged before the backup are not in it", missing, len(before))
	}
	created := restored.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "AfterRestore"}}})
	if r := restored.Do("GET", "fhir/R4/Patient/"+created["id"].(string), nil, ""); r.Status != 200 {
		t.Errorf("read of a Patient created after the restore: %d %s", r.Status, r.Body)
	}
	r := restored.Do("GET", "fhir/R4/Patient?family=Backup&_summary=count", nil, "")
	var bundle struct{ Total int }
	if r.Status != 200 || json.Unmarshal(r.Body, &bundle) != nil {
		t.Fatalf("count search: %d %s", r.Status, r.Body)
	}
	if bundle.Total < len(before) || bundle.Total > len(acked) {
		t.Errorf("restored store counts %d Patients; between %d and %d were acknowledged", bundle.Total, len(before), len(acked))
	}
}

func postPatient(api, token, body string) (int, string, error) {
	req, err := http.NewRequest("POST", api+"fhir/R4/Patient", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/fhir+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var res struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return resp.StatusCode, "", err
	}
	return resp.StatusCode, res.ID, nil
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBackupCommand checks what `sandbot backup` refuses: PostgreSQL (with
// the pg_dump commands), a missing FILE, a store that does not exist, and a
// FILE that exists.
func TestBackupCommand(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	runBackup := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"backup"}, args...), nil, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	if code, _, errOut := runBackup("-database-url", "postgres://u@127.0.0.1/db", filepath.Join(dir, "x.db")); code != 2 || !strings.Contains(errOut, "pg_dump") || !strings.Contains(errOut, "pg_restore") {
		t.Errorf("PostgreSQL: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runBackup("-data-dir", dir); code != 2 || !strings.Contains(errOut, "Usage: sandbot backup") {
		t.Errorf("no FILE: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runBackup("-data-dir", filepath.Join(dir, "nothing"), filepath.Join(dir, "x.db")); code != 1 || !strings.Contains(errOut, "sandbot backup:") {
		t.Errorf("no store: exit %d, stderr %q", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "nothing")); err == nil {
		t.Error("a backup of a missing store created its directory")
	}
	if code := run(context.Background(), []string{"migrate", "-data-dir", dir}, nil, io.Discard, io.Discard); code != 0 {
		t.Fatalf("migrate: %d", code)
	}
	code, out, errOut := runBackup("-data-dir", dir, filepath.Join(dir, "copy.db"))
	if code != 0 || !strings.Contains(out, "backed up") {
		t.Fatalf("backup: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := runBackup("-data-dir", dir, filepath.Join(dir, "copy.db")); code != 1 || !strings.Contains(errOut, "already exists") {
		t.Errorf("existing FILE: exit %d, stderr %q", code, errOut)
	}
}

// TestPgDumpRestore follows the README's PostgreSQL backup: pg_dump of a
// database a server is writing to, pg_restore into an empty database, and a
// server on the restored one that has what was written and takes writes.
func TestPgDumpRestore(t *testing.T) {
	var pg *storetest.Backend
	for _, b := range storetest.Backends(t) {
		if b.Name == "postgres" {
			pg = &b
		}
	}
	if pg == nil {
		t.Skip("no PostgreSQL")
	}
	dump, err := exec.LookPath("pg_dump")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("pg_dump is required in CI (Debian: postgresql-client)")
		}
		t.Skip("no pg_dump")
	}
	restore, err := exec.LookPath("pg_restore")
	if err != nil {
		t.Fatal("pg_dump without pg_restore")
	}
	srcURL := pg.NewURL(t)
	src := servertest.StartURL(t, "postgres", srcURL)
	admin := src.SuperAdmin(t)
	var ids []string
	for i := range 20 {
		p := admin.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": fmt.Sprint("Dump", i)}}})
		ids = append(ids, p["id"].(string))
	}
	file := filepath.Join(t.TempDir(), "sandbot.dump")
	if out, err := exec.Command(dump, "--format=custom", "--file="+file, srcURL).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}
	dstURL := pg.NewURL(t)
	if out, err := exec.Command(restore, "--no-owner", "--dbname="+dstURL, file).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}
	dst := servertest.StartURL(t, "postgres", dstURL)
	c := dst.SuperAdmin(t)
	for _, id := range ids {
		if r := c.Do("GET", "fhir/R4/Patient/"+id, nil, ""); r.Status != 200 {
			t.Fatalf("Patient/%s after pg_restore: %d %s", id, r.Status, r.Body)
		}
	}
	c.Create(map[string]any{"resourceType": "Patient"})
	if r := c.Do("GET", "fhir/R4/Patient?_summary=count", nil, ""); r.Status != 200 || !strings.Contains(string(r.Body), `"total":21`) {
		t.Errorf("count after restore: %d %s", r.Status, r.Body)
	}
}
