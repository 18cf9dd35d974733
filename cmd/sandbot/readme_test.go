package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestReadmeQuickstart is what a newcomer does in their first hour, on what
// `git clone` gives them: in a fresh clone of this repository's HEAD, in an
// empty directory, it
//
//  1. builds the binary the plain Go way (no engine): it serves WebAssembly
//     bots and says at start, in its log, that JavaScript bots are off and
//     what to run;
//  2. runs the README's quickstart as written, in one bash: the "Quickstart
//     with curl" blocks (which start the server with the README's first
//     command, the one block of "The two commands") and then every block of
//     "Bots" that promises an answer (WebAssembly, JavaScript, a bot that
//     calls the FHIR API), checking each answer a comment promises.
//
// The only change to the README's text is the two ports, replaced by free
// ones (and given to the server) so that the test can run beside a server or
// another run of itself; the test checks that they are the defaults. It
// needs git, make, npm, curl, jq and bash, fetches the engine with npm ci and
// compiles the server: slow, so not with -short; `make test` runs it.
func TestReadmeQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a fresh clone, npm ci and go build (runs in make test)")
	}
	if goruntime.GOOS != "linux" && goruntime.GOOS != "darwin" {
		t.Skip("the README's commands are for a POSIX shell")
	}
	for _, tool := range []string{"git", "make", "npm", "curl", "jq", "bash", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is needed (.ci/run installs it): %v", tool, err)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	first, quickstart, bots := readmeBlocks(t, string(readme))

	// The README's localhost:8103 and :9103 are the server's defaults.
	clearEnv(t)
	cfg, _ := loadConfig("serve", nil, io.Discard)
	if cfg == nil || cfg.Addr != ":8103" || cfg.MetricsAddr != ":9103" {
		t.Fatalf("the README's ports are not the defaults: %+v", cfg)
	}

	clone := freshClone(t)
	env := userEnv()

	t.Run("a binary built without the engine", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "sandbot")
		build := exec.Command("go", "build", "-o", bin, "./cmd/sandbot")
		build.Dir, build.Env = clone, env
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build in a fresh clone: %v\n%s", err, out)
		}
		p := servertest.StartProcess(t, bin, t.TempDir(), "")
		waitFor(t, "the log line saying JavaScript bots are off", func() bool {
			return strings.Contains(p.Output.String(), jsOffMessage)
		})
		if !strings.Contains(jsOffMessage, "make run") {
			t.Errorf("the log line must say what to run: %s", jsOffMessage)
		}
		c := p.SuperAdmin(t)
		wasm, err := os.ReadFile(filepath.Join(clone, "examples/hello/hello.wasm"))
		if err != nil {
			t.Fatal(err)
		}
		id := c.Create(map[string]any{"resourceType": "Bot", "name": "hello"})["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", wasm, "application/wasm"); r.Status != 200 {
			t.Fatalf("WebAssembly deploy: %d %s", r.Status, r.Body)
		}
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$execute", `{"name":"Ada"}`, "application/json"); r.Status != 200 || string(r.Body) != `{"greeting":"Hello, Ada"}` {
			t.Errorf("WebAssembly execute: %d %s", r.Status, r.Body)
		}
		js := c.Create(map[string]any{"resourceType": "Bot", "name": "hello-js", "runtimeVersion": "vmcontext"})["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+js+"/$deploy", "exports.handler = async () => 1;", "application/javascript"); r.Status != 400 || !strings.Contains(r.Issue(), "make js") {
			t.Errorf("JavaScript deploy without the engine: want a 400 naming make js: %d %s", r.Status, r.Body)
		}
		p.Kill()
	})

	t.Run("the README's quickstart", func(t *testing.T) {
		if !strings.Contains(strings.Join(quickstart, "\n"), "\n"+first+" ") && !strings.HasPrefix(strings.Join(quickstart, "\n"), first+" ") {
			t.Fatalf("the quickstart does not start the server with the first command %q", first)
		}
		var steps []readmeStep
		for _, b := range append(quickstart, bots...) {
			steps = append(steps, readmeSteps(t, b)...)
		}
		all := ""
		promised := 0
		for _, s := range steps {
			all += s.cmd + "\n"
			if s.promise != "" {
				promised++
			}
		}
		for _, want := range []string{"application/wasm", "application/javascript", "examples/js/patients.js"} {
			if !strings.Contains(all, want) {
				t.Fatalf("the README's quickstart no longer shows %s", want)
			}
		}
		if promised < 5 {
			t.Fatalf("only %d of the README's commands promise an answer", promised)
		}

		api, ops := freePort(t), freePort(t)
		ports := strings.NewReplacer("localhost:8103", "localhost:"+api, "localhost:9103", "localhost:"+ops)
		var script strings.Builder
		for i, s := range steps {
			fmt.Fprintf(&script, "%s\nprintf '\\n@@readme-step-%d@@\\n'\n", ports.Replace(s.cmd), i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		if d, ok := t.Deadline(); ok {
			ctx, cancel = context.WithDeadline(context.Background(), d.Add(-time.Minute))
		}
		defer cancel()
		sh := exec.CommandContext(ctx, "bash", "-c", script.String())
		sh.Dir = clone
		sh.Env = append(env, "SANDBOT_ADDR=:"+api, "SANDBOT_METRICS_ADDR=:"+ops, "SANDBOT_BASE_URL=http://localhost:"+api+"/")
		// Its own process group, which the server the script leaves running
		// in the background (make, go run, sandbot) stays in: stopped below.
		sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		sh.Cancel = func() error { return syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) }
		sh.WaitDelay = 10 * time.Second
		var stdout, stderr bytes.Buffer
		sh.Stdout, sh.Stderr = &stdout, &stderr
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopGroup(t, sh.Process.Pid) })
		err := sh.Wait()
		serverLog, _ := os.ReadFile(filepath.Join(clone, "sandbot.log"))
		if err != nil {
			t.Fatalf("the quickstart's script: %v\nstderr:\n%s\nstdout:\n%s\nsandbot.log:\n%s", err, stderr.String(), stdout.String(), serverLog)
		}
		out := stdout.String()
		failed := false
		for i, s := range steps {
			marker := fmt.Sprintf("\n@@readme-step-%d@@\n", i)
			before, after, ok := strings.Cut(out, marker)
			if !ok {
				t.Fatalf("step %d did not finish: %s\nstdout:\n%s", i, s.cmd, stdout.String())
			}
			out = after
			if s.promise == "" {
				continue
			}
			if err := answerMatches(s.promise, before); err != nil {
				failed = true
				t.Errorf("README, line %d of its block:\n%s\n  promises %s\n  answered %s\n  %v", s.line, s.cmd, s.promise, strings.TrimSpace(before), err)
			}
		}
		t.Logf("ran the README's %d commands; %d answers checked against its promises", len(steps), promised)
		if failed {
			t.Logf("stderr:\n%s\nsandbot.log:\n%s", stderr.String(), serverLog)
		}
	})
}

// readmeBlocks finds the README's first command (the block of "The two
// commands" that runs the server), the blocks of "Quickstart with curl"
// before its first subsection, and the blocks of "Bots" that promise an
// answer.
func readmeBlocks(t *testing.T, readme string) (first string, quickstart, bots []string) {
	t.Helper()
	two := shBlocks(section(readme, "## The two commands", false))
	if len(two) == 0 {
		t.Fatal(`README: no sh block under "## The two commands"`)
	}
	for _, l := range strings.Split(two[0], "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			if first != "" {
				t.Fatalf("README: the first command is more than one line: %q", two[0])
			}
			first = l
		}
	}
	quickstart = shBlocks(section(readme, "## Quickstart with curl", true))
	if len(quickstart) == 0 {
		t.Fatal(`README: no sh block under "## Quickstart with curl"`)
	}
	for _, b := range shBlocks(section(readme, "## Bots", false)) {
		for _, s := range readmeSteps(t, b) {
			if s.promise != "" {
				bots = append(bots, b)
				break
			}
		}
	}
	return first, quickstart, bots
}

// section is the README's text from the heading line until the next heading
// of its level or above (or, with sub, of any level), outside code blocks.
func section(readme, heading string, sub bool) string {
	level := strings.Index(heading, " ")
	var out []string
	in, fenced := false, false
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(l, "#") {
			n := len(l) - len(strings.TrimLeft(l, "#"))
			if in && (n <= level || sub) {
				break
			}
			if l == heading {
				in = true
				continue
			}
		}
		if in {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// shBlocks are the ```sh blocks of text.
func shBlocks(text string) []string {
	var out []string
	var cur []string
	in := false
	for _, l := range strings.Split(text, "\n") {
		switch {
		case !in && strings.TrimSpace(l) == "```sh":
			in, cur = true, nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			out = append(out, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, l)
		}
	}
	return out
}

// readmeStep is one command of a block (its continuation lines joined) and
// the answer a comment promises for it: a JSON comment at the end of its
// last line, or on the line after it.
type readmeStep struct {
	cmd, promise string
	line         int // in its block
}

var trailingPromise = regexp.MustCompile(`\s#\s+([\[{].*)$`)

func readmeSteps(t *testing.T, block string) []readmeStep {
	t.Helper()
	var steps []readmeStep
	var cur []string
	for i, l := range strings.Split(block, "\n") {
		trimmed := strings.TrimSpace(l)
		if len(cur) == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			if p := strings.TrimSpace(strings.TrimPrefix(trimmed, "#")); len(steps) > 0 && steps[len(steps)-1].promise == "" && json.Valid([]byte(p)) {
				steps[len(steps)-1].promise = p
			}
			continue
		}
		cur = append(cur, l)
		if strings.HasSuffix(l, `\`) {
			continue
		}
		s := readmeStep{cmd: strings.Join(cur, "\n"), line: i + 1}
		if m := trailingPromise.FindStringSubmatch(l); m != nil && json.Valid([]byte(strings.TrimSpace(m[1]))) {
			s.promise = strings.TrimSpace(m[1])
		}
		steps = append(steps, s)
		cur = nil
	}
	if len(cur) > 0 {
		t.Fatalf("README: a block ends in a continuation line: %q", block)
	}
	return steps
}

// answerMatches checks an answer against what the README promises: the same
// JSON, where a promised object's fields must be in the answer's (which may
// have more: the README shows what matters), arrays have the same length,
// and "…" in a promised string stands for any text.
func answerMatches(promise, answer string) error {
	var want, got any
	if err := json.Unmarshal([]byte(promise), &want); err != nil {
		return fmt.Errorf("the promise is not JSON: %v", err)
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(answer)), &got); err != nil {
		return fmt.Errorf("the answer is not JSON: %v", err)
	}
	return matchJSON("", want, got)
}

func matchJSON(path string, want, got any) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object", path)
		}
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s.%s: missing", path, k)
			}
			if err := matchJSON(path+"."+k, v, gv); err != nil {
				return err
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: want an array of %d", path, len(w))
		}
		for i := range w {
			if err := matchJSON(path+"["+strconv.Itoa(i)+"]", w[i], g[i]); err != nil {
				return err
			}
		}
	case string:
		g, _ := got.(string)
		parts := strings.Split(w, "…")
		for i := range parts {
			parts[i] = regexp.QuoteMeta(parts[i])
		}
		if !regexp.MustCompile(`^` + strings.Join(parts, `.+`) + `$`).MatchString(g) {
			return fmt.Errorf("%s: %q does not match %q", path, got, w)
		}
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	return nil
}

// freshClone clones the repository this test runs in (its HEAD: what is
// committed, as CI's .ci/run tests it) into an empty directory.
func freshClone(t *testing.T) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("not in a git repository: %v", err)
	}
	src := strings.TrimSpace(string(top))
	head, err := exec.Command("git", "-C", src, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := exec.Command("git", "-C", src, "status", "--porcelain").Output(); len(st) > 0 {
		t.Logf("the checkout has uncommitted changes; only its HEAD %s is tested", strings.TrimSpace(string(head)))
	}
	dir := filepath.Join(t.TempDir(), "sandbot")
	for _, args := range [][]string{{"clone", "--quiet", src, dir}, {"-C", dir, "checkout", "--quiet", "--detach", strings.TrimSpace(string(head))}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	// Nothing fetched is committed: the clone has no engine until make js.
	dist, err := os.ReadDir(filepath.Join(dir, "runtime/jsengine/dist"))
	if err != nil || len(dist) != 1 || dist[0].Name() != ".keep" {
		t.Fatalf("runtime/jsengine/dist of a fresh clone must hold only .keep: %v %v", dist, err)
	}
	return dir
}

// userEnv is this process's environment as a user's shell would have it:
// without SANDBOT_* (the README sets what it needs) and without what an
// enclosing make passes to its sub-makes.
func userEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "SANDBOT_"), k == "MAKEFLAGS", k == "MFLAGS", k == "MAKELEVEL", k == "MAKEOVERRIDES":
			continue
		}
		env = append(env, kv)
	}
	return env
}

func freePort(t *testing.T) string {
	_, port, err := net.SplitHostPort(servertest.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// stopGroup stops what is left of process group pgid (the server the
// quickstart started in the background): SIGINT, which the server takes as
// an interactive stop (no drain), then SIGKILL if it has not ended.
func stopGroup(t *testing.T, pgid int) {
	syscall.Kill(-pgid, syscall.SIGINT)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, 0} {
		deadline := time.Now().Add(30 * time.Second)
		for groupAlive(pgid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if !groupAlive(pgid) {
			return
		}
		if sig != 0 {
			syscall.Kill(-pgid, sig)
		}
	}
	t.Errorf("process group %d did not end", pgid)
}

// groupAlive reports whether a process of group pgid is still running (not
// a zombie waiting for a parent that may never reap it).
func groupAlive(pgid int) bool {
	if goruntime.GOOS != "linux" {
		return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) > 2 && fields[0] != "Z" && fields[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}
