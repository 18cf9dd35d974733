package bots

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
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
			st := openTestStore(t, be)
			m := newMetrics(prometheus.NewRegistry())
			// A queue of one: nearly every event finds it full.
			a := newAuditWriter(st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), m, 1, nil)
			const writers, each = 8, 40
			addEntries(writers, each, a.add)
			a.close()
			if d := testutil.ToFloat64(m.auditDropped); d != 0 {
				t.Fatalf("%v events dropped", d)
			}
			if testutil.ToFloat64(m.auditWaits) == 0 {
				t.Fatal("no execution waited for room: the test did not fill the queue")
			}
			if got := auditEvents(t, st, "p1"); len(got) != writers*each {
				t.Fatalf("%d AuditEvents written, want %d", len(got), writers*each)
			}
		})
	}
}

func openTestStore(t *testing.T, be storetest.Backend) *sqlstore.Store {
	t.Helper()
	return openTestStoreURL(t, be.NewURL(t))
}

func openTestStoreURL(t *testing.T, url string) *sqlstore.Store {
	t.Helper()
	st, err := sqlstore.Open(context.Background(), url, sqlstore.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func auditEvents(t *testing.T, st store.Store, project string) map[string]bool {
	t.Helper()
	got, err := store.SearchResources(context.Background(), st, store.ProjectScope(project), "AuditEvent", "_count=1000")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, r := range got {
		ids[r.ID()] = true
	}
	return ids
}

// TestAuditJournal: with a journal, add returns once the event is on disk
// in it; the writer stores every event under the id chosen then, and the
// journal is removed when the writer stops with everything stored.
func TestAuditJournal(t *testing.T) {
	for _, be := range storetest.Backends(t) {
		t.Run(be.Name, func(t *testing.T) {
			st := openTestStore(t, be)
			dir := t.TempDir()
			a, _ := journaledWriter(t, st, dir)
			addEntries(4, 25, a.add)
			if n := a.journal.written.Load(); n != 100 {
				t.Fatalf("%d entries journaled, want 100", n)
			}
			a.close()
			if got := auditEvents(t, st, "p1"); len(got) != 100 {
				t.Fatalf("%d AuditEvents stored, want 100", len(got))
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*.journal")); len(left) != 0 {
				t.Fatalf("journal left behind after a clean stop: %v", left)
			}
		})
	}
}

// TestAuditJournalRecovery: the journal of a process that died is stored at
// the next start, each event once (one was stored before the death, and a
// last append the death cut short, with zeros where its first block should
// be, was never acknowledged and is not damage); a journal a live process
// holds is left alone.
func TestAuditJournalRecovery(t *testing.T) {
	for _, be := range storetest.Backends(t) {
		t.Run(be.Name, func(t *testing.T) {
			ctx := context.Background()
			st := openTestStore(t, be)
			dir := t.TempDir()
			now := time.Now().UTC().Truncate(time.Millisecond)
			ids := []string{"0193a2b4-0000-7000-8000-000000000001", "0193a2b4-0000-7000-8000-000000000002", "0193a2b4-0000-7000-8000-000000000003"}
			var lines []byte
			for _, id := range ids {
				e := auditEntry{id: id, project: "p1", bot: "Bot/b", requester: "ClientApplication/c", outcome: "0", start: now, end: now}
				line, err := json.Marshal(recordOf(&e))
				if err != nil {
					t.Fatal(err)
				}
				lines = append(append(lines, line...), '\n')
			}
			// The last append was being written when the process died: of
			// its two blocks only the second had reached the file, which
			// is filled with zeros ahead (createSegment).
			lines = append(lines, `{"id":"0193a2b4-0000-7000-8000-000000000004","proj`...)
			lines = append(lines, make([]byte, 4096)...)
			lines = append(lines, `ect":"p1","bot":"Bot/b","requester":"ClientApplication/c","outcome":"0"}`+"\n"...)
			lines = append(lines, make([]byte, 64<<10)...)
			dead := filepath.Join(dir, "audit-dead.journal")
			if err := os.WriteFile(dead, lines, 0o600); err != nil {
				t.Fatal(err)
			}
			// The first event had been stored before the process died.
			first := auditEntry{id: ids[0], project: "p1", bot: "Bot/b", requester: "ClientApplication/c", outcome: "0", start: now, end: now}
			if err := storeAuditBatch(ctx, st, []auditEntry{first}); err != nil {
				t.Fatal(err)
			}
			// A live process's journal (its lock is held).
			live, err := openAuditJournal(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer live.close()

			n, err := recoverAuditJournals(ctx, dir, st)
			if err != nil {
				t.Fatal(err)
			}
			if n != 2 {
				t.Fatalf("recovered %d events, want 2", n)
			}
			got := auditEvents(t, st, "p1")
			if len(got) != 3 || !got[ids[0]] || !got[ids[1]] || !got[ids[2]] {
				t.Fatalf("stored %v, want %v", got, ids)
			}
			if _, err := os.Stat(dead); !os.IsNotExist(err) {
				t.Fatalf("the dead process's journal is still there: %v", err)
			}
			if _, err := os.Stat(live.segs[0].path); err != nil {
				t.Fatalf("the live process's journal was touched: %v", err)
			}
		})
	}
}

// TestAuditJournalDamaged: a journal with a line that cannot be read (a
// damaged disk) is stored as far as it can be read and kept aside, and the
// start goes on.
func TestAuditJournalDamaged(t *testing.T) {
	be := storetest.Backends(t)[0]
	ctx := context.Background()
	st := openTestStore(t, be)
	dir := t.TempDir()
	now := time.Now().UTC()
	e := auditEntry{id: "0193a2b4-0000-7000-8000-0000000000aa", project: "p1", bot: "Bot/b", requester: "ClientApplication/c", outcome: "0", start: now, end: now}
	good, err := json.Marshal(recordOf(&e))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "audit-damaged.journal")
	if err := os.WriteFile(path, append([]byte("garbage\n"), append(good, '\n')...), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := recoverAuditJournals(ctx, dir, st)
	var bad *unreadableJournal
	if !errors.As(err, &bad) || bad.lines != 1 {
		t.Fatalf("got %v, want one unreadable line reported", err)
	}
	if got := auditEvents(t, st, "p1"); n != 1 || !got[e.id] {
		t.Fatalf("recovered %d, stored %v", n, got)
	}
	if _, err := os.Stat(path + ".unreadable"); err != nil {
		t.Fatalf("the damaged journal was not kept aside: %v", err)
	}
}

// TestAuditJournalSetsAsideWhatTheStoreRefused: events the database refused
// are kept in a journal file of their own, which the next start stores,
// while the process's own journal is emptied and removed as usual (it does
// not grow for the rest of the process's life).
func TestAuditJournalSetsAsideWhatTheStoreRefused(t *testing.T) {
	be := storetest.Backends(t)[0]
	ctx := context.Background()
	url := be.NewURL(t)
	st, err := sqlstore.Open(ctx, url, sqlstore.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	st.Close() // every write fails from here on
	dir := t.TempDir()
	a, m := journaledWriter(t, st, dir)
	own := a.journal.segs[0].path
	for i := range 3 {
		now := time.Now().UTC()
		a.add(auditEntry{project: "p1", bot: "Bot/b", requester: "ClientApplication/c", outcome: "0", desc: strconv.Itoa(i), start: now, end: now})
	}
	a.close()
	if d := testutil.ToFloat64(m.auditDropped); d != 3 {
		t.Fatalf("%v events counted as not written, want 3", d)
	}
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Fatalf("the process's journal was kept: %v", err)
	}
	aside, _ := filepath.Glob(filepath.Join(dir, "audit-*.journal"))
	if len(aside) == 0 {
		t.Fatal("nothing set aside")
	}

	again := openTestStoreURL(t, url)
	if n, err := recoverAuditJournals(ctx, dir, again); err != nil || n != 3 {
		t.Fatalf("recovered %d, %v; want 3", n, err)
	}
	if got := auditEvents(t, again, "p1"); len(got) != 3 {
		t.Fatalf("%d AuditEvents stored at the next start, want 3", len(got))
	}
}

// journaledWriter is an audit writer of st (a queue of 4) whose events
// go through a journal in dir, as with Config.AuditJournalDir.
func journaledWriter(t *testing.T, st store.Store, dir string) (*auditWriter, *metrics) {
	t.Helper()
	m := newMetrics(prometheus.NewRegistry())
	j, err := openAuditJournal(dir, m)
	if err != nil {
		t.Fatal(err)
	}
	return newAuditWriter(st, nil, slog.New(slog.DiscardHandler), m, 4, j), m
}

// TestAuditJournalAbsorbsABurst: executions do not wait for the writer
// while the journal has room: every add returns with nothing stored yet
// (the old journal handed its events to a queue of 4,096 in memory and
// held executions once it was full), the journal moves on to new segment
// files as it grows, and the writer, once it runs, stores every event and
// removes every segment.
func TestAuditJournalAbsorbsABurst(t *testing.T) {
	st, dir, m, j := sizedJournal(t, 8<<10, 1<<20)
	const writers, each = 4, 150
	addEntries(writers, each, journalAdd(t, j))
	if n := j.written.Load(); n != writers*each {
		t.Fatalf("%d entries journaled, want %d", n, writers*each)
	}
	if _, n := j.pending(); n != writers*each {
		t.Fatalf("backlog of %d, want %d", n, writers*each)
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "*.journal")); len(segs) < 5 {
		t.Fatalf("%d segment files for %d entries of about 250 bytes in segments of 8 KiB", len(segs), writers*each)
	}
	if w := testutil.ToFloat64(m.auditWaits); w != 0 {
		t.Fatalf("%v executions waited with room in the journal", w)
	}
	a := newAuditWriter(st, nil, slog.New(slog.DiscardHandler), m, auditQueue, j)
	a.close()
	if got := auditEvents(t, st, "p1"); len(got) != writers*each {
		t.Fatalf("%d AuditEvents stored, want %d", len(got), writers*each)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.journal")); len(left) != 0 {
		t.Fatalf("segments left behind after a clean stop: %v", left)
	}
}

// TestAuditJournalHoldsExecutionsWhenFull: past its byte limit the journal
// holds executions until the writer has stored some of the backlog; none is
// lost.
func TestAuditJournalHoldsExecutionsWhenFull(t *testing.T) {
	st, _, m, j := sizedJournal(t, 1<<10, 2<<10)
	added := make(chan struct{})
	go func() {
		defer close(added)
		addEntries(1, 40, journalAdd(t, j))
	}()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(m.auditWaits) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no execution waited; %d journaled", j.written.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := j.written.Load(); n >= 40 {
		t.Fatalf("all %d entries journaled past a limit of 2 KiB", n)
	}
	a := newAuditWriter(st, nil, slog.New(slog.DiscardHandler), m, auditQueue, j)
	<-added
	a.close()
	if got := auditEvents(t, st, "p1"); len(got) != 40 {
		t.Fatalf("%d AuditEvents stored, want 40", len(got))
	}
}

// sizedJournal opens a store, and a journal in a new directory with
// segments of segmentBytes and a limit of maxBytes, counting into m.
func sizedJournal(t *testing.T, segmentBytes, maxBytes int64) (st store.Store, dir string, m *metrics, j *auditJournal) {
	t.Helper()
	st = openTestStore(t, storetest.Backends(t)[0])
	dir = t.TempDir()
	m = newMetrics(prometheus.NewRegistry())
	j, err := openAuditJournalSized(dir, m, segmentBytes, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return st, dir, m, j
}

// addEntries adds writers×each entries of project p1 with add, from writers
// goroutines.
func addEntries(writers, each int, add func(auditEntry)) {
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				now := time.Now().UTC()
				add(auditEntry{project: "p1", bot: "Bot/b" + strconv.Itoa(w), requester: "ClientApplication/c", outcome: "0",
					desc: strconv.Itoa(i), start: now, end: now})
			}
		}()
	}
	wg.Wait()
}

// journalAdd adds e to j under a new id, as auditWriter.add does.
func journalAdd(t *testing.T, j *auditJournal) func(auditEntry) {
	return func(e auditEntry) {
		e.id = uuid.Must(uuid.NewV7()).String()
		if err := j.add(e); err != nil {
			t.Error(err)
		}
	}
}

// TestWriterPause: the writer pauses only while executions arrive, three
// times its batch's time when it is up to date, less as it falls behind,
// not at all once it is auditPaceLag behind, and never longer than
// auditMaxPause.
func TestWriterPause(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		took, lag time.Duration
		arriving  bool
		want      time.Duration
	}{
		{10 * ms, 0, false, 0},
		{10 * ms, 0, true, 30 * ms},
		{10 * ms, -ms, true, 30 * ms}, // a clock step
		{10 * ms, auditPaceLag / 2, true, 15 * ms},
		{10 * ms, auditPaceLag, true, 0},
		{10 * ms, 2 * auditPaceLag, true, 0},
		{time.Second, 0, true, auditMaxPause},
	} {
		if got := writerPause(c.took, c.lag, c.arriving); got != c.want {
			t.Errorf("writerPause(%v, %v, %v) = %v, want %v", c.took, c.lag, c.arriving, got, c.want)
		}
	}
}

// TestAuditJournalKeptSegmentsAreRead: once events the store refused could
// not be set aside (keep), the writer still moves on through the segments
// (it used to stop at the first, forever) and every segment stays on disk
// for the next start.
func TestAuditJournalKeptSegmentsAreRead(t *testing.T) {
	st, dir, m, j := sizedJournal(t, 1<<10, 1<<20)
	j.keep = true
	addEntries(2, 20, journalAdd(t, j))
	// (Not a glob: the directory also holds the spare segment, filled
	// ahead, which close removes.)
	j.mu.Lock()
	segs := len(j.segs)
	j.mu.Unlock()
	if segs < 3 {
		t.Fatalf("%d segments, want several", segs)
	}
	a := newAuditWriter(st, nil, slog.New(slog.DiscardHandler), m, auditQueue, j)
	a.close()
	if got := auditEvents(t, st, "p1"); len(got) != 40 {
		t.Fatalf("%d AuditEvents stored, want 40", len(got))
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.journal")); len(left) != segs {
		t.Fatalf("%d of %d segments kept", len(left), segs)
	}
}

// TestAuditJournalSegmentsAreFilledAhead: a segment is filled with zeros
// before it is appended to (a sync then writes only data), and the next
// one is ready before the appender needs it.
func TestAuditJournalSegmentsAreFilledAhead(t *testing.T) {
	_, dir, _, j := sizedJournal(t, 1<<12, 1<<20)
	defer j.close()
	if fi, err := os.Stat(j.segs[0].path); err != nil || fi.Size() != 1<<12 {
		t.Fatalf("first segment: %v, %v; want %d bytes", fi, err, 1<<12)
	}
	add := journalAdd(t, j)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if files, _ := filepath.Glob(filepath.Join(dir, "*.journal")); len(files) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	spare, _ := filepath.Glob(filepath.Join(dir, "*.journal"))
	addEntries(1, 30, add) // about 9 KiB: the next segments
	j.mu.Lock()
	segs := slices.Clone(j.segs)
	j.mu.Unlock()
	if len(segs) < 2 || !slices.Contains(spare, segs[1].path) {
		t.Fatalf("segments %d, the second not the spare filled ahead (%v)", len(segs), spare)
	}
	for _, seg := range segs {
		fi, err := os.Stat(seg.path)
		if err != nil || fi.Size() != 1<<12 || seg.size > 1<<12 {
			t.Fatalf("segment %s: %v, %v; want %d bytes, of which %d written", seg.path, fi, err, 1<<12, seg.size)
		}
	}
}

// TestAuditJournalMovesPastAFailedSegment: once a segment's write or sync
// failed, the executions of that batch are told (their events are then
// stored at once) and the next batch goes to a new segment, which the
// writer stores.
func TestAuditJournalMovesPastAFailedSegment(t *testing.T) {
	st, _, m, j := sizedJournal(t, 1<<20, 1<<20)
	first := j.segs[0]
	first.f.Close() // the disk refuses it from now on
	now := time.Now().UTC()
	e := auditEntry{id: uuid.Must(uuid.NewV7()).String(), project: "p1", bot: "Bot/b", requester: "ClientApplication/c", outcome: "0", start: now, end: now}
	if err := j.add(e); err == nil {
		t.Fatal("an append to a segment the disk refuses succeeded")
	}
	e.id = uuid.Must(uuid.NewV7()).String()
	if err := j.add(e); err != nil {
		t.Fatalf("the next append: %v", err)
	}
	j.mu.Lock()
	last := j.segs[len(j.segs)-1]
	j.mu.Unlock()
	if !first.failed || last == first || last.size == 0 {
		t.Fatalf("first failed %v; the next append not in a new segment (%d bytes)", first.failed, last.size)
	}
	a := newAuditWriter(st, nil, slog.New(slog.DiscardHandler), m, auditQueue, j)
	a.close()
	if got := auditEvents(t, st, "p1"); len(got) != 1 || !got[e.id] {
		t.Fatalf("stored %v, want only %s", got, e.id)
	}
	for _, seg := range []*journalSegment{first, last} {
		if _, err := os.Stat(seg.path); !os.IsNotExist(err) {
			t.Fatalf("segment %s left after everything was stored: %v", seg.path, err)
		}
	}
}

// TestAuditWriterRecoversInTheBackground: a journal a dead process left in
// the directory is stored by the new writer, while the new process journals
// its own events from the start (recovery used to hold the start, a minute
// for every 300,000 events); each event is stored once.
func TestAuditWriterRecoversInTheBackground(t *testing.T) {
	be := storetest.Backends(t)[0]
	st := openTestStore(t, be)
	dir := t.TempDir()
	var lines []byte
	now := time.Now().UTC()
	for i := range 50 {
		e := auditEntry{id: uuid.Must(uuid.NewV7()).String(), project: "p1", bot: "Bot/dead", requester: "ClientApplication/c",
			outcome: "0", desc: strconv.Itoa(i), start: now, end: now}
		lines = appendRecord(lines, &e)
	}
	dead := filepath.Join(dir, "audit-dead.journal")
	if err := os.WriteFile(dead, lines, 0o600); err != nil {
		t.Fatal(err)
	}
	a, _ := journaledWriter(t, st, dir)
	addEntries(2, 10, a.add)
	var got map[string]bool
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = auditEvents(t, st, "p1"); len(got) >= 70 {
			break
		}
	}
	a.close()
	if len(got) != 70 {
		t.Fatalf("%d AuditEvents stored, want 70 (50 recovered, 20 new)", len(got))
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Fatalf("the dead process's journal is still there: %v", err)
	}
}

// TestAuditJournalReadsLinesLongerThanItsChunk: take reads about a
// kilobyte a line it may return; a longer line (a bot's log of several
// KiB in outcomeDesc) is read whole all the same, in order.
func TestAuditJournalReadsLinesLongerThanItsChunk(t *testing.T) {
	_, _, _, j := sizedJournal(t, 1<<20, 1<<20)
	defer j.close()
	long := strings.Repeat("x", 5000)
	for i := range 3 {
		journalAdd(t, j)(auditEntry{project: "p1", bot: "Bot/b", requester: "ClientApplication/c", outcome: "0", desc: strconv.Itoa(i) + long})
	}
	for i := range 3 {
		batch, bad, err := j.take(1, time.Millisecond)
		if err != nil || bad != 0 || len(batch) != 1 || batch[0].desc != strconv.Itoa(i)+long {
			t.Fatalf("take %d: %d entries, %d bad, %v", i, len(batch), bad, err)
		}
		j.done()
	}
	if bytes, n := j.pending(); bytes != 0 || n != 0 {
		t.Fatalf("%d bytes and %d entries left", bytes, n)
	}
}
