package bots

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/store"
)

// Timing of the replicas' presence (docs/decisions.md 56).
const (
	// replicaBeat is how often a replica records that it runs.
	replicaBeat = time.Second
	// replicaLive is how long after its last beat a replica is waited for:
	// one that stopped beating (killed, or frozen) holds a deploy at most
	// this long.
	replicaLive = 4 * time.Second
	// replicaForget is when a replica that stopped beating, and the modules
	// it held, are deleted.
	replicaForget = time.Hour
	// deployReadyWait bounds how long a deploy waits for the other live
	// replicas to hold its module; after it, the deploy answers anyway
	// (a replica still not ready loads the module on its first execution).
	deployReadyWait = 10 * time.Second
	// deployReadyPoll is how often a waiting deploy looks again.
	deployReadyPoll = 10 * time.Millisecond
	// cachedSeenWait bounds how long a write of a Bot or Project waits for
	// the other live replicas to have seen it (decision 58); a replica
	// whose change notifications are lost reads the changes table every
	// second, and so sees it within this.
	cachedSeenWait = 3 * time.Second
	// cachedSeenPoll is how often a waiting write looks again.
	cachedSeenPoll = 2 * time.Millisecond
)

// replicaPresence tells the other replicas on the database that this
// process runs and which deployed modules it holds, and lets a deploy wait
// until every live replica holds the module it deployed: a module deployed
// anywhere is then ready everywhere before its deployer's caller hears of
// it, and the first execution on any replica compiles and loads nothing.
type replicaPresence struct {
	st  store.Replicas
	id  string
	log *slog.Logger

	waited   prometheus.Histogram
	notReady prometheus.Counter
	// seenWaited and seenBehind are the waits of writes of store.CachedTypes
	// for the other replicas to see them, and the replicas that had not
	// when a wait gave up.
	seenWaited prometheus.Histogram
	seenBehind prometheus.Counter

	// seen is the last change of store.CachedTypes this replica's caches
	// have dropped; seenChanged tells run to record it.
	seen        atomic.Int64
	seenChanged chan struct{}
	// recorded is the last seen recorded (run's only).
	recorded int64
	// delivered is where the store's change feed stands (nil: unknown): a
	// replica that started after a change has seen it without being told.
	delivered func() int64

	stop  chan struct{}
	done  chan struct{}
	leave sync.Once
}

func newReplicaPresence(st store.Replicas, log *slog.Logger, reg prometheus.Registerer) *replicaPresence {
	var delivered func() int64
	if d, ok := st.(interface{ ChangesDelivered() int64 }); ok {
		delivered = d.ChangesDelivered
	}
	p := &replicaPresence{st: st, id: uuid.NewString(), log: log, stop: make(chan struct{}), done: make(chan struct{}),
		seenChanged: make(chan struct{}, 1), delivered: delivered,
		seenWaited: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_bot_cache_replica_wait_seconds",
			Help:    "Time a write of a Bot or Project waited, after its commit, for every other live replica to drop its cached copy.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 3},
		}),
		seenBehind: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_cache_replicas_behind_total",
			Help: "Replicas that had not dropped their cached copy of a Bot or Project when the write's wait for them gave up.",
		}),
		waited: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_bot_deploy_replica_wait_seconds",
			Help:    "Time a deploy waited, after its code was stored, for every other live replica to hold the module.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		notReady: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_deploy_replicas_not_ready_total",
			Help: "Replicas that did not hold a deployed module when its deploy stopped waiting for them (they load it on its first execution there).",
		}),
	}
	if reg != nil {
		reg.MustRegister(p.waited, p.notReady, p.seenWaited, p.seenBehind)
	}
	p.beat() // seen before the first deploy can wait for it
	go p.run()
	return p
}

func (p *replicaPresence) beat() {
	ctx, cancel := context.WithTimeout(context.Background(), replicaBeat)
	defer cancel()
	now := time.Now()
	if err := p.st.ReplicaAlive(ctx, p.id, now, now.Add(-replicaForget)); err != nil {
		p.log.Warn("replica presence: beat", "err", err)
	}
}

func (p *replicaPresence) run() {
	defer close(p.done)
	t := time.NewTicker(replicaBeat)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.beat()
			if p.delivered != nil {
				p.saw(p.delivered())
			}
		case <-p.seenChanged:
			p.recordSeen()
		}
	}
}

// saw notes that this replica's caches dropped the changes of
// store.CachedTypes up to seq; run records it for the writers that wait.
func (p *replicaPresence) saw(seq int64) {
	for {
		old := p.seen.Load()
		if seq <= old || p.seen.CompareAndSwap(old, seq) {
			break
		}
	}
	select {
	case p.seenChanged <- struct{}{}:
	default:
	}
}

func (p *replicaPresence) recordSeen() {
	ctx, cancel := context.WithTimeout(context.Background(), replicaBeat)
	defer cancel()
	seq := p.seen.Load()
	if seq <= p.recorded {
		return
	}
	if err := p.st.ReplicaSawChanges(ctx, p.id, seq); err != nil {
		p.log.Warn("replica presence: changes seen", "err", err)
		return
	}
	p.recorded = seq
}

// awaitSeen waits until every other live replica has seen the change seq
// (dropped its copy), or cachedSeenWait has passed. The write is committed
// already: a replica still behind is logged and counted.
func (p *replicaPresence) awaitSeen(seq int64) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), cachedSeenWait+replicaBeat)
	defer cancel()
	behind, err := pollReplicas(ctx, cachedSeenWait, cachedSeenPoll, func(ctx context.Context) ([]string, error) {
		return p.st.ReplicasBehind(ctx, p.id, seq, time.Now().Add(-replicaLive))
	})
	p.seenWaited.Observe(time.Since(start).Seconds())
	switch {
	case err != nil:
		p.log.Warn("replica presence: waiting for the replicas to see a change", "change", seq, "err", err)
	case len(behind) > 0:
		p.seenBehind.Add(float64(len(behind)))
		p.log.Warn("a write of a Bot or Project answered before every replica dropped its copy", "change", seq, "replicas", behind, "waited", time.Since(start))
	}
}

// pollReplicas asks pending for the replicas not yet where a wait wants
// them, every poll, until there are none, limit has passed or ctx ends, and
// answers those still pending then.
func pollReplicas(ctx context.Context, limit, poll time.Duration, pending func(context.Context) ([]string, error)) ([]string, error) {
	deadline := time.Now().Add(limit)
	for {
		left, err := pending(ctx)
		if err != nil || len(left) == 0 || !time.Now().Before(deadline) {
			return left, err
		}
		select {
		case <-ctx.Done():
			return left, nil
		case <-time.After(poll):
		}
	}
}

// close stops beating and forgets this replica, so that no deploy waits
// for it.
func (p *replicaPresence) close() {
	p.leave.Do(func() {
		close(p.stop)
		<-p.done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.st.ReplicaGone(ctx, p.id); err != nil {
			p.log.Warn("replica presence: leave", "err", err)
		}
	})
}

// ready records that this replica holds the module of hash.
func (p *replicaPresence) ready(ctx context.Context, hash string) {
	if hash == "" {
		return
	}
	if err := p.st.ModuleReady(ctx, p.id, hash, time.Now()); err != nil {
		p.log.Warn("replica presence: module ready", "module", hash, "err", err)
	}
}

// await waits until every other live replica holds the module of hash, or
// deployReadyWait has passed, or ctx ends. The code is deployed already:
// nothing here fails the deploy; a replica not ready is logged and counted.
func (p *replicaPresence) await(ctx context.Context, hash string) {
	start := time.Now()
	missing, err := pollReplicas(ctx, deployReadyWait, deployReadyPoll, func(ctx context.Context) ([]string, error) {
		return p.missing(ctx, hash)
	})
	p.waited.Observe(time.Since(start).Seconds())
	switch {
	case err != nil:
		p.log.Warn("replica presence: deploy wait", "module", hash, "err", err)
	case len(missing) > 0:
		p.notReady.Add(float64(len(missing)))
		p.log.Warn("deploy answered before every replica held the module", "module", hash, "replicas", missing, "waited", time.Since(start))
	}
}

// missing are the live replicas other than this one that do not hold the
// module of hash.
func (p *replicaPresence) missing(ctx context.Context, hash string) ([]string, error) {
	live, err := p.st.LiveReplicas(ctx, time.Now().Add(-replicaLive))
	if err != nil {
		return nil, err
	}
	ready, err := p.st.ModuleReadyOn(ctx, hash)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range live {
		if id != p.id && !slices.Contains(ready, id) {
			out = append(out, id)
		}
	}
	return out, nil
}
