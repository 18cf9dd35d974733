package bots

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// TestAuditWriterWaitsRatherThanDrops: executions that come faster than the
// writer commits their events wait for room in the queue; every event is
// written. (The writer used to drop an event that found the queue full: a
// fifth of them under 8 connections of the C echo bot.)
func TestAuditWriterWaitsRatherThanDrops(t *testing.T) {
	for _, be := range storetest.Backends(t) {
		t.Run(be.Name, func(t *testing.T) {
			ctx := context.Background()
			st, err := sqlstore.Open(ctx, be.NewURL(t), sqlstore.Options{Migrate: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			m := newMetrics(prometheus.NewRegistry())
			// A queue of one: nearly every event finds it full.
			a := newAuditWriter(st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), m, 1)
			const writers, each = 8, 40
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						now := time.Now().UTC()
						a.add(auditEntry{project: "p1", bot: "Bot/b" + strconv.Itoa(w), requester: "ClientApplication/c", outcome: "0",
							desc: strconv.Itoa(i), start: now, end: now})
					}
				}()
			}
			wg.Wait()
			a.close()
			if d := testutil.ToFloat64(m.auditDropped); d != 0 {
				t.Fatalf("%v events dropped", d)
			}
			if testutil.ToFloat64(m.auditWaits) == 0 {
				t.Fatal("no execution waited for room: the test did not fill the queue")
			}
			got, err := store.SearchResources(ctx, st, store.ProjectScope("p1"), "AuditEvent", "_count=1000")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != writers*each {
				t.Fatalf("%d AuditEvents written, want %d", len(got), writers*each)
			}
		})
	}
}
