package sqlstore

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/store"
)

// The change feed (store.Store.Subscribe) tells every process on a database
// which resources of store.ChangeTypes were updated or deleted, so that each
// drops what it derived from them.
//
// The truth is the changes table: a transaction that updates or deletes such
// a resource adds a row for it before it commits, numbered by change_seq,
// whose single row it locks until the commit, so the numbers follow commit
// order without gaps. Each process remembers the last number it delivered
// and reads the rows after it:
//   - on PostgreSQL when a notification arrives (the transaction also runs
//     pg_notify, which PostgreSQL delivers at commit to every session that
//     listens, on a connection of its own; a notification carrying the very
//     next number is delivered without reading the table), after the
//     listening connection comes back, and every poll interval in any case,
//     so a lost notification costs at most that much delay;
//   - on SQLite when the shared change counter beside the database (the
//     read cache's counter file) moved, checked every 10 ms, and every poll
//     interval in any case.
//
// The writing process also delivers its own changes right after the commit,
// before the write returns, so that its next request already sees them.

// changeChannel is the PostgreSQL notification channel.
const changeChannel = "sandbot_changes"

// Poll intervals and the retention of the changes table.
const (
	postgresChangePoll = time.Second
	sqliteChangePoll   = 250 * time.Millisecond
	sqliteCounterCheck = 10 * time.Millisecond
	changeRetention    = time.Hour
	changePruneEvery   = 10 * time.Minute
	changeBatch        = 1000
)

type changeFeed struct {
	store   *Store
	url     string
	poll    time.Duration
	log     *slog.Logger
	metrics feedMetrics
	// counter is SQLite's shared change counter (nil for PostgreSQL, or
	// when the counter file could not be mapped).
	counter *uint64

	mu      sync.Mutex
	subs    map[int]func([]store.Change)
	nextSub int
	stop    chan struct{}
	done    chan struct{}
	closed  bool
	// running: the loop delivers other processes' changes, so the hot
	// cache may be used (nothing would drop its rows otherwise).
	running atomic.Bool
	// delivered is the last sequence number whose changes the subscribers
	// have been handed (or the one the loop started from): what this
	// process has seen (ChangesDelivered).
	delivered atomic.Int64
	// applied is the last sequence number delivered from the table; only
	// the loop goroutine touches it once started.
	applied int64
	// failing is set while reading the table fails, to log once per outage.
	failing bool
}

// feedMetrics say how changes arrive: a replica that hears of other
// replicas' changes only by reading the table has lost its notifications.
type feedMetrics struct {
	delivered *prometheus.CounterVec
	listening prometheus.Gauge
}

func newFeedMetrics(reg prometheus.Registerer) feedMetrics {
	m := feedMetrics{
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_store_changes_delivered_total",
			Help: "Changes of cached resource types delivered to this process's caches, by how they arrived: commit (made here), notification (PostgreSQL NOTIFY), read (from the changes table: a missed notification, a reconnection, the poll, or SQLite).",
		}, []string{"how"}),
		listening: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_store_change_notifications_connected",
			Help: "1 while the PostgreSQL connection that listens for change notifications is up (0 on SQLite, or while it reconnects: changes then arrive by the poll).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.delivered, m.listening)
	}
	return m
}

// ChangesDelivered is the last change of another process (or of this one,
// read back from the changes table) that this process's subscribers have
// been handed, or the position its change feed started from: every change
// up to it has been seen here. 0 before the feed starts.
func (s *Store) ChangesDelivered() int64 { return s.feed.delivered.Load() }

// Subscribe implements store.Store.
func (s *Store) Subscribe(fn func([]store.Change)) (stop func()) { return s.feed.subscribe(fn) }

func (f *changeFeed) subscribe(fn func([]store.Change)) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.subs == nil {
		f.subs = map[int]func([]store.Change){}
	}
	id := f.nextSub
	f.nextSub++
	f.subs[id] = fn
	if f.stop == nil && !f.closed {
		f.start()
	}
	return func() {
		f.mu.Lock()
		delete(f.subs, id)
		f.mu.Unlock()
	}
}

// start begins the loop from the current sequence number: what changed
// before the first subscription concerns nobody.
func (f *changeFeed) start() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sqlx.GetContext(ctx, f.store.db, &f.applied, `SELECT seq FROM change_seq WHERE id = 1`); err != nil {
		// The loop reads from the beginning of what the table keeps; a
		// database down at start only delays the first delivery.
		f.log.Warn("change feed: current sequence unknown", "err", err)
		f.applied = -1
	}
	f.delivered.Store(max(f.applied, 0))
	f.stop, f.done = make(chan struct{}), make(chan struct{})
	if f.store.dialect == Postgres {
		go f.listenLoop(f.stop, f.done)
	} else {
		go f.counterLoop(f.stop, f.done)
	}
	f.running.Store(true)
}

func (f *changeFeed) close() {
	f.mu.Lock()
	stop, done := f.stop, f.done
	f.stop, f.closed = nil, true
	f.running.Store(false)
	f.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

func (f *changeFeed) pollInterval(def time.Duration) time.Duration {
	if f.poll > 0 {
		return f.poll
	}
	return def
}

// listenLoop is PostgreSQL's: notifications on a dedicated connection
// (lib/pq's Listener reconnects by itself), the table on every gap.
func (f *changeFeed) listenLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	l := pq.NewListener(f.url, 50*time.Millisecond, 2*time.Second, func(ev pq.ListenerEventType, err error) {
		switch ev {
		case pq.ListenerEventConnected:
			f.metrics.listening.Set(1)
		case pq.ListenerEventDisconnected:
			f.metrics.listening.Set(0)
			f.log.Warn("change feed: notification connection lost; polling until it is back", "err", err)
		case pq.ListenerEventReconnected:
			f.metrics.listening.Set(1)
			f.log.Info("change feed: notification connection back")
		}
	})
	defer func() {
		l.Close()
		f.metrics.listening.Set(0)
	}()
	listening := make(chan error, 1)
	go func() { listening <- l.Listen(changeChannel) }()
	tick := time.NewTicker(f.pollInterval(postgresChangePoll))
	defer tick.Stop()
	prune := time.NewTicker(changePruneEvery)
	defer prune.Stop()
	f.fetch()
	for {
		select {
		case <-stop:
			return
		case err := <-listening:
			if err != nil {
				f.log.Warn("change feed: listen failed; polling only", "err", err)
			}
			f.fetch() // what committed before the LISTEN took effect
		case n := <-l.Notify:
			if n == nil { // reconnected: notifications may have been lost
				f.fetch()
				continue
			}
			if c, ok := parseChange(n.Extra); ok && f.applied >= 0 && c.Seq == f.applied+1 {
				f.applied = c.Seq
				f.deliver("notification", []store.Change{c})
				f.delivered.Store(f.applied)
				continue
			}
			f.fetch()
		case <-tick.C:
			f.fetch()
		case <-prune.C:
			f.prune()
		}
	}
}

// counterLoop is SQLite's: the shared counter says when to read the table,
// and the table is read every poll interval in any case.
func (f *changeFeed) counterLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	poll := time.NewTicker(f.pollInterval(sqliteChangePoll))
	defer poll.Stop()
	var check <-chan time.Time
	var seen uint64
	if f.counter != nil {
		t := time.NewTicker(sqliteCounterCheck)
		defer t.Stop()
		check = t.C
		seen = atomic.LoadUint64(f.counter)
	}
	prune := time.NewTicker(changePruneEvery)
	defer prune.Stop()
	f.fetch()
	for {
		select {
		case <-stop:
			return
		case <-check:
			if now := atomic.LoadUint64(f.counter); now != seen {
				seen = now
				f.fetch()
			}
		case <-poll.C:
			f.fetch()
		case <-prune.C:
			f.prune()
		}
	}
}

// fetch delivers the rows after the last one delivered.
func (f *changeFeed) fetch() {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var rows []struct {
			Seq          int64  `db:"seq"`
			ResourceType string `db:"resource_type"`
			ID           string `db:"resource_id"`
			Project      string `db:"project_id"`
		}
		err := sqlx.SelectContext(ctx, f.store.db, &rows, f.store.rebind(
			`SELECT seq, resource_type, resource_id, project_id FROM changes WHERE seq > ? ORDER BY seq LIMIT `+strconv.Itoa(changeBatch)), f.applied)
		cancel()
		if err != nil {
			if !f.failing {
				f.failing = true
				f.log.Warn("change feed: cannot read changes; retrying", "err", err)
			}
			return
		}
		if f.failing {
			f.failing = false
			f.log.Info("change feed: reading changes again")
		}
		if len(rows) == 0 {
			return
		}
		out := make([]store.Change, len(rows))
		for i, r := range rows {
			out[i] = store.Change{Seq: r.Seq, ResourceType: r.ResourceType, ID: r.ID, Project: r.Project}
		}
		if f.applied >= 0 && out[0].Seq != f.applied+1 {
			// Rows after the last delivered one were pruned (the process
			// was cut off for longer than changeRetention): anything may
			// have changed.
			out = append([]store.Change{{Seq: out[0].Seq - 1}}, out...)
		}
		f.applied = out[len(out)-1].Seq
		f.deliver("read", out)
		f.delivered.Store(f.applied)
		if len(rows) < changeBatch {
			return
		}
	}
}

func (f *changeFeed) prune() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cut := time.Now().Add(-changeRetention).UnixMicro()
	if _, err := f.store.db.ExecContext(ctx, f.store.rebind(`DELETE FROM changes WHERE committed_at < ?`), cut); err != nil {
		f.log.Warn("change feed: prune", "err", err)
	}
}

// deliver hands changes to the subscribers; how says how they arrived.
func (f *changeFeed) deliver(how string, changes []store.Change) {
	if len(changes) == 0 {
		return
	}
	f.metrics.delivered.WithLabelValues(how).Add(float64(len(changes)))
	// The store's own cache first: a subscriber told of a change (one
	// that records that this replica saw it) finds it dropped already.
	if f.store.hot != nil {
		f.store.hot.drop(changes)
	}
	f.mu.Lock()
	subs := make([]func([]store.Change), 0, len(f.subs))
	for _, fn := range f.subs {
		subs = append(subs, fn)
	}
	f.mu.Unlock()
	for _, fn := range subs {
		fn(changes)
	}
}

// committed runs after a commit that recorded changes: this process hears
// of them at once, and other SQLite processes are told to read the table.
func (f *changeFeed) committed(changes []store.Change) {
	if len(changes) == 0 {
		return
	}
	if f.counter != nil {
		atomic.AddUint64(f.counter, 1)
	}
	for i := range changes {
		changes[i].Local = true
	}
	f.deliver("commit", changes)
}

// recordChanges writes, in the transaction about to commit, a changes row
// (and on PostgreSQL a notification) for each touched resource of
// store.ChangeTypes, and returns them numbered.
func (s *Store) recordChanges(ctx context.Context, touched []store.Change) ([]store.Change, error) {
	var changes []store.Change
	seen := map[string]bool{}
	for _, c := range touched {
		if store.ChangeTypes[c.ResourceType] && !seen[c.ID] {
			seen[c.ID] = true
			changes = append(changes, c)
		}
	}
	if len(changes) == 0 {
		return nil, nil
	}
	// Last of all in the transaction: the row lock on change_seq is held
	// only from here to the commit, and it is the last lock taken, so it
	// cannot close a cycle of waits.
	var last int64
	if err := sqlx.GetContext(ctx, s.q, &last, s.rebind(`UPDATE change_seq SET seq = seq + ? WHERE id = 1 RETURNING seq`), len(changes)); err != nil {
		return nil, fmt.Errorf("change sequence: %w", err)
	}
	now := s.now().UnixMicro()
	args := make([]any, 0, 5*len(changes))
	for i := range changes {
		changes[i].Seq = last - int64(len(changes)-1-i)
		c := changes[i]
		args = append(args, c.Seq, c.ResourceType, c.ID, c.Project, now)
	}
	if err := s.insertRows(ctx, "changes", "seq, resource_type, resource_id, project_id, committed_at", 5, args); err != nil {
		return nil, err
	}
	if s.dialect == Postgres {
		for _, c := range changes {
			if _, err := s.q.ExecContext(ctx, `SELECT pg_notify($1, $2)`, changeChannel, formatChange(c)); err != nil {
				return nil, fmt.Errorf("notify: %w", err)
			}
		}
	}
	return changes, nil
}

// formatChange is a notification's payload: seq, type, id and project
// separated by spaces (none of them can contain one).
func formatChange(c store.Change) string {
	return strconv.FormatInt(c.Seq, 10) + " " + c.ResourceType + " " + c.ID + " " + c.Project
}

func parseChange(payload string) (store.Change, bool) {
	f := strings.Split(payload, " ")
	if len(f) != 4 {
		return store.Change{}, false
	}
	seq, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return store.Change{}, false
	}
	return store.Change{Seq: seq, ResourceType: f[1], ID: f[2], Project: f[3]}, true
}

// ForgetHit ends key's window that ends at ends (as CountHit answered
// it): the next CountHit of key is its first. A later window of key is
// kept, so that forgetting one sending of an HL7 message never forgets the
// next. (An HL7 message answered AE after it was counted as seen is sent
// again as a new one.)
func (s *Store) ForgetHit(ctx context.Context, key string, ends time.Time) error {
	_, err := s.q.ExecContext(ctx, s.rebind(`DELETE FROM rate_counts WHERE key = ? AND expires_at = ?`), key, ends.UnixMilli())
	return err
}

// CountHit implements store.Store: one upsert, so concurrent hits from any
// number of processes are all counted. Ended windows are deleted now and
// then.
func (s *Store) CountHit(ctx context.Context, key string, window time.Duration) (int64, time.Time, error) {
	hits, ends, _, err := s.CountHitValue(ctx, key, window)
	return hits, ends, err
}

// CountHitValue implements store.Store: CountHit's upsert, which empties
// the value when it begins a window.
func (s *Store) CountHitValue(ctx context.Context, key string, window time.Duration) (int64, time.Time, string, error) {
	now := s.now()
	start, ends := now.UnixMilli(), now.Add(window).UnixMilli()
	var out struct {
		Hits    int64  `db:"hits"`
		Expires int64  `db:"expires_at"`
		Value   string `db:"value"`
	}
	err := sqlx.GetContext(ctx, s.q, &out, s.rebind(`INSERT INTO rate_counts (key, window_start, hits, expires_at, value) VALUES (?, ?, 1, ?, '')
		ON CONFLICT (key) DO UPDATE SET
			hits = CASE WHEN rate_counts.expires_at <= excluded.window_start THEN 1 ELSE rate_counts.hits + 1 END,
			window_start = CASE WHEN rate_counts.expires_at <= excluded.window_start THEN excluded.window_start ELSE rate_counts.window_start END,
			expires_at = CASE WHEN rate_counts.expires_at <= excluded.window_start THEN excluded.expires_at ELSE rate_counts.expires_at END,
			value = CASE WHEN rate_counts.expires_at <= excluded.window_start THEN '' ELSE rate_counts.value END
		RETURNING hits, expires_at, value`), key, start, ends)
	if err != nil {
		return 0, time.Time{}, "", fmt.Errorf("count hit: %w", err)
	}
	if sec := now.Unix(); s.rateSwept.Load() < sec-60 {
		s.rateSwept.Store(sec)
		if _, err := s.q.ExecContext(ctx, s.rebind(`DELETE FROM rate_counts WHERE expires_at < ?`), start); err != nil {
			s.log.Warn("rate counts: prune", "err", err)
		}
	}
	return out.Hits, time.UnixMilli(out.Expires), out.Value, nil
}

// SetHitValue implements store.Store: one conditional update.
func (s *Store) SetHitValue(ctx context.Context, key, old, value string) (bool, error) {
	res, err := s.q.ExecContext(ctx, s.rebind(`UPDATE rate_counts SET value = ? WHERE key = ? AND value = ? AND expires_at > ?`),
		value, key, old, s.now().UnixMilli())
	if err != nil {
		return false, fmt.Errorf("set hit value: %w", err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}
