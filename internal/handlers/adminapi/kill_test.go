package adminapi_test

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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

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
	bin := servertest.BuildBinary(t)
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dataDir, dbURL := servertest.ProcessStore(t, b)
			p := servertest.StartProcess(t, bin, dataDir, dbURL)
			su := servertest.NewClient(t, p.Base, servertest.ClientToken(t, p.Base, servertest.AdminClientID, servertest.AdminClientSecret))
			proj := expect(t, su.Do("POST", "admin/Project", map[string]any{"resourceType": "Project", "name": "Kill"}, ""), 201, "project")
			pid := id(proj)

			ctx, cancel := context.WithCancel(context.Background())
			var ok, failed atomic.Int64
			var wg sync.WaitGroup
			// The kill ends every request in flight; the client's timeout is
			// only a backstop, long enough for a loaded machine.
			hc := &http.Client{Timeout: time.Minute}
			var workers atomic.Int32
			for w := 0; w < 8; w++ {
				wg.Add(1)
				workers.Add(1)
				go func(w int) {
					defer wg.Done()
					defer workers.Add(-1)
					for i := 0; ctx.Err() == nil; i++ {
						rt := []string{"Practitioner", "Patient"}[i%2]
						body, _ := json.Marshal(inviteBody(rt, "Kill", fmt.Sprint(i), fmt.Sprintf("w%d-%d@kill.test", w, i)))
						req, _ := http.NewRequest("POST", p.Base+"admin/projects/"+pid+"/invite", strings.NewReader(string(body)))
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
			// Kill after 700 ms and once some invites have finished, however
			// slow the machine, with the others in flight: the workers never
			// pause.
			start := time.Now()
			for (ok.Load() < 8 || time.Since(start) < 700*time.Millisecond) && workers.Load() > 0 {
				time.Sleep(5 * time.Millisecond)
			}
			p.Kill() // SIGKILL: no drain, no rollback from the process
			cancel()
			wg.Wait()
			t.Logf("%d invites answered 200 before the kill; %d requests cut off", ok.Load(), failed.Load())
			if ok.Load() == 0 {
				t.Fatal("no invite finished before the kill: the test proves nothing")
			}

			p2 := servertest.StartProcess(t, bin, dataDir, dbURL)
			su2 := servertest.NewClient(t, p2.Base, servertest.ClientToken(t, p2.Base, servertest.AdminClientID, servertest.AdminClientSecret))
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
