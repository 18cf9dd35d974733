package bots

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// auditJournal makes an execution's AuditEvent durable before the execution
// answers, without a database transaction per execution (one costs about
// ten times the CPU of an event in a batch on SQLite, and a round trip and a
// WAL flush on PostgreSQL): the events are appended to a file of this
// process's and flushed to disk together (one fsync for every event that
// arrived during the previous one), and the audit writer then stores them in
// batches as before. A process that dies leaves its journal behind; the next
// process to start on the same directory stores what it holds that the
// database does not have yet (each event carries its AuditEvent's id), then
// removes it. docs/performance.md, "The tail".
//
// Each process owns one journal, audit-<random>.journal, locked (flock) for
// its life, so that processes may share a data directory: a journal whose
// lock can be taken belongs to a process that is gone.
type auditJournal struct {
	f    *os.File
	path string
	dir  string
	in   chan journalWrite
	// out receives the entries once they are on disk: the audit writer's
	// queue (auditWriter.enqueue).
	out  func(auditEntry)
	done chan struct{}
	// written counts the entries in the file; stored, those the writer has
	// committed to the store. When they are equal, nothing in the file is
	// needed any more and it may be emptied.
	written, stored atomic.Int64
	size            int64
}

type journalWrite struct {
	e         auditEntry
	committed chan error
}

// journalRecord is an entry as the journal keeps it.
type journalRecord struct {
	ID        string    `json:"id"`
	Project   string    `json:"project"`
	Bot       string    `json:"bot"`
	BotName   string    `json:"botName,omitempty"`
	Requester string    `json:"requester"`
	Input     string    `json:"input,omitempty"`
	Entities  []string  `json:"entities,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	Details   []Detail  `json:"details,omitempty"`
	Outcome   string    `json:"outcome"`
	Desc      string    `json:"desc,omitempty"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
}

func recordOf(e *auditEntry) journalRecord {
	return journalRecord{ID: e.id, Project: e.project, Bot: e.bot, BotName: e.botName, Requester: e.requester, Input: e.input,
		Entities: e.entities, Attempt: e.attempt, Details: e.details, Outcome: e.outcome, Desc: e.desc, Start: e.start, End: e.end}
}

func (r *journalRecord) entry() auditEntry {
	return auditEntry{id: r.ID, project: r.Project, bot: r.Bot, botName: r.BotName, requester: r.Requester, input: r.Input,
		entities: r.Entities, attempt: r.Attempt, details: r.Details, outcome: r.Outcome, desc: r.Desc, start: r.Start, end: r.End}
}

// journalTruncateBytes is the size past which a journal whose every entry
// is stored is emptied.
const journalTruncateBytes = 4 << 20

// openAuditJournal creates this process's journal in dir.
func openAuditJournal(dir string, out func(auditEntry)) (*auditJournal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "audit-"+uuid.NewString()+".journal")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	j := &auditJournal{f: f, path: path, dir: dir, in: make(chan journalWrite, auditQueue), out: out, done: make(chan struct{})}
	go j.run()
	return j, nil
}

// add appends e and returns once it is on disk (or the disk failed).
func (j *auditJournal) add(e auditEntry) error {
	w := journalWrite{e: e, committed: make(chan error, 1)}
	j.in <- w
	return <-w.committed
}

// run writes what has arrived since the last flush in one write and one
// fsync, then hands the entries to the audit writer.
func (j *auditJournal) run() {
	defer close(j.done)
	var buf []byte
	batch := make([]journalWrite, 0, auditBatch)
	for w := range j.in {
		batch = append(batch[:0], w)
	fill:
		for len(batch) < auditBatch {
			select {
			case more, ok := <-j.in:
				if !ok {
					break fill
				}
				batch = append(batch, more)
			default:
				break fill
			}
		}
		if j.size > journalTruncateBytes && j.written.Load() == j.stored.Load() {
			if err := j.f.Truncate(0); err == nil {
				j.size = 0
			}
		}
		buf = buf[:0]
		for i := range batch {
			buf = appendRecord(buf, &batch[i].e)
		}
		_, err := j.f.Write(buf)
		if err == nil {
			err = j.f.Sync()
		}
		if err != nil {
			// No torn line before the next append.
			_ = j.f.Truncate(j.size)
		} else {
			j.size += int64(len(buf))
			j.written.Add(int64(len(batch)))
			for i := range batch {
				batch[i].e.journaled = true
				j.out(batch[i].e)
			}
		}
		for i := range batch {
			batch[i].committed <- err
		}
	}
}

// appendRecord appends e's journal line to buf.
func appendRecord(buf []byte, e *auditEntry) []byte {
	line, err := json.Marshal(recordOf(e))
	if err != nil {
		// Plain strings and times: cannot happen.
		panic(err)
	}
	return append(append(buf, line...), '\n')
}

// storedEntries tells the journal that n of its entries are in the store.
func (j *auditJournal) storedEntries(n int) { j.stored.Add(int64(n)) }

// setAside keeps entries the store refused in a journal file of their own,
// which no process holds, so that the next start on the directory stores
// them, and counts them as done here: this journal can then still be
// emptied. When even that fails, they stay counted as not stored, and this
// journal is kept whole until the process ends.
func (j *auditJournal) setAside(entries []auditEntry) error {
	var buf []byte
	for i := range entries {
		buf = appendRecord(buf, &entries[i])
	}
	path := filepath.Join(j.dir, "audit-"+uuid.NewString()+".journal")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return err
	}
	j.storedEntries(len(entries))
	return nil
}

// close stops the journal once what it was given is on disk and handed on;
// the caller closes the writer's queue after it. The file is removed when
// everything in it is stored (the writer has drained its queue).
func (j *auditJournal) close() {
	close(j.in)
	<-j.done
}

// remove deletes the journal once the audit writer has stored every entry.
func (j *auditJournal) remove() {
	if j.written.Load() == j.stored.Load() {
		os.Remove(j.path)
	}
	j.f.Close()
}

// recoverAuditJournals stores the entries of the journals in dir that no
// live process holds (a process that died before its writer stored them)
// and are not in the store yet, then removes those journals. A journal with
// unreadable lines is stored as far as it can be read and kept aside; the
// error (an *unreadableJournal, joined) says so, and the caller goes on.
func recoverAuditJournals(ctx context.Context, dir string, st store.Store) (int, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "audit-*.journal"))
	if err != nil {
		return 0, err
	}
	recovered := 0
	var damaged error
	for _, path := range paths {
		n, err := recoverAuditJournal(ctx, path, st)
		recovered += n
		var bad *unreadableJournal
		switch {
		case errors.As(err, &bad):
			damaged = errors.Join(damaged, err)
		case err != nil:
			return recovered, err
		}
	}
	return recovered, damaged
}

func recoverAuditJournal(ctx context.Context, path string, st store.Store) (int, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return 0, nil // a live process's
	}
	var missing []auditEntry
	unreadable := 0
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			// A last line without its newline was being written when the
			// process died: it was never acknowledged.
			break
		}
		if err != nil {
			return 0, err
		}
		var rec journalRecord
		if json.Unmarshal(line, &rec) != nil || rec.ID == "" || rec.Project == "" {
			// Only this server writes journals: a damaged disk. The rest is
			// stored, and the file kept aside for a look.
			unreadable++
			continue
		}
		_, err = st.Read(ctx, store.ProjectScope(rec.Project), "AuditEvent", rec.ID)
		switch {
		case fhir.IsCode(err, fhir.ENotFound):
			missing = append(missing, rec.entry())
		case err != nil:
			return 0, err
		}
	}
	stored := 0
	for stored < len(missing) {
		n := min(len(missing)-stored, auditBatch)
		if err := storeAuditBatch(ctx, st, missing[stored:stored+n]); err != nil {
			return stored, err
		}
		stored += n
	}
	if unreadable > 0 {
		return stored, &unreadableJournal{path: path, lines: unreadable, rename: os.Rename(path, path+".unreadable")}
	}
	return stored, os.Remove(path)
}

// unreadableJournal reports lines of a journal that could not be read; the
// journal was renamed aside (*.unreadable) once the rest was stored.
type unreadableJournal struct {
	path   string
	lines  int
	rename error
}

func (e *unreadableJournal) Error() string {
	return fmt.Sprintf("audit journal %s: %d unreadable lines (kept as %s.unreadable; rename: %v)", e.path, e.lines, e.path, e.rename)
}
