package bots

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

// auditJournal is the durable queue between executions and the audit
// writer. An execution answers once its AuditEvent is on disk in it, without
// a database transaction per execution (one costs about ten times the CPU of
// an event in a batch on SQLite, and a round trip and a WAL flush on
// PostgreSQL): the events are written to a file of this process's and
// flushed to disk together (one fdatasync for every event that arrived
// during the previous one). The audit writer reads them back from the
// files and stores them in batches, at its own pace: a burst of executions is not held
// to the speed at which the database indexes AuditEvents (about 160 µs of
// CPU an event on SQLite, as much as the execution), only to the disk's; the
// backlog is bounded (journalMaxBytes), past which executions wait for the
// writer. docs/performance.md, "The tail".
//
// The journal is a series of segment files, audit-<random>.journal, each
// filled with zeros before it is written to (createSegment), and each
// locked (flock) by this process for as long as it has them open, so that
// processes may share a data directory: a segment whose lock can be taken
// belongs to a process that is gone, and the next process to start on the
// directory stores what it holds that the database does not have yet (each
// event carries its AuditEvent's id), then removes it. A segment is removed
// once the writer has stored all of it and a newer one is being appended to.
type auditJournal struct {
	dir     string
	in      chan journalWrite
	metrics *metrics
	// ended is closed when the appender has stopped (after close).
	ended chan struct{}
	// ready has a value when something was appended since the writer
	// last looked.
	ready chan struct{}
	// room has a value when the writer stored something since the
	// appender last waited for room.
	room chan struct{}
	// spare is a segment filled with zeros ahead of time for the appender
	// to move to; stopSpare ends its preparation, and spareDone is closed
	// once it has ended.
	spare     chan *journalSegment
	stopSpare chan struct{}
	spareDone chan struct{}

	mu sync.Mutex
	// segs are the segments not yet stored in full, oldest first; the last
	// is appended to. readOff is the writer's position in segs[0].
	segs    []*journalSegment
	readOff int64
	// unread and backlog are the bytes and entries on disk that are not
	// stored yet; taken and takenN, those of the batch the writer holds.
	unread, taken   int64
	backlog, takenN int
	// closedAt is when appending stopped (zero while open).
	closedAt time.Time
	// keep is set when events the store refused could not be set aside:
	// the segments stay on disk for the next start to store; kept are
	// those the writer has moved past since.
	keep bool
	kept []*journalSegment

	// written counts the entries appended.
	written atomic.Int64
	// segmentBytes and maxBytes are journalSegmentBytes and
	// journalMaxBytes (smaller in tests).
	segmentBytes, maxBytes int64
}

type journalSegment struct {
	f    *os.File
	path string
	// size is what is on disk: whole lines, synced.
	size int64
	// failed is set once a write or sync of the segment failed: nothing
	// more is appended to it.
	failed bool
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

// The journal's sizes. A segment is closed for appending past
// journalSegmentBytes; executions wait for the writer while
// journalMaxBytes are not stored yet (about 900,000 events of the C echo
// bot, three minutes of the writer's work on the machine of
// docs/performance.md).
const (
	journalSegmentBytes = 4 << 20
	journalMaxBytes     = 256 << 20
)

// openAuditJournal creates this process's journal in dir; m counts the
// executions that wait for room (nil: not counted).
func openAuditJournal(dir string, m *metrics) (*auditJournal, error) {
	return openAuditJournalSized(dir, m, journalSegmentBytes, journalMaxBytes)
}

func openAuditJournalSized(dir string, m *metrics, segmentBytes, maxBytes int64) (*auditJournal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	seg, err := createSegment(dir, segmentBytes)
	if err != nil {
		return nil, err
	}
	j := &auditJournal{dir: dir, in: make(chan journalWrite, auditQueue), metrics: m, ended: make(chan struct{}),
		ready: make(chan struct{}, 1), room: make(chan struct{}, 1),
		spare: make(chan *journalSegment), stopSpare: make(chan struct{}), spareDone: make(chan struct{}),
		segs: []*journalSegment{seg}, segmentBytes: segmentBytes, maxBytes: maxBytes}
	go j.run()
	go j.prepareSpares()
	return j, nil
}

// createSegment creates a new, locked segment file in dir, filled with
// size zero bytes and synced: appends then overwrite blocks the file
// already has, and a sync has only the data to write, not the file's size
// and blocks as well (a quarter to a third less time on the development
// machine's disk: decision 61). A segment that cannot be filled is emptied
// and used as it is: it grows as it is appended to.
func createSegment(dir string, size int64) (*journalSegment, error) {
	path := filepath.Join(dir, "audit-"+uuid.NewString()+".journal")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if fillZeros(f, size) != nil && f.Truncate(0) != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("empty %s after a failed fill", path)
	}
	return &journalSegment{f: f, path: path}, nil
}

// fillZeros writes size zero bytes to f and syncs it.
func fillZeros(f *os.File, size int64) error {
	zeros := make([]byte, min(size, 1<<20))
	for off := int64(0); off < size; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), size-off)], off); err != nil {
			return err
		}
	}
	return f.Sync()
}

// prepareSpares keeps a zero-filled segment ready for the appender, so
// that moving to the next segment does not hold executions for the fill.
func (j *auditJournal) prepareSpares() {
	defer close(j.spareDone)
	for {
		seg, err := createSegment(j.dir, j.segmentBytes)
		if err != nil {
			// The appender creates its own when it needs one.
			select {
			case <-j.stopSpare:
				return
			case <-time.After(time.Second):
				continue
			}
		}
		select {
		case j.spare <- seg:
		case <-j.stopSpare:
			seg.f.Close()
			os.Remove(seg.path)
			return
		}
	}
}

// add appends e and returns once it is on disk (or the disk failed).
func (j *auditJournal) add(e auditEntry) error {
	w := journalWrite{e: e, committed: make(chan error, 1)}
	j.in <- w
	return <-w.committed
}

// run writes what has arrived since the last sync in one write and one
// sync, and tells the writer.
func (j *auditJournal) run() {
	defer close(j.ended)
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
		j.waitForRoom(len(batch))
		buf = buf[:0]
		for i := range batch {
			buf = appendRecord(buf, &batch[i].e)
		}
		seg := j.current(int64(len(buf)))
		t0 := time.Now()
		_, err := seg.f.WriteAt(buf, seg.size)
		if err == nil {
			err = syscall.Fdatasync(int(seg.f.Fd()))
		}
		if j.metrics != nil {
			j.metrics.auditJournalSync.Observe(time.Since(t0).Seconds())
		}
		j.mu.Lock()
		if err != nil {
			// After a failed sync the kernel may have dropped the pages
			// it could not write, and a later sync would not say so:
			// nothing more goes to this segment. What was written of this
			// batch lies past size, where nothing is read.
			seg.failed = true
		} else {
			seg.size += int64(len(buf))
			j.unread += int64(len(buf))
			j.backlog += len(batch)
		}
		j.mu.Unlock()
		if err == nil {
			j.written.Add(int64(len(batch)))
			signal(j.ready)
		}
		for i := range batch {
			batch[i].committed <- err
		}
	}
	j.mu.Lock()
	j.closedAt = time.Now()
	j.mu.Unlock()
}

// signal leaves a value in c unless one is there already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// waitForRoom holds the appender (and so the executions) while the
// backlog is full, counting the n executions that wait.
func (j *auditJournal) waitForRoom(n int) {
	counted := false
	for {
		j.mu.Lock()
		full := j.unread >= j.maxBytes
		j.mu.Unlock()
		if !full {
			return
		}
		if !counted && j.metrics != nil {
			j.metrics.auditWaits.Add(float64(n))
			counted = true
		}
		<-j.room
	}
}

// current is the segment to append n bytes to: the next one when the last
// has not room for them (a batch larger than a segment goes to an empty
// one, which grows) or failed; the last one again when a new one cannot be
// made.
func (j *auditJournal) current(n int64) *journalSegment {
	j.mu.Lock()
	seg := j.segs[len(j.segs)-1]
	fits := !seg.failed && (seg.size+n <= j.segmentBytes || seg.size == 0)
	j.mu.Unlock()
	if fits {
		return seg
	}
	var next *journalSegment
	select {
	case next = <-j.spare:
	default:
		var err error
		if next, err = createSegment(j.dir, j.segmentBytes); err != nil {
			return seg
		}
	}
	j.mu.Lock()
	j.segs = append(j.segs, next)
	j.dropStoredSegments()
	j.mu.Unlock()
	return next
}

// dropStoredSegments removes the segments stored in full that are no longer
// appended to (with keep set, it only moves past them, and keeps them open,
// locked, until remove). Called with mu held.
func (j *auditJournal) dropStoredSegments() {
	for len(j.segs) > 1 && j.readOff == j.segs[0].size && j.taken == 0 {
		if j.keep {
			j.kept = append(j.kept, j.segs[0])
		} else {
			j.segs[0].f.Close()
			os.Remove(j.segs[0].path)
		}
		j.segs = j.segs[1:]
		j.readOff = 0
	}
}

// take waits for entries to store and answers up to max of them, waiting
// up to window for max to be there; bad counts lines that could not be
// read (a damaged disk), skipped. The writer calls done once it has stored
// (or set aside) them, before the next take. take answers errJournalDone
// once the journal is closed and everything in it has been taken.
func (j *auditJournal) take(max int, window time.Duration) (batch []auditEntry, bad int, err error) {
	var expired <-chan time.Time
	for {
		j.mu.Lock()
		n, closed := j.backlog, !j.closedAt.IsZero()
		j.mu.Unlock()
		switch {
		case n >= max || n > 0 && closed:
			return j.read(max)
		case n == 0 && closed:
			return nil, 0, errJournalDone
		case n > 0 && expired == nil:
			t := time.NewTimer(window)
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-j.ready:
		case <-j.ended:
		case <-expired:
			return j.read(max)
		}
	}
}

// errJournalDone says that the journal is closed and everything in it taken.
var errJournalDone = errors.New("audit journal closed and stored")

// read decodes up to max entries from the writer's position, within one
// segment.
func (j *auditJournal) read(max int) ([]auditEntry, int, error) {
	j.mu.Lock()
	j.dropStoredSegments()
	seg, off := j.segs[0], j.readOff
	end := seg.size
	j.mu.Unlock()
	// About a kilobyte a line (the C echo bot's are 300 bytes): a batch of
	// 16 reads 16 KiB, not the whole backlog; a longer line doubles it.
	chunk := int64(max) << 10
	var batch []auditEntry
	bad := 0
	var used int64
	for off+used < end && len(batch)+bad < max {
		buf := make([]byte, min(chunk, end-off-used))
		if _, err := seg.f.ReadAt(buf, off+used); err != nil {
			return nil, 0, fmt.Errorf("read %s: %w", seg.path, err)
		}
		progressed := false
		if bytes.IndexByte(buf, '\n') < 0 && off+used+int64(len(buf)) == end {
			// No newline before the end: cannot happen (only whole lines
			// are counted in size), but a damaged disk must not stop the
			// writer.
			bad++
			used += int64(len(buf))
			break
		}
		for len(batch)+bad < max {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				break
			}
			var rec journalRecord
			if json.Unmarshal(buf[:i], &rec) != nil || rec.ID == "" || rec.Project == "" {
				bad++
			} else {
				e := rec.entry()
				e.journaled = true
				batch = append(batch, e)
			}
			used += int64(i + 1)
			buf = buf[i+1:]
			progressed = true
		}
		if !progressed {
			chunk *= 2 // a line longer than the chunk
		}
	}
	j.mu.Lock()
	j.taken, j.takenN = used, len(batch)+bad
	j.mu.Unlock()
	return batch, bad, nil
}

// done tells the journal that the batch of the last take is stored (or set
// aside), freeing its room.
func (j *auditJournal) done() {
	j.mu.Lock()
	j.readOff += j.taken
	j.unread -= j.taken
	j.backlog -= j.takenN
	j.taken, j.takenN = 0, 0
	j.dropStoredSegments()
	j.mu.Unlock()
	signal(j.room)
}

// pending answers the bytes and entries not stored yet.
func (j *auditJournal) pending() (int64, int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.unread, j.backlog
}

// closedFor is how long ago appending stopped (zero while open).
func (j *auditJournal) closedFor() time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closedAt.IsZero() {
		return 0
	}
	return time.Since(j.closedAt)
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

// setAside keeps entries the store refused in a journal file of their own,
// which no process holds, so that the next start stores them: the segments
// they came from can then still be removed. When even that fails, every
// segment is kept until the process ends, for the next start to store.
func (j *auditJournal) setAside(entries []auditEntry) error {
	var buf []byte
	for i := range entries {
		buf = appendRecord(buf, &entries[i])
	}
	path := filepath.Join(j.dir, "audit-"+uuid.NewString()+".journal")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = f.Write(buf)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
	}
	if err != nil {
		j.mu.Lock()
		j.keep = true
		j.mu.Unlock()
	}
	return err
}

// close stops appending once what the journal was given is on disk; the
// writer then stores what is left (see auditWriter.close).
func (j *auditJournal) close() {
	close(j.in)
	<-j.ended
	close(j.stopSpare)
	<-j.spareDone
}

// remove deletes the segments the writer has stored in full and closes the
// others, which stay for the next start on the directory to store.
func (j *auditJournal) remove() {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, seg := range j.segs {
		if i == 0 && j.readOff == seg.size && j.taken == 0 && !j.keep {
			os.Remove(seg.path)
		}
		seg.f.Close()
	}
	for _, seg := range j.kept {
		seg.f.Close()
	}
	j.segs, j.kept = nil, nil
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
		if bytes.IndexByte(line, 0) >= 0 {
			// Segments are filled with zeros before they are appended to,
			// and the blocks of a write reach the disk in any order: zeros
			// in a line are part of an append that was not all on disk
			// when the machine went down, so never acknowledged. (JSON has
			// no NUL byte.)
			continue
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
