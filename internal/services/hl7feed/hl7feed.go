// Package hl7feed receives HL7 v2 messages over MLLP and runs a bot for each
// one. The operator names the addresses to listen on and the project each
// feeds (SANDBOT_MLLP_ADDRS); which Bot runs is the project's data, in the
// reference's shape: an Agent whose channel has an Endpoint with an mllp://
// address on the listener's port and a targetReference to the Bot.
//
// A message is acknowledged only once it is kept: it is committed with the
// task that will run its bot, in one transaction, and then answered AA (CA
// when the sender asked for enhanced acknowledgements in MSH-15). A message
// that cannot be kept is answered AE (CE), a malformed one AR (CR) with an
// ERR segment, and the connection stays usable. A message whose control id
// (MSH-10) was kept on the same channel within the deduplication window is
// answered as the first time and not run again. The tasks of a channel run
// one at a time in the order they were kept (jobs.Task.Partition), or per
// partition key (a patient's identifier) when the channel names one. The
// bot runs as its own membership through the bots service, with retries.
//
// A channel in application mode (AckModeExtension) keeps its messages in
// the same way, then answers with the ACK its bot returned, once the
// message's task has run (on any replica), or AE when the bot failed or did
// not answer within its timeout; that answer is kept with the message's
// deduplication count, and a resend within the window gets it again (or
// waits for the run as the first sending did). A message whose bot failed
// for good is written as an AsyncJob (type hl7-message, status error) that
// the project's admins list and run again (Rerun).
//
// A listener may speak MLLP over TLS (Listener.TLS, from the operator's
// certificate files). It uses net for MLLP's TCP but knows nothing of
// HTTP; the framing is internal/mllp's.
package hl7feed

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/mllp"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/bots"
	"github.com/sandbot/sandbot/internal/services/jobs"
	"github.com/sandbot/sandbot/limits"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/sdk/hl7"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
)

// The task's kind and queue.
const (
	taskKind  = "hl7-message"
	taskQueue = "hl7"
)

// PartitionKeyExtension is the Agent.channel extension (valueString, an HL7
// path such as "PID-3.1") whose value in each message orders the channel's
// messages per value instead of all together.
const PartitionKeyExtension = "https://sandbot.dev/fhir/StructureDefinition/hl7-partition-key"

// AckModeExtension is the Agent.channel extension (valueCode) that says
// what a channel's acknowledgement means: "commit" (the default: the
// message is kept with its task) or "application" (the ACK the bot
// returned, once it ran, as the reference's agent answers in its original
// mode).
const AckModeExtension = "https://sandbot.dev/fhir/StructureDefinition/hl7-ack-mode"

// The acknowledgement modes of AckModeExtension.
const (
	AckCommit      = "commit"
	AckApplication = "application"
)

// FailedType is the AsyncJob.type of a message whose bot failed for good.
const FailedType = "hl7-message"

// MaxAttempts is how many times a message's bot is run when it fails.
const MaxAttempts = 4

// channelCacheTTL is how long a listener's channel, read from the project's
// Agents, is used before it is read again.
const channelCacheTTL = 2 * time.Second

// Config configures the service.
type Config struct {
	Listeners []Listener
	Store     *sqlstore.Store
	Bots      *bots.Service
	Jobs      *jobs.Engine
	// Principal resolves the Bot a message runs as (its membership), from
	// a cache the changes of memberships and policies empty; nil reads it
	// from the store for every message.
	Principal func(ctx context.Context, userRef string) (*principal.Principal, error)
	Limits    limits.Limits
	Log       *slog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Service listens and runs the messages' bots.
type Service struct {
	cfg     Config
	store   *sqlstore.Store
	log     *slog.Logger
	metrics *metrics

	// keeps takes the messages to keep; keepers commit them in batches.
	keeps chan keepRequest
	stop  chan struct{}

	mu        sync.Mutex
	listeners []*listener
	closed    bool
	wg        sync.WaitGroup

	// waiters are the application-mode messages waiting for their task's
	// first run on this process, by task id (a resend waits for the
	// task of the message it repeats).
	waitMu  sync.Mutex
	waiters map[int64][]chan appOutput
}

// appOutput is what a run of an application-mode message's task answers
// its sender (recorded as the task's output, so that the connection that
// waits for it may be on another replica): the bot's ACK, or why there is
// none.
type appOutput struct {
	Ack   string `json:"ack,omitempty"`
	Error string `json:"error,omitempty"`
	// Failed: the bot failed (it is not run again; the sender sends the
	// message again). An Error without it: the bot ran, and answered no
	// ACK, or (Transient) it could not run.
	Failed bool `json:"failed,omitempty"`
	// Transient: the bot could not run for a reason of the server's, and
	// its task runs again. Such an answer is not kept for the message's
	// resends: they wait for the answer of the run that follows.
	Transient bool `json:"transient,omitempty"`
	// Record is the failed message written for a failure (an AsyncJob),
	// which the connection deletes once it has answered AE.
	Record string `json:"record,omitempty"`
}

type listener struct {
	Listener
	ln   net.Listener
	port string

	mu     sync.Mutex
	conns  map[net.Conn]bool
	perIP  map[string]int
	cached *channel
	expiry time.Time
}

// channel is where a listener's messages go.
type channel struct {
	agent, name, bot string
	partitionKey     string
	application      bool
}

// New builds the service and registers its task with the job engine; Start
// opens the listeners.
func New(cfg Config) *Service {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Principal == nil {
		cfg.Principal = func(ctx context.Context, ref string) (*principal.Principal, error) {
			return principal.ForUser(ctx, cfg.Store, ref)
		}
	}
	s := &Service{cfg: cfg, store: cfg.Store, log: cfg.Log, metrics: newMetrics(cfg.Registerer),
		keeps: make(chan keepRequest, 1024), stop: make(chan struct{}), waiters: map[int64][]chan appOutput{}}
	cfg.Jobs.HandleTasks(taskKind, taskQueue, s.run)
	return s
}

// maxBatch bounds the messages one transaction keeps: each keeper keeps
// every message that waits when it begins (up to maxBatch) in one
// transaction, so that concurrent connections share a commit (and its sync
// to disk).
const maxBatch = 128

// keepers is how many transactions keep messages at once. SQLite commits
// one writer at a time, so a second keeper there only halves the batches
// (and waits for the lock in SQLite's busy handler, which sleeps): at 10
// connections it kept 995-2,094 messages per second, with the bot running
// beside it, against 2,253-2,708 with one. PostgreSQL commits two
// transactions at once: 157-177 with one, 220-227 with two.
func keepers(d sqlstore.Dialect) int {
	if d == sqlstore.SQLite {
		return 1
	}
	return 2
}

type keepRequest struct {
	project, key, control, partition string
	payload                          []byte
	// application: the message's task id is kept with its deduplication
	// window, for a resend to find its answer (seenValue).
	application bool
	done        chan keepResult
}

type keepResult struct {
	dup bool
	// task is the id of the message's task (when it is not a duplicate and
	// its channel is in application mode; 0 otherwise).
	task int64
	// ends is when the message's deduplication window ends, and value what
	// the window held when the message was counted (for a duplicate: the
	// first sending's seenValue, if it was kept in application mode).
	ends  time.Time
	value string
	err   error
}

// keep commits a message with its task (or finds it a duplicate) and
// answers when the transaction has committed.
func (s *Service) keep(r keepRequest) keepResult {
	r.done = make(chan keepResult, 1)
	select {
	case s.keeps <- r:
	case <-s.stop:
		return keepResult{err: errors.New("the server is stopping")}
	}
	select {
	case res := <-r.done:
		return res
	case <-s.stop:
		// The connection is closing: its sender gets no answer and sends
		// the message again (a duplicate if it was kept).
		return keepResult{err: errors.New("the server is stopping")}
	}
}

// keeper commits batches of messages until the service stops.
func (s *Service) keeper() {
	defer s.wg.Done()
	for {
		var first keepRequest
		select {
		case first = <-s.keeps:
		case <-s.stop:
			return
		}
		batch := []keepRequest{first}
	more:
		for len(batch) < maxBatch {
			select {
			case r := <-s.keeps:
				batch = append(batch, r)
			default:
				break more
			}
		}
		s.commit(batch)
	}
}

// commit keeps a batch in one transaction: each message's duplicate count,
// the tasks of those that are new and, for those of an application-mode
// channel, their task's id with their count (seenValue). If the transaction
// fails, every message of the batch is answered AE, and none was kept.
func (s *Service) commit(batch []keepRequest) {
	s.metrics.batch.Observe(float64(len(batch)))
	dups := make([]bool, len(batch))
	ids := make([]int64, len(batch))
	ends := make([]time.Time, len(batch))
	values := make([]string, len(batch))
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.cfg.Limits.MLLPReadSeconds)*time.Second)
	defer cancel()
	err := s.store.InTx(ctx, func(tx store.Store) error {
		// Duplicate counts in the order of their keys (two transactions
		// never wait for each other's rows in a cycle); the tasks in
		// arrival order.
		order := make([]int, len(batch))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return batch[order[a]].key < batch[order[b]].key })
		window := time.Duration(s.cfg.Limits.MLLPDedupeSeconds) * time.Second
		for _, i := range order {
			if batch[i].control == "" {
				continue
			}
			hits, end, value, err := tx.CountHitValue(ctx, batch[i].key, window)
			if err != nil {
				return err
			}
			dups[i], ends[i], values[i] = hits > 1, end, value
		}
		tasks := make([]jobs.Task, 0, len(batch))
		application := false
		for i, r := range batch {
			if !dups[i] {
				tasks = append(tasks, jobs.Task{Kind: taskKind, Project: r.project, Payload: r.payload,
					MaxAttempts: MaxAttempts, Partition: r.partition})
				application = application || r.application
			}
		}
		// Only an application-mode message needs its task's id (its
		// connection waits for that task); reading the ids back costs.
		var got []int64
		var err error
		if application {
			got, err = s.cfg.Jobs.EnqueueManyIDs(ctx, tx, tasks)
		} else {
			err = s.cfg.Jobs.EnqueueMany(ctx, tx, tasks)
		}
		if err != nil {
			return err
		}
		for i, j := 0, 0; i < len(batch) && j < len(got); i++ {
			if !dups[i] {
				ids[i], j = got[j], j+1
			}
		}
		// An application-mode message's task, for its resends; a resend
		// in the same batch counted before it was kept.
		kept := map[string]string{}
		for i, r := range batch {
			if dups[i] || !r.application || r.control == "" {
				continue
			}
			v := seenValue(ids[i], nil)
			if _, err := tx.SetHitValue(ctx, r.key, "", v); err != nil {
				return err
			}
			kept[r.key] = v
		}
		for i, r := range batch {
			if v, ok := kept[r.key]; ok && dups[i] && values[i] == "" {
				values[i] = v
			}
		}
		return nil
	})
	for i, r := range batch {
		r.done <- keepResult{dup: dups[i], task: ids[i], ends: ends[i], value: values[i], err: err}
	}
}

// Start opens every listener; the first that fails closes the others.
func (s *Service) Start() error {
	for _, l := range s.cfg.Listeners {
		ln, err := net.Listen("tcp", l.Addr)
		if err != nil {
			s.Close()
			return fmt.Errorf("mllp: listen %s: %w", l.Addr, err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		if l.TLS != nil {
			ln = tls.NewListener(ln, l.TLS)
		}
		li := &listener{Listener: l, ln: ln, port: port, conns: map[net.Conn]bool{}, perIP: map[string]int{}}
		s.mu.Lock()
		s.listeners = append(s.listeners, li)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.accept(li)
		if len(s.listeners) == 1 {
			for range keepers(s.store.Dialect()) {
				s.wg.Add(1)
				go s.keeper()
			}
		}
		s.log.Info("mllp listening", "addr", ln.Addr().String(), "project", l.Project, "tls", l.TLS != nil)
	}
	return nil
}

// Addrs are the addresses listened on, in the order of the listeners.
func (s *Service) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []net.Addr
	for _, l := range s.listeners {
		out = append(out, l.ln.Addr())
	}
	return out
}

// Close stops listening, closes the connections (a message being kept is
// either committed and acknowledged or not: the sender sends it again) and
// waits for their goroutines.
func (s *Service) Close() {
	s.mu.Lock()
	if !s.closed {
		close(s.stop)
	}
	s.closed = true
	ls := s.listeners
	s.mu.Unlock()
	for _, l := range ls {
		l.ln.Close()
		l.mu.Lock()
		for c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
	}
	s.wg.Wait()
}

func (s *Service) accept(l *listener) {
	defer s.wg.Done()
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		ip := remoteIP(conn)
		if !l.allowed(ip) {
			s.metrics.refused.WithLabelValues("source").Inc()
			conn.Close()
			continue
		}
		l.mu.Lock()
		if len(l.conns) >= int(s.cfg.Limits.MLLPConnections) || l.perIP[ip.String()] >= int(s.cfg.Limits.MLLPConnectionsPerAddress) {
			l.mu.Unlock()
			s.metrics.refused.WithLabelValues("limit").Inc()
			conn.Close()
			continue
		}
		l.conns[conn] = true
		l.perIP[ip.String()]++
		l.mu.Unlock()
		s.mu.Lock()
		closed := s.closed
		if !closed {
			s.wg.Add(1)
		}
		s.mu.Unlock()
		if closed {
			conn.Close()
			return
		}
		s.metrics.connections.Inc()
		go func() {
			defer s.wg.Done()
			defer func() {
				// Released before the close, so that a client that saw it
				// may connect again at once.
				s.metrics.connections.Dec()
				l.mu.Lock()
				delete(l.conns, conn)
				if l.perIP[ip.String()]--; l.perIP[ip.String()] <= 0 {
					delete(l.perIP, ip.String())
				}
				l.mu.Unlock()
				conn.Close()
			}()
			s.serve(l, conn)
		}()
	}
}

func remoteIP(c net.Conn) net.IP {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP
	}
	return net.IPv4zero
}

// serve reads a connection's messages one after the other and answers each.
// Between messages the connection may stay idle for the idle timeout; once a
// message has begun it must arrive whole within the read timeout.
func (s *Service) serve(l *listener, conn net.Conn) {
	idle := time.Duration(s.cfg.Limits.MLLPIdleSeconds) * time.Second
	read := time.Duration(s.cfg.Limits.MLLPReadSeconds) * time.Second
	if tc, ok := conn.(*tls.Conn); ok {
		// The handshake is bounded like a message.
		ctx, cancel := context.WithTimeout(context.Background(), read)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			s.metrics.framing.WithLabelValues("tls").Inc()
			return
		}
	}
	r := mllp.NewReader(conn, int(s.cfg.Limits.MLLPMessageBytes))
	r.Started = func() { conn.SetReadDeadline(time.Now().Add(read)) }
	for {
		conn.SetReadDeadline(time.Now().Add(idle))
		skipped := r.Skipped
		msg, err := r.ReadFrame()
		if r.Skipped > skipped {
			s.metrics.framing.WithLabelValues("garbage").Inc()
		}
		var ack []byte
		switch {
		case err == nil:
			s.metrics.bytes.Add(float64(len(msg)))
			ack = s.receive(l, conn, msg, func(early []byte) error {
				conn.SetWriteDeadline(time.Now().Add(read))
				return mllp.WriteFrame(conn, early)
			})
		case errors.Is(err, mllp.ErrTooLarge):
			s.metrics.framing.WithLabelValues("too_large").Inc()
			ack = rejectAck(fmt.Sprintf("The message is larger than %d bytes", s.cfg.Limits.MLLPMessageBytes))
			s.metrics.messages.WithLabelValues("AR").Inc()
		case errors.Is(err, mllp.ErrUnterminated):
			// The lost frame has nothing to answer; the next one follows.
			s.metrics.framing.WithLabelValues("unterminated").Inc()
			continue
		default:
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				s.metrics.framing.WithLabelValues("timeout").Inc()
			}
			return
		}
		switch {
		case ack == nil:
			return // the connection failed while a message waited
		case len(ack) == 0:
			continue // answered already (through early)
		}
		conn.SetWriteDeadline(time.Now().Add(read))
		if err := mllp.WriteFrame(conn, ack); err != nil {
			return
		}
	}
}

// rejectAck answers what could not be read as a message at all (no MSH to
// answer): an AR without MSA-2.
func rejectAck(text string) []byte {
	m, _ := hl7.Parse([]byte("MSH|^~\\&|||||||||P|2.5\r"))
	ack, _ := m.Ack(hl7.AckOptions{Code: "AR", Text: text, Err: &hl7.AckError{Code: 100, Diagnostic: text}})
	return ack.Bytes()
}

// task is a kept message's task payload.
type task struct {
	Agent    string    `json:"agent"`
	Channel  string    `json:"channel"`
	Bot      string    `json:"bot"`
	Message  string    `json:"message"`
	Control  string    `json:"control,omitempty"`
	Received time.Time `json:"received"`
	Remote   string    `json:"remote,omitempty"`
	Ack      string    `json:"ack"`
	// Mode is AckApplication when a connection waits for the bot's ACK.
	Mode string `json:"mode,omitempty"`
	// Partition is the task's partition (kept for a run again).
	Partition string `json:"partition,omitempty"`
	// Record is the AsyncJob of a failed message being run again.
	Record string `json:"record,omitempty"`
}

// receive keeps one message and answers its acknowledgement, or nil when
// the connection failed, or an empty answer when it was sent already.
// early writes an acknowledgement at once: in application mode, the commit
// ACK (CA) that a sender asking for enhanced acknowledgements gets once the
// message is kept, before the bot's, and an AE whose delivery matters.
func (s *Service) receive(l *listener, conn net.Conn, raw []byte, early func([]byte) error) []byte {
	received := time.Now()
	m, err := hl7.Parse(raw)
	if err != nil {
		var pe *hl7.ParseError
		if m == nil || !m.Header().Is("MSH") {
			s.metrics.messages.WithLabelValues("AR").Inc()
			return rejectAck("Not an HL7 message: " + err.Error())
		}
		ae := &hl7.AckError{Code: 100, Diagnostic: err.Error()}
		if errors.As(err, &pe) {
			ae = pe.AckError()
		}
		return s.ack(m, "R", "The message is malformed", ae)
	}
	ch, err := s.channel(context.Background(), l)
	if err != nil {
		s.log.Warn("mllp: no channel", "addr", l.Addr, "err", err)
		return s.ack(m, "E", "No channel of the project receives this port: "+err.Error(), &hl7.AckError{Code: 207})
	}
	code := ackCode(m, "A")
	ctl := m.ControlID()
	partition := "hl7/" + l.Project + "/" + ch.agent + "/" + ch.name
	if ch.partitionKey != "" {
		partition += "/" + m.Value(ch.partitionKey)
	}
	mode := ""
	if ch.application {
		mode = AckApplication
	}
	payload, _ := json.Marshal(task{Agent: ch.agent, Channel: ch.name, Bot: ch.bot, Message: string(raw), Control: ctl,
		Received: received, Remote: conn.RemoteAddr().String(), Ack: code, Mode: mode, Partition: partition})
	res := s.keep(keepRequest{project: l.Project, key: seenKey(ch.agent, ch.name, ctl), control: ctl,
		partition: partition, payload: payload, application: ch.application})
	if res.err != nil {
		s.log.Warn("mllp: message not kept", "addr", l.Addr, "control", ctl, "err", res.err)
		return s.ack(m, "E", "The message could not be kept; send it again", &hl7.AckError{Code: 207})
	}
	dup := res.dup
	s.metrics.commitToAck.Observe(time.Since(received).Seconds())
	if dup {
		s.metrics.duplicates.Inc()
	}
	if ch.application {
		return s.applicationAck(l.Project, m, ch, res, received, early)
	}
	return s.ack(m, code[1:], "", nil)
}

// appStartGrace is how much longer than its bot's timeout an
// application-mode message waits for its answer: the time for its task to
// be fetched by a worker.
const appStartGrace = time.Second

// maxSeenAnswer bounds the answer kept with a message's deduplication
// window (seenValue); a larger one is read from its task while the job
// engine keeps it.
const maxSeenAnswer = 64 << 10

// seenValue is what the deduplication window of a message kept on an
// application-mode channel holds: its task's id and, once its bot has
// answered, that answer (appOutput's JSON) after a space. A resend finds
// its first sending's answer there, or the task to wait for.
func seenValue(task int64, out *appOutput) string {
	v := strconv.FormatInt(task, 10)
	if out != nil {
		b, _ := json.Marshal(out)
		v += " " + string(b)
	}
	return v
}

// parseSeen reads a seenValue; ok is false for a window that holds none
// (its message was kept on a channel in commit mode).
func parseSeen(v string) (task int64, out *appOutput, ok bool) {
	id, answer, _ := strings.Cut(v, " ")
	task, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return 0, nil, false
	}
	if answer != "" {
		var o appOutput
		if json.Unmarshal([]byte(answer), &o) == nil {
			out = &o
		}
	}
	return task, out, true
}

// applicationAck answers a message kept on an application-mode channel:
// CA at once when the sender asked for enhanced acknowledgements, then the
// ACK the bot returned once the first run of the message's task ended (on
// this process or another), waiting until the bot's timeout (and
// appStartGrace) from the message's arrival; AE when the bot failed,
// returned no HL7 message, or took longer (AE even in enhanced mode: it is
// the application acknowledgement). A failed run is not tried again (the
// sender, answered AE, sends the message again, and it is a new one); a
// message still waiting or running when the time is up stays kept, and
// runs.
//
// A resend within the deduplication window (res.dup) is not run again: it
// gets its first sending's answer, kept with the window, or waits for that
// sending's task as the first did. A resend of a message kept while the
// channel was in commit mode gets what that one got, AA (CA).
func (s *Service) applicationAck(project string, m *hl7.Message, ch *channel, res keepResult, received time.Time, early func([]byte) error) []byte {
	id := res.task
	var out appOutput
	got := false
	if res.dup {
		task, answer, ok := parseSeen(res.value)
		if !ok {
			return s.ack(m, "A", "", nil)
		}
		id = task
		if answer != nil {
			out, got = *answer, true
		}
	}
	if ackCode(m, "A") == "CA" {
		if err := early(s.ack(m, "A", "", nil)); err != nil {
			return nil
		}
	}
	if !got {
		var ack []byte
		if out, ack = s.awaitOutput(project, m, ch, id, res.dup, received); ack != nil {
			return ack
		}
	}
	if out.Error != "" && out.Failed {
		// Its sender is told to send it again: the resend is a new
		// message, not a duplicate of this one, and the failed message
		// written for it is not one to run again.
		// It is deleted only once the AE is written: a sender that did not
		// get it may not send the message again. Only this window is
		// forgotten: a resend kept since (after another connection
		// answered the same failure) stays counted.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.store.ForgetHit(ctx, seenKey(ch.agent, ch.name, m.ControlID()), res.ends); err == nil {
			if err := early(s.ackWith(m, "AE", "The bot failed ("+out.Error+"); send the message again", &hl7.AckError{Code: 207})); err != nil {
				return nil
			}
			if out.Record != "" {
				err := s.store.Delete(ctx, store.ProjectScope(project), "AsyncJob", out.Record, store.Write{Author: fhir.Reference{Reference: "Agent/" + ch.agent}})
				if err != nil && !fhir.IsCode(err, fhir.ENotFound) && !fhir.IsCode(err, fhir.EGone) {
					s.log.Warn("mllp: deleting a failed message answered AE", "record", out.Record, "err", err)
				}
			}
			return []byte{}
		}
	}
	if out.Error != "" {
		return s.ackWith(m, "AE", "No ACK from the bot ("+out.Error+"); the message is kept", &hl7.AckError{Code: 207})
	}
	code := "AA"
	if a, err := hl7.Parse([]byte(out.Ack)); err == nil {
		code = a.Value("MSA-1")
	}
	s.metrics.messages.WithLabelValues(code).Inc()
	return []byte(out.Ack)
}

// awaitOutput waits for what the first run of task id answers, until the
// bot's timeout (and appStartGrace) from the message's arrival; ack is the
// AE to send instead when the time is up or the server stops. dup: the
// message is a resend, whose first sending's task may have been deleted by
// the job engine since.
func (s *Service) awaitOutput(project string, m *hl7.Message, ch *channel, id int64, dup bool, received time.Time) (out appOutput, ack []byte) {
	deadline := received.Add(s.cfg.Bots.Timeout(context.Background(), project, ch.bot) + appStartGrace)
	done := make(chan appOutput, 1)
	s.waitMu.Lock()
	s.waiters[id] = append(s.waiters[id], done)
	s.waitMu.Unlock()
	defer func() {
		s.waitMu.Lock()
		cs := slices.DeleteFunc(s.waiters[id], func(c chan appOutput) bool { return c == done })
		if len(cs) == 0 {
			delete(s.waiters, id)
		} else {
			s.waiters[id] = cs
		}
		s.waitMu.Unlock()
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	// Another replica's run is seen in its task's output.
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case out = <-done:
			if !dup || !out.Transient {
				return out, nil
			}
		case <-timer.C:
			return out, s.ackWith(m, "AE", "No ACK from the bot within its timeout; the message is kept and runs", &hl7.AckError{Code: 207})
		case <-s.stop:
			return out, s.ackWith(m, "AE", "The server is stopping; the message is kept and runs", &hl7.AckError{Code: 207})
		case <-poll.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			state, _, raw, err := s.cfg.Jobs.TaskState(ctx, id)
			cancel()
			var recorded appOutput
			switch {
			case err != nil:
			case len(raw) > 0 && json.Unmarshal(raw, &recorded) == nil && (!dup || !recorded.Transient):
				return recorded, nil
			case state == "" && dup:
				// Its answer would have been kept with the window before
				// its task ended; it was not (too large, or the database
				// failed then), and the task is gone.
				return appOutput{Error: "the answer to its first sending is no longer kept; it is not run again"}, nil
			case state == "" || state == "cancelled" || state == "discarded":
				return appOutput{Error: "the bot did not run"}, nil
			}
		}
	}
}

// answered records what a run of an application-mode message answers its
// sender: with the message's deduplication window, for its resends, then
// as the task's output and to the connections of this process that wait
// for it (a connection on another replica reads the output).
func (s *Service) answered(ctx context.Context, job *jobs.Job, t *task, out appOutput) {
	if t.Control != "" && t.Record == "" && !out.Transient {
		// Only the first answer: the one its first sending got (or, when
		// that sending's wait ended first, the one it would have got).
		if v := seenValue(job.TaskID, &out); len(v) <= maxSeenAnswer {
			old := seenValue(job.TaskID, nil)
			if _, err := s.store.SetHitValue(ctx, seenKey(t.Agent, t.Channel, t.Control), old, v); err != nil {
				s.log.Warn("mllp: keeping the bot's ACK for resends", "err", err)
			}
		}
	}
	if err := jobs.RecordOutput(ctx, out); err != nil {
		s.log.Warn("mllp: recording the bot's ACK", "err", err)
	}
	s.waitMu.Lock()
	cs := slices.Clone(s.waiters[job.TaskID]) // a waiter that leaves changes the slice
	s.waitMu.Unlock()
	for _, c := range cs {
		select {
		case c <- out:
		default:
		}
	}
}

// botAck is the HL7 acknowledgement a bot's result carries, or why it
// carries none.
func botAck(res *bots.Result, err error) appOutput {
	switch {
	case err != nil && (fhir.IsCode(err, fhir.EThrottled) || fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable)):
		// Not the bot's failure: its task runs again (Service.run).
		return appOutput{Error: err.Error(), Transient: true}
	case err != nil:
		return appOutput{Error: err.Error(), Failed: true}
	case res.Thrown:
		return appOutput{Error: "it threw an error", Failed: true}
	case res.Status >= 400:
		return appOutput{Error: fmt.Sprintf("it answered %d", res.Status), Failed: true}
	}
	body := strings.TrimSpace(strings.ReplaceAll(string(res.Body), "\n", "\r"))
	a, perr := hl7.Parse([]byte(body))
	if len(res.Body) == 0 || perr != nil || !a.Header().Is("MSH") {
		return appOutput{Error: "the bot's answer is not an HL7 message"}
	}
	return appOutput{Ack: string(a.Bytes())}
}

// seenKey is the deduplication counter of a channel's control id.
func seenKey(agent, channel, control string) string {
	return "hl7-seen " + agent + "/" + channel + " " + control
}

// ackCode is the acknowledgement code of kind ("A" accepted, "E" error, "R"
// rejected): enhanced mode (C…) when the sender filled MSH-15, the accept
// acknowledgement type, else original mode (A…).
func ackCode(m *hl7.Message, kind string) string {
	if m.Header().Field(15).Value() != "" {
		return "C" + kind
	}
	return "A" + kind
}

// ack builds the acknowledgement of m of kind with an optional text and ERR.
func (s *Service) ack(m *hl7.Message, kind, text string, e *hl7.AckError) []byte {
	return s.ackWith(m, ackCode(m, kind), text, e)
}

// ackWith builds the acknowledgement of m with code.
func (s *Service) ackWith(m *hl7.Message, code, text string, e *hl7.AckError) []byte {
	s.metrics.messages.WithLabelValues(code).Inc()
	a, err := m.Ack(hl7.AckOptions{Code: code, Text: text, Err: e})
	if err != nil {
		return rejectAck(text)
	}
	return a.Bytes()
}

// agentPage is how many Agents a channel's lookup reads at once, and
// maxAgents how many it reads at most (the search's offset ends at
// fhir.MaxOffset): a project with more has no channel, an AE that says so,
// rather than one found among some of its Agents.
const (
	agentPage = 1000
	maxAgents = 10 * agentPage
)

// agents reads the project's Agents, every one of them up to maxAgents, by
// pages in the order of their ids, which an update does not change. An
// Agent created or deleted during the walk may shift the next page by one:
// one read twice is read once; one left out is read by the next lookup.
func (s *Service) agents(ctx context.Context, scope store.Scope) ([]fhir.Resource, error) {
	var out []fhir.Resource
	seen := map[string]bool{}
	for offset := 0; ; offset += agentPage {
		req, err := fhir.ParseSearch("Agent", "_sort=_id&_count="+strconv.Itoa(agentPage)+"&_offset="+strconv.Itoa(offset))
		if err != nil {
			return nil, err
		}
		res, err := s.store.Search(ctx, scope, req)
		if err != nil {
			return nil, err
		}
		for i := range res.Records {
			rec := &res.Records[i]
			if seen[rec.ID] {
				continue
			}
			seen[rec.ID] = true
			a, err := rec.Resource()
			if err != nil {
				return nil, err
			}
			out = append(out, a)
		}
		if !res.More {
			return out, nil
		}
		if offset+agentPage >= maxAgents {
			return nil, fmt.Errorf("the project has more than %d Agents", maxAgents)
		}
	}
}

// channel is the listener's channel: the project's Agent (not off) with a
// channel whose Endpoint's mllp:// address has the listener's port, and its
// Bot. Read again after channelCacheTTL.
func (s *Service) channel(ctx context.Context, l *listener) (*channel, error) {
	l.mu.Lock()
	if l.cached != nil && time.Now().Before(l.expiry) {
		c := l.cached
		l.mu.Unlock()
		return c, nil
	}
	l.mu.Unlock()
	scope := store.ProjectScope(l.Project)
	agents, err := s.agents(ctx, scope)
	if err != nil {
		return nil, err
	}
	var found *channel
	for _, a := range agents {
		if a.String("status") == "off" {
			continue
		}
		chans, _ := a["channel"].([]any)
		for _, c := range chans {
			cm, _ := c.(map[string]any)
			ch := fhir.Resource(cm)
			typ, id, _ := fhir.SplitReference(ch.Ref("endpoint"))
			btyp, bot, _ := fhir.SplitReference(ch.Ref("targetReference"))
			if typ != "Endpoint" || btyp != "Bot" {
				continue
			}
			erec, err := s.store.Read(ctx, scope, "Endpoint", id)
			if err != nil {
				continue
			}
			ep, err := erec.Resource()
			if err != nil {
				continue
			}
			u, err := url.Parse(ep.String("address"))
			if err != nil || u.Scheme != "mllp" || u.Port() != l.port {
				continue
			}
			if found != nil {
				return nil, fmt.Errorf("more than one Agent channel has an mllp:// endpoint on port %s", l.port)
			}
			found = &channel{agent: a.ID(), name: ch.String("name"), bot: bot}
			if exts, ok := cm["extension"].([]any); ok {
				for _, e := range exts {
					em, _ := e.(map[string]any)
					switch em["url"] {
					case PartitionKeyExtension:
						found.partitionKey, _ = em["valueString"].(string)
					case AckModeExtension:
						switch mode, _ := em["valueCode"].(string); mode {
						case AckApplication:
							found.application = true
						case AckCommit:
						default:
							return nil, fmt.Errorf("the channel's acknowledgement mode %q is neither %q nor %q", mode, AckCommit, AckApplication)
						}
					}
				}
			}
		}
	}
	if found == nil {
		return nil, fmt.Errorf("no Agent channel has an mllp:// endpoint on port %s", l.port)
	}
	l.mu.Lock()
	l.cached, l.expiry = found, time.Now().Add(channelCacheTTL)
	l.mu.Unlock()
	return found, nil
}

// run runs a kept message's bot, as the Bot's own membership. A failure (a
// timeout, a trap, a thrown error) is tried again, up to MaxAttempts; an
// error the bot answered with its own status is final. A message given up
// is written as a failed message (an AsyncJob) for the project's admins.
func (s *Service) run(ctx context.Context, job *jobs.Job) error {
	var t task
	if err := json.Unmarshal(job.Payload, &t); err != nil {
		return jobs.Permanent(err)
	}
	if job.Attempt == 1 && t.Record == "" {
		s.metrics.botStart.Observe(time.Since(t.Received).Seconds())
	}
	final := job.Attempt >= job.MaxAttempts
	application := t.Mode == AckApplication
	fail := func(err error, permanent bool) error {
		if permanent || final {
			s.metrics.outcomes.WithLabelValues("failed").Inc()
			s.log.Warn("mllp: message's bot failed", "agent", t.Agent, "channel", t.Channel, "control", t.Control, "err", err)
			if _, werr := s.failed(ctx, job, &t, err); werr != nil {
				// Not written: the database failed; try the message again.
				return werr
			}
			return jobs.Permanent(err)
		}
		s.metrics.outcomes.WithLabelValues("retried").Inc()
		return err
	}
	// In application mode a failed run is not tried again: it is written
	// as a failed message, then its answer goes to the connection, which
	// deletes that record once it has told the sender AE (the sender owns
	// the retry); a record whose connection never answered stays.
	appFail := func(out appOutput) error {
		s.metrics.outcomes.WithLabelValues("failed").Inc()
		s.log.Warn("mllp: message's bot failed", "agent", t.Agent, "channel", t.Channel, "control", t.Control, "err", out.Error)
		id, err := s.failed(ctx, job, &t, errors.New(out.Error))
		if err != nil {
			return err
		}
		out.Record = id
		s.answered(ctx, job, &t, out)
		return jobs.Permanent(errors.New(out.Error))
	}
	caller, err := s.cfg.Principal(ctx, "Bot/"+t.Bot)
	if err != nil {
		return err
	}
	if caller == nil || caller.ProjectID != job.Project {
		err := fmt.Errorf("Bot/%s has no membership in the project", t.Bot)
		if application {
			return appFail(appOutput{Error: err.Error(), Failed: true})
		}
		return fail(err, true)
	}
	headers := map[string]string{
		"content-type":          runtime.MediaHL7,
		"x-medplum-agent":       "Agent/" + t.Agent,
		"x-sandbot-channel":     t.Channel,
		"x-sandbot-control-id":  t.Control,
		"x-sandbot-attempt":     strconv.Itoa(job.Attempt),
		"x-forwarded-for":       t.Remote,
		"x-sandbot-received-at": t.Received.UTC().Format(time.RFC3339Nano),
	}
	res, err := s.cfg.Bots.Execute(ctx, bots.Execute{BotID: t.Bot, Caller: caller, Input: []byte(t.Message),
		ContentType: runtime.MediaHL7, Headers: headers, Trigger: bots.TriggerHL7, Entities: []string{"Agent/" + t.Agent},
		Details: []bots.Detail{{Type: "channel", Value: t.Channel}, {Type: "MSH-10", Value: t.Control}, {Type: "ACK", Value: t.Ack},
			{Type: "attempt", Value: strconv.Itoa(job.Attempt)}}})
	if application && ctx.Err() == nil {
		out := botAck(res, err)
		if out.Failed {
			return appFail(out)
		}
		s.answered(ctx, job, &t, out)
	}
	switch {
	case err == nil && res.Thrown:
		return fail(fhir.Errorf(fhir.EInvalid, "the bot failed"), false)
	case err == nil && res.Status >= 400:
		return fail(fhir.Errorf(fhir.EInvalid, "the bot answered %d", res.Status), true)
	case err == nil:
		s.metrics.outcomes.WithLabelValues("ok").Inc()
		if t.Record != "" {
			return s.rerunDone(ctx, t.Record)
		}
		return nil
	case fhir.IsCode(err, fhir.EThrottled):
		var fe *fhir.Error
		after := time.Second
		if errors.As(err, &fe) && fe.RetryAfter > 0 {
			after = fe.RetryAfter
		}
		return &jobs.RetryError{After: after, Reason: err.Error()}
	case fhir.IsCode(err, fhir.EInvalid):
		return fail(err, false)
	case fhir.IsCode(err, fhir.EInternal) || fhir.IsCode(err, fhir.EUnavailable) || ctx.Err() != nil:
		return err
	default:
		return fail(err, true)
	}
}

type metrics struct {
	messages    *prometheus.CounterVec
	framing     *prometheus.CounterVec
	refused     *prometheus.CounterVec
	outcomes    *prometheus.CounterVec
	duplicates  prometheus.Counter
	bytes       prometheus.Counter
	connections prometheus.Gauge
	commitToAck prometheus.Histogram
	botStart    prometheus.Histogram
	batch       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_mllp_messages_total",
			Help: "MLLP messages answered, by acknowledgement code (AA/CA kept, AE/CE not kept, AR/CR rejected; on an application-mode channel, the code of the bot's ACK, or AE).",
		}, []string{"ack"}),
		framing: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_mllp_framing_errors_total",
			Help: "MLLP framing events: garbage between frames, too_large messages, unterminated frames, timeout (idle or slow sender), tls (a failed TLS handshake).",
		}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_mllp_connections_refused_total",
			Help: "MLLP connections closed at once: limit (per listener or per source address), source (not an allowed network).",
		}, []string{"reason"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_mllp_bot_runs_total",
			Help: "Bot runs of kept MLLP messages: ok, retried (a failed attempt tried again), failed (given up).",
		}, []string{"outcome"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_mllp_duplicates_total",
			Help: "MLLP messages whose channel and MSH-10 were kept before within the window: acknowledged, not run again.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_mllp_received_bytes_total",
			Help: "Bytes of MLLP messages received (without framing).",
		}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_mllp_connections",
			Help: "Open MLLP connections.",
		}),
		commitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_mllp_keep_seconds",
			Help:    "Time from a message's arrival to its commit (with its task), just before its acknowledgement is sent.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2.5, 14),
		}),
		botStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_mllp_bot_start_seconds",
			Help:    "Time from a message's arrival to the start of its bot's first run.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_mllp_commit_batch_size",
			Help:    "MLLP messages kept by one transaction (messages of concurrent connections share a commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
	}
	if reg != nil {
		reg.MustRegister(m.messages, m.framing, m.refused, m.outcomes, m.duplicates, m.bytes, m.connections, m.commitToAck, m.botStart, m.batch)
	}
	return m
}
