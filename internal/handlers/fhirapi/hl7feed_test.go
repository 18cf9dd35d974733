package fhirapi_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/internal/mllp"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/hl7feed"
	"github.com/sandbot/sandbot/sdk/hl7"
)

// hl7RecorderBot records each message as a Basic: "<MSH-10> <content type>
// <PID-3.1> <channel>", and answers the message's ACK (unused in the
// default mode).
const hl7RecorderBot = `exports.handler = async (medplum, event) => {
  const m = event.input;
  const pid = m.getSegment('PID');
  await medplum.createResource({ resourceType: 'Basic', code: { text: m.getSegment('MSH').getField(10).toString() + ' ' +
    event.contentType + ' ' + (pid ? pid.getField(3).getComponent(1) : '') + ' ' + event.headers['x-sandbot-channel'] } });
  return m.buildAck();
};`

// feed is a test server with one MLLP listener feeding a project with an
// Agent whose channel runs the recorder bot.
type feed struct {
	s    *servertest.Server
	c    *servertest.Client
	addr string
	bot  string
}

// newFeedFor wires the server's listener to a project: the project (with the
// listener's id), the recorder bot, an Endpoint on the listener's port and an
// Agent channel to the bot.
func newFeedFor(t testing.TB, s *servertest.Server, project, partitionKey string) *feed {
	t.Helper()
	var exts []any
	if partitionKey != "" {
		exts = append(exts, map[string]any{"url": hl7feed.PartitionKeyExtension, "valueString": partitionKey})
	}
	return newFeedWith(t, s, project, map[string]any{"name": "hl7-recorder", "runtimeVersion": "vmcontext"}, hl7RecorderBot, exts)
}

// newFeedWith is newFeedFor with the Bot's fields, its code and the
// channel's extensions chosen.
func newFeedWith(t testing.TB, s *servertest.Server, project string, bot map[string]any, code string, exts []any) *feed {
	t.Helper()
	addr := s.HL7.Addrs()[0].String()
	c := s.NewProjectWithID(t, project, "hl7 feed")
	id := createMemberBot(t, c, bot)
	deployJSCode(t, c, id, bot["name"].(string), code)
	_, port, _ := net.SplitHostPort(addr)
	ep := c.Create(map[string]any{"resourceType": "Endpoint", "status": "active", "address": "mllp://0.0.0.0:" + port,
		"connectionType": map[string]any{"code": "hl7-mllp"}, "payloadType": []any{map[string]any{"text": "HL7"}}})
	ch := map[string]any{"name": "adt", "endpoint": map[string]any{"reference": "Endpoint/" + ep["id"].(string)},
		"targetReference": map[string]any{"reference": "Bot/" + id}}
	if len(exts) > 0 {
		ch["extension"] = exts
	}
	c.Create(map[string]any{"resourceType": "Agent", "name": "feed", "status": "active", "channel": []any{ch}})
	return &feed{s: s, c: c, addr: addr, bot: id}
}

func mllpOptions(project string, extra func(*server.Config)) servertest.Option {
	return func(cfg *server.Config) {
		cfg.MLLP = []hl7feed.Listener{{Addr: "127.0.0.1:0", Project: project}}
		if extra != nil {
			extra(cfg)
		}
	}
}

// conn is an MLLP client connection.
type conn struct {
	t *testing.T
	net.Conn
	r *mllp.Reader
}

func dialMLLP(t *testing.T, addr string) *conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{t: t, Conn: c, r: mllp.NewReader(c, 1<<20)}
}

// send writes raw bytes and reads one acknowledgement: its MSA-1, MSA-2 and
// ERR segment (if any).
func (c *conn) send(raw []byte) (code, ctl string, ack *hl7.Message) {
	c.t.Helper()
	if _, err := c.Write(raw); err != nil {
		c.t.Fatal(err)
	}
	return c.readAck()
}

func (c *conn) readAck() (code, ctl string, ack *hl7.Message) {
	c.t.Helper()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, err := c.r.ReadFrame()
	if err != nil {
		c.t.Fatalf("reading the ACK: %v", err)
	}
	m, err := hl7.Parse(b)
	if err != nil {
		c.t.Fatalf("ACK %q: %v", b, err)
	}
	return m.Value("MSA-1"), m.Value("MSA-2"), m
}

// adt is an ADT^A08 with control id ctl for patient pid.
func adt(ctl, pid string) []byte {
	return []byte("MSH|^~\\&|SEND|FAC|RECV|FAC|20250101120000||ADT^A08^ADT_A01|" + ctl + "|P|2.5\r" +
		"EVN|A08|20250101120000\rPID|1||" + pid + "^^^MRN^MR||Doe^Jane||19800101|F\r")
}

// TestHL7FeedOverMLLP: the ADT^A01 of the corpus reaches the channel's bot
// as x-application/hl7-v2+er7 after an AA; the same MSH-10 sent again is
// answered AA and not run again; MSH-15 asks for CA; a malformed message is
// AR with an ERR segment and the connection still answers the next one; an
// oversized one is AR; a channel's messages run in the order they came;
// the AuditEvent of each run names the Agent.
func TestHL7FeedOverMLLP(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedFor(t, s, project, "")
		adtA01, err := os.ReadFile("testdata/hl7/ADT-A01-01.hl7")
		if err != nil {
			t.Fatal(err)
		}
		adtA01 = bytes.TrimRight(bytes.ReplaceAll(adtA01, []byte("\n"), []byte("\r")), "\r")
		c := dialMLLP(t, f.addr)
		if code, ctl, _ := c.send(mllp.Frame(adtA01)); code != "AA" || ctl != "MSG00001" {
			t.Fatalf("ADT^A01: %s %s", code, ctl)
		}
		got := recorded(t, f.c, 1)
		if len(got) != 1 || got[0] != "MSG00001 x-application/hl7-v2+er7 PATID1234 adt" {
			t.Fatalf("the bot recorded %q", got)
		}
		// The same control id again: AA, and the bot does not run again.
		if code, ctl, _ := c.send(mllp.Frame(adtA01)); code != "AA" || ctl != "MSG00001" {
			t.Fatalf("resend: %s %s", code, ctl)
		}
		// Enhanced mode.
		enhanced := []byte("MSH|^~\\&|S|F|R|F|20250101||ADT^A08|ENH1|P|2.5|||AL|NE\rPID|1||E1^^^MRN\r")
		if code, _, _ := c.send(mllp.Frame(enhanced)); code != "CA" {
			t.Fatalf("enhanced: %s", code)
		}
		// Malformed (a segment name that is not one): AR with ERR, and the
		// connection goes on.
		code, ctl, ack := c.send(mllp.Frame([]byte("MSH|^~\\&|S|F|R|F|20250101||ADT^A08|BAD1|P|2.5\rP!D|1\r")))
		if code != "AR" || ctl != "BAD1" || !ack.Segment("ERR", 1).Exists() {
			t.Fatalf("malformed: %s %s %q", code, ctl, ack.Bytes())
		}
		// Not HL7 at all, garbage between frames, then an oversized one.
		if code, _, _ := c.send(append([]byte("noise\r\n"), mllp.Frame([]byte("hello"))...)); code != "AR" {
			t.Fatalf("not HL7: %s", code)
		}
		big := append(adt("BIG1", "X"), bytes.Repeat([]byte("NTE|1||"+strings.Repeat("x", 1000)+"\r"), 70)...)
		if code, _, _ := c.send(mllp.Frame(big)); code != "AR" {
			t.Fatalf("oversized: %s", code)
		}
		// Order: 30 messages on the channel, some over two connections in
		// turn, one split across many writes, run in the order they were
		// kept.
		c2 := dialMLLP(t, f.addr)
		var want []string
		for i := range 30 {
			ctl := fmt.Sprintf("ORD%02d", i)
			want = append(want, ctl)
			cc := c
			if i%3 == 1 {
				cc = c2
			}
			frame := mllp.Frame(adt(ctl, "P"+ctl))
			if i == 7 {
				for _, b := range frame {
					cc.Write([]byte{b})
				}
				if code, _, _ := cc.readAck(); code != "AA" {
					t.Fatalf("split frame: %s", code)
				}
				continue
			}
			if code, got, _ := cc.send(frame); code != "AA" || got != ctl {
				t.Fatalf("%s: %s %s", ctl, code, got)
			}
		}
		all := recorded(t, f.c, 32)
		time.Sleep(300 * time.Millisecond)
		all = recorded(t, f.c, 32)
		var order []string
		for _, r := range all {
			if strings.HasPrefix(r, "ORD") {
				order = append(order, strings.Fields(r)[0])
			}
		}
		if len(all) != 32 || strings.Join(order, ",") != strings.Join(want, ",") {
			t.Fatalf("the bot ran %d times, in the order %v", len(all), order)
		}
		// Each run's AuditEvent names the Agent (they are written in the
		// background).
		var entries []any
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			events := f.c.Do("GET", "fhir/R4/AuditEvent?entity=Bot/"+f.bot+"&_count=100", nil, "").JSON()
			if entries, _ = events["entry"].([]any); len(entries) >= 32 {
				break
			}
		}
		agents := 0
		for _, e := range entries {
			for _, en := range servertest.Field(e, "resource", "entity").([]any) {
				if ref, _ := servertest.Field(en, "what", "reference").(string); strings.HasPrefix(ref, "Agent/") {
					agents++
				}
			}
		}
		if agents != 32 {
			t.Errorf("%d AuditEvents name the Agent, want 32", agents)
		}
		if v := servertest.MetricValue(t, s.Registry, "sandbot_mllp_duplicates_total"); v != 1 {
			t.Errorf("duplicates metric %v", v)
		}
	}, mllpOptions(project, func(cfg *server.Config) { cfg.Limits.MLLPMessageBytes = 64 << 10 }))
}

// TestHL7FeedPartitionKey: with PID-3.1 as the channel's partition key, each
// patient's messages run in order while four patients' interleave.
func TestHL7FeedPartitionKey(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedFor(t, s, project, "PID-3.1")
		var wg sync.WaitGroup
		const patients, each = 4, 8
		for p := range patients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := dialMLLP(t, f.addr)
				for i := range each {
					ctl := fmt.Sprintf("P%d-%02d", p, i)
					c.Write(mllp.Frame(adt(ctl, fmt.Sprintf("PAT%d", p))))
					if code, _, _ := c.readAck(); code != "AA" {
						t.Errorf("%s: %s", ctl, code)
						return
					}
				}
			}()
		}
		wg.Wait()
		all := recorded(t, f.c, patients*each)
		if len(all) != patients*each {
			t.Fatalf("the bot ran %d times: %q", len(all), all)
		}
		next := map[string]int{}
		for _, r := range all {
			fields := strings.Fields(r)
			var p, i int
			fmt.Sscanf(fields[0], "P%d-%d", &p, &i)
			if fields[2] != fmt.Sprintf("PAT%d", p) || next[fields[2]] != i {
				t.Fatalf("out of order at %q (all: %q)", r, all)
			}
			next[fields[2]]++
		}
	}, mllpOptions(project, nil))
}

// TestHL7FeedBounds: a sender that starts a message and stalls is
// disconnected after the read timeout, an idle one after the idle timeout,
// connections beyond the per-address limit are closed at once, and a port
// no Agent channel names answers AE.
func TestHL7FeedBounds(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		addr := s.HL7.Addrs()[0].String()
		c := s.NewProjectWithID(t, project, "hl7 bounds")
		_ = c
		// No Agent yet: AE.
		first := dialMLLP(t, addr)
		if code, _, ack := first.send(mllp.Frame(adt("NOCH", "X"))); code != "AE" {
			t.Fatalf("no channel: %s %q", code, ack.Bytes())
		}
		first.Close()
		// A stalled message: closed after the read timeout (1 s).
		stalled := dialMLLP(t, addr)
		stalled.Write([]byte("\x0bMSH|^~\\&|"))
		if !closedWithin(stalled, 10*time.Second) {
			t.Error("a stalled sender was not disconnected")
		}
		// An idle connection: closed after the idle timeout (2 s).
		idle := dialMLLP(t, addr)
		if !closedWithin(idle, 10*time.Second) {
			t.Error("an idle connection was not closed")
		}
		// Three connections per address: the fourth is closed at once.
		var open []*conn
		for range 3 {
			open = append(open, dialMLLP(t, addr))
		}
		for _, o := range open {
			o.Write(mllp.Frame(adt("LIM", "X")))
			if code, _, _ := o.readAck(); code != "AE" {
				t.Fatalf("open connection: %s", code)
			}
		}
		extra := dialMLLP(t, addr)
		if !closedWithin(extra, 5*time.Second) {
			t.Error("a connection over the per-address limit was kept")
		}
		if v := servertest.MetricValue(t, s.Registry, "sandbot_mllp_connections_refused_total"); v < 1 {
			t.Errorf("refused connections metric %v", v)
		}
	}, mllpOptions(project, func(cfg *server.Config) {
		cfg.Limits.MLLPReadSeconds = 1
		cfg.Limits.MLLPIdleSeconds = 2
		cfg.Limits.MLLPConnectionsPerAddress = 3
	}))
}

// closedWithin reports whether the server closes c within d.
func closedWithin(c *conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	for {
		_, err := c.Read(buf)
		if err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

// TestHL7FeedBotFailure: a message whose bot keeps throwing is run 4 times
// with backoff, each run's AuditEvent (outcome 4) names the Agent with the
// message's control id and attempt, so failed messages can be listed; the
// channel's next message runs once the failing one is given up.
func TestHL7FeedBotFailure(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedFor(t, s, project, "")
		deployJSCode(t, f.c, f.bot, "hl7-recorder", `exports.handler = async (medplum, event) => {
  const ctl = event.input.getSegment('MSH').getField(10).toString();
  if (ctl.startsWith('FAIL')) throw new Error('cannot handle ' + ctl);
  await medplum.createResource({ resourceType: 'Basic', code: { text: ctl } });
  return event.input.buildAck();
};`)
		c := dialMLLP(t, f.addr)
		for _, ctl := range []string{"FAIL1", "OK1"} {
			if code, _, _ := c.send(mllp.Frame(adt(ctl, "X"))); code != "AA" {
				t.Fatalf("%s: %s", ctl, code)
			}
		}
		if got := recorded(t, f.c, 1); len(got) != 1 || got[0] != "OK1" {
			t.Fatalf("recorded %q", got)
		}
		// The AuditEvents are written in the background.
		agent := agentOf(t, f)
		var entries []any
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			events := f.c.Do("GET", "fhir/R4/AuditEvent?entity=Agent/"+agent+"&outcome=4&_count=20", nil, "").JSON()
			if entries, _ = events["entry"].([]any); len(entries) >= 4 {
				break
			}
		}
		attempts := map[string]bool{}
		for _, e := range entries {
			for _, en := range servertest.Field(e, "resource", "entity").([]any) {
				details, _ := servertest.Field(en, "detail").([]any)
				var ctl, attempt string
				for _, d := range details {
					switch servertest.Field(d, "type") {
					case "MSH-10":
						ctl, _ = servertest.Field(d, "valueString").(string)
					case "attempt":
						attempt, _ = servertest.Field(d, "valueString").(string)
					}
				}
				if ctl == "FAIL1" {
					attempts[attempt] = true
				}
			}
		}
		if len(entries) != 4 || !attempts["1"] || !attempts["4"] || len(attempts) != 4 {
			t.Errorf("%d failed runs listed, attempts %v", len(entries), attempts)
		}
	}, mllpOptions(project, nil))
}

func agentOf(t *testing.T, f *feed) string {
	t.Helper()
	res := f.c.Do("GET", "fhir/R4/Agent?_count=1", nil, "").JSON()
	entries, _ := res["entry"].([]any)
	if len(entries) != 1 {
		t.Fatalf("agents: %v", res)
	}
	return servertest.Field(entries[0], "resource", "id").(string)
}

// TestHL7FeedWithMedplumHl7Client: the reference's own client
// (@medplum/hl7's Hl7Client, compat/hl7-send.mjs) sends the ADT^A01 of the
// corpus twice, then a message asking for enhanced acknowledgements: AA,
// AA (the duplicate), CA; the bot ran twice. Skipped without node and
// compat's node_modules (make compat installs them), unless CI is set.
func TestHL7FeedWithMedplumHl7Client(t *testing.T) {
	// Slow (sockets, a scheduler that looks every 5 s, killed
	// processes) and independent: run beside the other slow ones.
	t.Parallel()
	if _, err := os.Stat("../../../compat/node_modules/@medplum/hl7"); err != nil && os.Getenv("CI") == "" {
		t.Skip("compat/node_modules not installed (cd compat && npm ci)")
	}
	project := uuid.NewString()
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedFor(t, s, project, "")
		enhanced := filepath.Join(t.TempDir(), "enhanced.hl7")
		os.WriteFile(enhanced, []byte("MSH|^~\\&|S|F|R|F|20250101||ADT^A08|ENH1|P|2.5|||AL|NE\rPID|1||E1^^^MRN\r"), 0o644)
		host, port, _ := net.SplitHostPort(f.addr)
		adtA01 := "testdata/hl7/ADT-A01-01.hl7"
		cmd := exec.Command("node", "../../../compat/hl7-send.mjs", host, port, adtA01, adtA01, enhanced)
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != "AA MSG00001\nAA MSG00001\nCA ENH1\n" {
			t.Fatalf("hl7-send: %v\n%s", err, out)
		}
		got := recorded(t, f.c, 2)
		time.Sleep(300 * time.Millisecond)
		if got = recorded(t, f.c, 2); len(got) != 2 || got[0] != "MSG00001 x-application/hl7-v2+er7 PATID1234 adt" || !strings.HasPrefix(got[1], "ENH1 ") {
			t.Fatalf("the bot recorded %q", got)
		}
	}, mllpOptions(project, nil))
}
