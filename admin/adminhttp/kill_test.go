package adminhttp_test

// A real crash in the middle of invites: the sandbot binary is started on a
// store, invites run concurrently, the process is killed with SIGKILL, a new
// process starts on the same store, and every User and profile made by an
// invite must belong to a membership (nothing half-made). Skipped with -short.

import (
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

type proc struct {
	cmd  *exec.Cmd
	base string
}

func startProc(t *testing.T, bin, dataDir, dbURL string) *proc {
	addr, ops := servertest.FreeAddr(t), servertest.FreeAddr(t)
	base := "http://" + addr + "/"
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "SANDBOT_ADDR="+addr, "SANDBOT_METRICS_ADDR="+ops, "SANDBOT_BASE_URL="+base,
		"SANDBOT_DATA_DIR="+dataDir, "SANDBOT_ADMIN_CLIENT_ID=kill-test-admin", "SANDBOT_ADMIN_CLIENT_SECRET=kill-test-admin-secret")
	if dbURL != "" {
		cmd.Env = append(cmd.Env, "SANDBOT_DATABASE_URL="+dbURL)
	}
	out := &servertest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "healthcheck")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return &proc{cmd: cmd, base: base}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start: %s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// all pages through a search as the super admin.
func all(t *testing.T, c *servertest.Client, path string) []map[string]any {
	var out []map[string]any
	next := path + "&_count=1000"
	for next != "" {
		r := c.Do("GET", next, nil, "")
		b := expect(t, r, 200, "search "+path)
		es, _ := b["entry"].([]any)
		for _, e := range es {
			out = append(out, e.(map[string]any)["resource"].(map[string]any))
		}
		next = ""
		links, _ := b["link"].([]any)
		for _, l := range links {
			if lm := l.(map[string]any); lm["relation"] == "next" {
				next = strings.TrimPrefix(lm["url"].(string), c.Base())
			}
		}
	}
	return out
}

func TestKillDuringInvites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "sandbot")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sandbot")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dataDir := t.TempDir()
			dbURL := ""
			if b.Name == "postgres" {
				dbURL = b.NewURL(t)
			}
			p := startProc(t, bin, dataDir, dbURL)
			su := servertest.NewClient(t, p.base, servertest.ClientToken(t, p.base, "kill-test-admin", "kill-test-admin-secret"))
			proj := expect(t, su.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "Kill"}, ""), 201, "project")
			pid := id(proj)

			ctx, cancel := context.WithCancel(context.Background())
			var ok, failed atomic.Int64
			var wg sync.WaitGroup
			hc := &http.Client{Timeout: 10 * time.Second}
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; ctx.Err() == nil; i++ {
						rt := []string{"Practitioner", "Patient"}[i%2]
						body, _ := json.Marshal(inviteBody(rt, "Kill", fmt.Sprint(i), fmt.Sprintf("w%d-%d@kill.test", w, i)))
						req, _ := http.NewRequest("POST", p.base+"admin/projects/"+pid+"/invite", strings.NewReader(string(body)))
						req.Header.Set("Authorization", "Bearer "+su.Token)
						req.Header.Set("Content-Type", "application/fhir+json")
						resp, err := hc.Do(req)
						if err != nil {
							failed.Add(1)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode == 200 {
							ok.Add(1)
						}
					}
				}(w)
			}
			time.Sleep(700 * time.Millisecond)
			p.cmd.Process.Kill() // SIGKILL: no drain, no rollback from the process
			p.cmd.Wait()
			cancel()
			wg.Wait()
			t.Logf("%d invites answered 200 before the kill; %d requests cut off", ok.Load(), failed.Load())
			if ok.Load() == 0 {
				t.Fatal("no invite finished before the kill: the test proves nothing")
			}

			p2 := startProc(t, bin, dataDir, dbURL)
			su2 := servertest.NewClient(t, p2.base, servertest.ClientToken(t, p2.base, "kill-test-admin", "kill-test-admin-secret"))
			members := all(t, su2, "fhir/R4/ProjectMembership?project=Project/"+pid)
			users, profiles := map[string]bool{}, map[string]bool{}
			for _, m := range members {
				users[ref(m, "user")] = true
				profiles[ref(m, "profile")] = true
			}
			if int64(len(members)) < ok.Load() {
				t.Fatalf("%d memberships after restart, %d invites were answered 200", len(members), ok.Load())
			}
			n := 0
			for _, u := range all(t, su2, "fhir/R4/User?_id:not=none") {
				if e, _ := u["email"].(string); strings.HasSuffix(e, "@kill.test") {
					n++
					if !users["User/"+id(u)] {
						t.Errorf("half-made invite: User %s (%s) has no membership", id(u), e)
					}
				}
			}
			for _, typ := range []string{"Practitioner", "Patient"} {
				for _, pr := range all(t, su2, "fhir/R4/"+typ+"?_project="+pid) {
					if !profiles[typ+"/"+id(pr)] {
						t.Errorf("half-made invite: %s/%s has no membership", typ, id(pr))
					}
				}
			}
			t.Logf("after restart: %d memberships, %d users, all complete", len(members), n)
		})
	}
}
