package bots

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// auditWriter writes one AuditEvent per execution. With a journal (the
// server's), an execution answers once its event is on disk in the journal
// (journal.go), and the writer reads the journaled events back and stores
// them in batches off the request path, yielding the CPU to executions while
// they arrive (writerPause); without one (tests, sandbot bot run),
// an execution answers once its event is queued in memory, and a full queue
// makes it wait for room. Batches, because a transaction of one event costs
// ten times the CPU of an event in a batch (docs/performance.md, "The
// tail"). Nothing is dropped while the database works. Events waiting when
// the server stops are written before Close returns (from the journal, for
// up to auditDrainTimeout: what is left then is stored by the next start);
// an event that arrives after that (a request that outlived the shutdown
// timeout) is written on its caller's goroutine.
type auditWriter struct {
	store store.Store
	// to, without a store, receives the events instead (sandbot bot run).
	to      func(fhir.Resource)
	log     *slog.Logger
	metrics *metrics
	ch      chan auditEntry
	done    chan struct{}
	// journal, when set, holds the events until they are stored; ch is
	// then unused.
	journal *auditJournal

	mu     sync.RWMutex
	closed bool
	// stopRecovery ends the recovery of dead processes' journals when the
	// writer closes (their events stay on disk for the next start).
	stopRecovery context.CancelFunc
}

// auditEntry is what an execution hands to the writer: the AuditEvent
// itself is built by the writer's goroutine, so that its allocations (and the
// garbage-collection work they bring) are not charged to the request.
type auditEntry struct {
	project    string
	bot        string // "Bot/<id>"
	botName    string
	requester  string
	input      string // the input's reference when it is a resource with an id
	entities   []string
	attempt    int
	details    []Detail
	outcome    string
	desc       string
	start, end time.Time
	// id is the AuditEvent's, chosen when the event is journaled so that a
	// replayed journal stores each event once.
	id string
	// journaled is set once the event is in the journal.
	journaled bool
}

// entityRole is the reference's AuditEvent entity role of a resource type.
func entityRole(ref string) map[string]any {
	typ, _, _ := strings.Cut(ref, "/")
	switch typ {
	case "Patient":
		return map[string]any{"code": "1", "display": "Patient"}
	case "Subscription":
		return map[string]any{"code": "9", "display": "Subscriber"}
	}
	return map[string]any{"code": "4", "display": "Domain"}
}

// event builds the AuditEvent of an execution, as the reference records it.
func (e *auditEntry) event() fhir.Resource {
	bot := map[string]any{"reference": e.bot}
	if e.botName != "" {
		bot["display"] = e.botName
	}
	botEntity := map[string]any{"what": bot, "role": entityRole(e.bot)}
	if e.attempt > 0 {
		botEntity["detail"] = []any{map[string]any{"type": "attempt", "valueString": strconv.Itoa(e.attempt)}}
	}
	entity := []any{botEntity}
	if e.input != "" {
		entity = append(entity, map[string]any{"what": map[string]any{"reference": e.input}, "role": entityRole(e.input)})
	}
	for i, ref := range e.entities {
		en := map[string]any{"what": map[string]any{"reference": ref}, "role": entityRole(ref)}
		if i == 0 && len(e.details) > 0 {
			var ds []any
			for _, d := range e.details {
				ds = append(ds, map[string]any{"type": d.Type, "valueString": d.Value})
			}
			en["detail"] = ds
		}
		entity = append(entity, en)
	}
	ev := fhir.Resource{
		"resourceType": "AuditEvent",
		"type":         map[string]any{"system": "https://medplum.com/CodeSystem/audit-event", "code": "execute"},
		"recorded":     e.end.Format(fhir.TimeFormat),
		"period":       map[string]any{"start": e.start.Format(fhir.TimeFormat), "end": e.end.Format(fhir.TimeFormat)},
		"agent": []any{
			map[string]any{"who": map[string]any{"reference": e.requester}, "requestor": true},
			map[string]any{"who": bot, "requestor": false},
		},
		"source":  map[string]any{"observer": bot},
		"entity":  entity,
		"outcome": e.outcome,
	}
	if e.desc != "" {
		ev["outcomeDesc"] = e.desc
	}
	if e.id != "" {
		ev["id"] = e.id
	}
	return ev
}

// newAuditWriter starts a writer of the events of executions into s (or to
// to); with j, through that journal, else through a queue of queue events
// in memory.
func newAuditWriter(s store.Store, to func(fhir.Resource), log *slog.Logger, m *metrics, queue int, j *auditJournal) *auditWriter {
	a := &auditWriter{store: s, to: to, log: log, metrics: m, done: make(chan struct{}), journal: j, stopRecovery: func() {}}
	if j != nil {
		var recovery context.Context
		recovery, a.stopRecovery = context.WithCancel(context.Background())
		m.watchAuditQueue(func() int { _, n := j.pending(); return n },
			gauge("sandbot_bot_audit_journal_bytes", "Bytes of the audit journal not stored yet.",
				func() float64 { b, _ := j.pending(); return float64(b) }),
			gauge("sandbot_bot_audit_journal_limit_bytes", "Bytes of the audit journal not stored yet past which executions wait for the audit writer.",
				func() float64 { return float64(j.maxBytes) }))
		go a.runJournal(recovery)
		return a
	}
	a.ch = make(chan auditEntry, queue)
	m.watchAuditQueue(func() int { return len(a.ch) },
		gauge("sandbot_bot_audit_queue_capacity", "AuditEvents the audit writer's queue holds; an execution that finds it full waits for room.",
			func() float64 { return float64(cap(a.ch)) }))
	go a.run()
	return a
}

// auditQueue is how many events may wait for the writer (a second or more
// of executions at full speed); past it executions wait for room.
const auditQueue = 4096

// auditBatch bounds how many events one transaction writes: batching keeps
// the writer from competing with executions for the database under load.
const auditBatch = 256

// auditWindow is how long a batch may wait for more events: under load the
// batches fill up, and a lone execution's event is written within it.
const auditWindow = 20 * time.Millisecond

// How the writer shares the CPU with executions when it stores from the
// journal. After a batch stored while executions went on journaling, it
// pauses auditYield times as long as the batch took, less as it falls
// behind (none once the events it stores ended auditPaceLag ago or more),
// never longer than auditMaxPause, and takes batches of auditYieldBatch
// events meanwhile (a short stretch of work, so that an execution waiting
// for a core does not wait for a batch of hundreds): a burst of executions
// gets the CPU, and the backlog it leaves is stored, in full batches, as
// soon as the burst ends. Under a steady load the writer cannot follow at a
// quarter of its speed, its pauses shrink until it keeps up, with its
// events a few seconds old (at most auditPaceLag). auditDrainTimeout bounds
// how long a stopping server stores the backlog; the next start stores the
// rest.
const (
	auditYield        = 3
	auditYieldBatch   = 16
	auditPaceLag      = 10 * time.Second
	auditMaxPause     = 250 * time.Millisecond
	auditDrainTimeout = 10 * time.Second
)

// auditLowPriorityLag is how far behind the writer may fall before the
// batches it takes while pausing are stored at the server's priority
// rather than on the low-priority thread: at nice 19 under a steady load
// it would otherwise sit at auditPaceLag, with most events stored just
// after it (docs/performance.md, "Where the slow requests wait").
const auditLowPriorityLag = auditPaceLag / 2

// writerPause is the pause after a batch that took took, whose last event
// ended lag ago; arriving says whether executions journaled events
// meanwhile.
func writerPause(took, lag time.Duration, arriving bool) time.Duration {
	if !arriving || lag >= auditPaceLag {
		return 0
	}
	k := auditYield * float64(auditPaceLag-max(lag, 0)) / float64(auditPaceLag)
	return min(time.Duration(k*float64(took)), auditMaxPause)
}

// runJournal stores what the journals of processes that died left in the
// journal's directory (recoverAuditJournals: each event the store lacks,
// looked up one by one, so that it does not hold the start: 100,000 events
// took 19 s on SQLite), then what this process's journal holds, in
// batches, pausing between them while executions run (writerPause). The
// batches taken while it pauses are stored on a thread of the lowest
// priority (lowPriority); once it falls auditLowPriorityLag behind, once
// executions stop, and while the server stops, it stores at the server's
// priority, so that it catches up.
func (a *auditWriter) runJournal(recovery context.Context) {
	defer close(a.done)
	j := a.journal
	a.recoverJournals(recovery)
	low := startLowPriority()
	defer low.stop()
	yielding := false
	for j.closedFor() <= auditDrainTimeout {
		size := auditBatch
		if yielding {
			size = auditYieldBatch
		}
		batch, bad, err := j.take(size, auditWindow)
		if err == errJournalDone {
			return
		}
		if err != nil {
			a.log.Error("bot audit journal unreadable; retrying", "err", err)
			time.Sleep(time.Second)
			continue
		}
		if bad > 0 {
			a.metrics.auditDropped.Add(float64(bad))
			a.log.Warn("bot audit journal: unreadable lines skipped", "count", bad)
		}
		appended := j.written.Load()
		t0 := time.Now()
		if yielding && len(batch) > 0 && time.Since(batch[0].end) < auditLowPriorityLag {
			low.run(func() { a.write(batch) })
		} else {
			a.write(batch)
		}
		j.done()
		if len(batch) == 0 {
			continue // only unreadable lines
		}
		pause := writerPause(time.Since(t0), time.Since(batch[len(batch)-1].end), j.written.Load() != appended && j.closedFor() == 0)
		yielding = pause > 0
		if yielding {
			time.Sleep(pause)
		}
	}
}

// recoverJournals stores what dead processes' journals in the journal's
// directory hold; close cancels ctx, leaving the rest for the next start.
func (a *auditWriter) recoverJournals(ctx context.Context) {
	defer a.stopRecovery()
	n, err := recoverAuditJournals(ctx, a.journal.dir, a.store)
	var bad *unreadableJournal
	switch {
	case errors.As(err, &bad):
		a.log.Error("bot audit journal damaged: what could be read was stored", "err", err)
	case err != nil && ctx.Err() != nil:
		a.log.Info("bot audit journals of an earlier process: the stop cut their recovery short; the next start goes on", "stored", n)
	case err != nil:
		a.log.Error("bot audit journals of an earlier process not stored; the next start tries again", "stored", n, "err", err)
	}
	if n > 0 {
		a.log.Info("bot audit events recovered from a journal", "count", n)
	}
}

// run stores what the in-memory queue holds, in batches.
func (a *auditWriter) run() {
	defer close(a.done)
	batch := make([]auditEntry, 0, auditBatch)
	for e := range a.ch {
		batch = append(batch[:0], e)
		window := time.NewTimer(auditWindow)
	fill:
		for len(batch) < auditBatch {
			select {
			case more, ok := <-a.ch:
				if !ok {
					break fill
				}
				batch = append(batch, more)
			case <-window.C:
				break fill
			}
		}
		window.Stop()
		a.write(batch)
	}
}

// write stores a batch in one transaction.
func (a *auditWriter) write(batch []auditEntry) {
	if len(batch) == 0 {
		return
	}
	if a.store == nil {
		for i := range batch {
			if a.to != nil {
				a.to(batch[i].event())
			}
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var journaled []auditEntry
	for i := range batch {
		if batch[i].journaled {
			journaled = append(journaled, batch[i])
		}
	}
	if err := storeAuditBatch(ctx, a.store, batch); err != nil {
		a.metrics.auditDropped.Add(float64(len(batch)))
		a.log.Warn("bot audit events not written", "count", len(batch), "err", err)
		// Journaled events are kept for the next start on this data
		// directory to store.
		if len(journaled) > 0 {
			if err := a.journal.setAside(journaled); err != nil {
				a.log.Warn("bot audit events not set aside; the journal is kept", "count", len(journaled), "err", err)
			}
		}
		return
	}
	now := time.Now()
	for i := range batch {
		a.metrics.auditLag.Observe(now.Sub(batch[i].end).Seconds())
	}
}

// storeAuditBatch stores the events of a batch in one transaction.
func storeAuditBatch(ctx context.Context, st store.Store, batch []auditEntry) error {
	return st.InTx(ctx, func(tx store.Store) error {
		byProject := map[string][]fhir.Resource{}
		for i := range batch {
			byProject[batch[i].project] = append(byProject[batch[i].project], batch[i].event())
		}
		for project, events := range byProject {
			if err := tx.CreateMany(ctx, events, store.Write{Project: project, Author: fhir.Reference{Reference: "system"}}); err != nil {
				return err
			}
		}
		return nil
	})
}

// close writes what is queued and stops the writer; closing twice is
// harmless.
func (a *auditWriter) close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		a.stopRecovery()
		if a.journal != nil {
			a.journal.close()
		} else {
			close(a.ch)
		}
	}
	a.mu.Unlock()
	<-a.done
	if a.journal != nil {
		a.journal.remove()
	}
}

// add records e: in the journal when there is one, returning once it is on
// disk (an event the disk refused is stored at once, on the caller's
// goroutine, and counted), else in the queue, waiting for room when it is
// full.
func (a *auditWriter) add(e auditEntry) {
	a.mu.RLock()
	if a.closed {
		a.mu.RUnlock()
		a.write([]auditEntry{e})
		return
	}
	defer a.mu.RUnlock()
	if a.journal != nil {
		e.id = uuid.Must(uuid.NewV7()).String()
		err := a.journal.add(e)
		if err == nil {
			return
		}
		a.metrics.auditJournalFailed.Inc()
		a.log.Warn("bot audit event not journaled; stored at once", "err", err)
		a.write([]auditEntry{e})
		return
	}
	a.enqueue(e)
}

// enqueue hands e to the writer, waiting for room when the queue is full.
func (a *auditWriter) enqueue(e auditEntry) {
	select {
	case a.ch <- e:
	default:
		a.metrics.auditWaits.Inc()
		a.ch <- e
	}
}

// audit records an execution as the reference does. Bot.auditEventTrigger
// says when: always (the default), never, on-error, or on-output (when the
// execution logged something); Bot.auditEventDestination where: resource
// (the default: an AuditEvent in the bot's project) and log (a line in the
// server's log, without the bot's log text, which may hold anything the bot
// saw). outcomeDesc is the end of the log followed by the failure's message,
// at most the log limit (limits.BotLogBytes).
func (s *Service) audit(p *principal.Principal, t *target, c call, start time.Time, res *runtime.Result, err error) {
	var logs strings.Builder
	if res != nil {
		for _, l := range res.Logs {
			logs.WriteString(l.Text)
			logs.WriteByte('\n')
		}
	}
	var failure string
	switch {
	case err != nil:
		failure = err.Error()
	case res != nil && len(res.Envelope.Error) > 0:
		failure = envelopeErrorText(res.Envelope.Error)
	}
	failed := err != nil || (res != nil && len(res.Envelope.Error) > 0)
	switch t.bot.String("auditEventTrigger") {
	case "never":
		return
	case "on-error":
		if !failed {
			return
		}
	case "on-output":
		if logs.Len() == 0 {
			return
		}
	}
	toResource, toLog := auditDestinations(t.bot)
	if !toResource && !toLog {
		return
	}
	desc := tail(logs.String()+failure, s.cfg.Limits.BotLogBytes)
	outcome := "0"
	if failed {
		outcome = "4"
	}
	end := time.Now().UTC()
	e := auditEntry{project: t.rec.Project, bot: "Bot/" + t.rec.ID, botName: t.bot.String("name"), requester: p.Profile,
		input: inputReference(c.input), entities: c.entities, attempt: c.attempt, details: c.details, outcome: outcome, desc: desc,
		start: start.UTC(), end: end}
	if toLog {
		s.log.Info("bot execution", "audit_event", "execute", "project", e.project, "bot", e.bot, "requester", e.requester,
			"trigger", string(c.trigger), "outcome", e.outcome, "start", e.start.Format(fhir.TimeFormat), "end", e.end.Format(fhir.TimeFormat))
	}
	if toResource {
		s.audits.add(e)
	}
}

// auditDestinations reads Bot.auditEventDestination (default: resource).
func auditDestinations(bot fhir.Resource) (toResource, toLog bool) {
	list, ok := bot["auditEventDestination"].([]any)
	if !ok {
		return true, false
	}
	for _, d := range list {
		switch d {
		case "resource":
			toResource = true
		case "log":
			toLog = true
		}
	}
	return toResource, toLog
}

// tail is the last max bytes of s (none when max is not positive), cut at a
// character boundary.
func tail(s string, max int64) string {
	if max <= 0 {
		return ""
	}
	if int64(len(s)) <= max {
		return s
	}
	i := len(s) - int(max)
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// envelopeErrorText is the message of a bot's error envelope: its string,
// or an OperationOutcome's issue texts.
func envelopeErrorText(raw json.RawMessage) string {
	var msg string
	if json.Unmarshal(raw, &msg) == nil {
		return msg
	}
	var oo fhir.OperationOutcome
	if json.Unmarshal(raw, &oo) == nil && oo.ResourceType == "OperationOutcome" {
		var parts []string
		for _, is := range oo.Issue {
			switch {
			case is.Details != nil && is.Details.Text != "":
				parts = append(parts, is.Details.Text)
			case is.Diagnostics != "":
				parts = append(parts, is.Diagnostics)
			}
		}
		return strings.Join(parts, "; ")
	}
	return string(raw)
}

// inputReference is the execution's input as an AuditEvent entity, as the
// reference records it: when it is a resource with an id.
func inputReference(input json.RawMessage) string {
	if len(input) == 0 || input[0] != '{' {
		return ""
	}
	var in struct {
		ResourceType string `json:"resourceType"`
		ID           string `json:"id"`
	}
	if json.Unmarshal(input, &in) != nil || !fhir.KnownType(in.ResourceType) || !fhir.ValidID(in.ID) {
		return ""
	}
	return in.ResourceType + "/" + in.ID
}
