package main

import (
	"bytes"
	"context"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// A bot author's first hour: `sandbot bot new` writes a bot outside the
// repository that builds with nothing but the SDK's own module and the
// repository's sdk path, whose test runs it through `sandbot bot run`, and
// whose README's commands build, run, deploy and execute it on a real
// server.

func botNew(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runBotCommand(context.Background(), append([]string{"new"}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// repoSDK is this checkout's sdk folder, absolute.
func repoSDK(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "sdk"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// authorEnv is the environment of a bot author's commands: no module proxy
// and an empty module cache, so that anything but the SDK's folder that the
// module needed would fail the build; go.mod read-only (the go command's
// default), so that it must be complete as written; no workspace and no
// toolchain download. The bin directory comes first on PATH, so that
// "sandbot" is the binary under test.
func authorEnv(t *testing.T, bin string, extra ...string) []string {
	t.Helper()
	cache := t.TempDir()
	// The module cache is read-only; let TempDir remove it.
	t.Cleanup(func() {
		filepath.WalkDir(cache, func(p string, d os.DirEntry, err error) error {
			if err == nil {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		// SANDBOT_SDK would hide whether the templates carry the SDK path.
		if !slices.Contains([]string{"GOFLAGS", "GOPROXY", "GOMODCACHE", "GOWORK", "GOTOOLCHAIN", "PATH", "SANDBOT", "SANDBOT_SDK"}, name) {
			env = append(env, kv)
		}
	}
	env = append(env, "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOMODCACHE="+cache, "GOWORK=off", "GOTOOLCHAIN=local",
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	return append(env, extra...)
}

// runIn runs a command in dir with env and returns its combined output,
// failing the test when it fails.
func runIn(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

var shBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")

// readmeScript is the README's shell blocks, in order, as one script that
// stops at the first failing command and prints the Bot's id at the end.
func readmeScript(t *testing.T, dir string) (string, int) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := shBlock.FindAllStringSubmatch(string(readme), -1)
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	for _, b := range blocks {
		script.WriteString(b[1])
	}
	// curl's answers end without a newline.
	script.WriteString("echo; echo \"BOT=$BOT\"\n")
	return script.String(), len(blocks)
}

// runReadme runs the README's commands in dir against a real server, and
// returns their output and the Bot they created, as a client of that Bot's
// project.
func runReadme(t *testing.T, dir string, env []string, wantBlocks int) (string, string, *servertest.Client) {
	t.Helper()
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("the README's commands need %s", tool)
			}
			t.Skipf("the README's commands need %s", tool)
		}
	}
	script, n := readmeScript(t, dir)
	if n != wantBlocks {
		t.Fatalf("README has %d shell blocks, want %d:\n%s", n, wantBlocks, script)
	}
	s := servertest.Start(t, storetest.Backends(t)[0])
	c := s.NewProject(t, "bot-author")
	env = append(env, "BASE="+strings.TrimSuffix(s.URL, "/"), "TOKEN="+c.Token)
	out := runIn(t, dir, env, "bash", "-c", script)
	m := regexp.MustCompile(`(?m)^BOT=([A-Za-z0-9-]+)$`).FindStringSubmatch(out)
	if m == nil || m[1] == "null" {
		t.Fatalf("no Bot id at the end of the README's commands:\n%s", out)
	}
	return out, m[1], c
}

// TestBotNewGo: a Go bot made by `sandbot bot new` in a directory outside
// the repository builds, vets and passes its own tests (including the one
// that runs it through `sandbot bot run`) with no module proxy and an empty
// module cache; its README's commands build it, run it locally, deploy it to
// a real server and execute it there.
func TestBotNewGo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sandbot and a wasm module")
	}
	bin := servertest.BuildBinary(t)
	sdk := repoSDK(t)
	dir := filepath.Join(t.TempDir(), "greeter")
	code, out, errs := botNew(t, "--sdk", sdk, dir)
	if code != 0 {
		t.Fatalf("bot new: %d %s%s", code, out, errs)
	}
	if !strings.Contains(out, "Created a Go bot") || !strings.Contains(out, sdk) {
		t.Errorf("bot new said %q", out)
	}
	var names []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{".gitignore", "README.md", "go.mod", "main.go", "main_test.go"}; !slices.Equal(names, want) {
		t.Fatalf("files %q, want %q", names, want)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	// The whole of what the author's module needs: the SDK, from its folder.
	var directives []string
	for line := range strings.Lines(string(gomod)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "//") {
			directives = append(directives, line)
		}
	}
	want := []string{"module greeter", "go 1.26.0", "require github.com/sandbot/sandbot/sdk v0.0.0",
		"replace github.com/sandbot/sandbot/sdk => " + sdk}
	if !slices.Equal(directives, want) {
		t.Fatalf("go.mod directives\n  %q\nwant\n  %q", directives, want)
	}
	for _, f := range []string{"main.go", "main_test.go"} {
		src, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if formatted, err := format.Source(src); err != nil || !bytes.Equal(formatted, src) {
			t.Errorf("%s is not gofmt'ed (%v)", f, err)
		}
	}

	env := authorEnv(t, bin, "SANDBOT="+bin)
	runIn(t, dir, env, "go", "vet", "./...")
	// Its own tests: the handler on the host, then the module through
	// `sandbot bot run` (SANDBOT names the binary); neither may skip.
	testOut := runIn(t, dir, env, "go", "test", "-v", "-count=1", "./...")
	for _, name := range []string{"TestHandle", "TestBotRun"} {
		if !strings.Contains(testOut, "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass:\n%s", name, testOut)
		}
	}

	// The README, as the author would run it: sandbot on PATH, no SANDBOT.
	env = authorEnv(t, bin)
	out, bot, c := runReadme(t, dir, env, 5)
	for _, s := range []string{
		`{"result":{"greeting":"Hello, Ada"}}`, // sandbot bot run's envelope
		"[info] greeting Ada",                  // and the bot's log
		"All OK",                               // $deploy
		`{"greeting":"Hello, Ada"}`,            // $execute
	} {
		if !strings.Contains(out, s) {
			t.Errorf("the README's commands did not print %s:\n%s", s, out)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "bot.wasm")); err != nil || st.Size() == 0 {
		t.Fatalf("the README's build made no bot.wasm: %v", err)
	}
	// The deployed module answers on the server, whoever calls.
	r := c.Do("POST", "fhir/R4/Bot/"+bot+"/$execute", map[string]any{"name": "Grace"}, "application/json")
	if r.Status != 200 || strings.TrimSpace(string(r.Body)) != `{"greeting":"Hello, Grace"}` {
		t.Fatalf("$execute: %d %s", r.Status, r.Body)
	}
	// Building wrote nothing into the module's files: go.mod was complete.
	if after, _ := os.ReadFile(filepath.Join(dir, "go.mod")); !bytes.Equal(after, gomod) {
		t.Errorf("go.mod changed:\n%s", after)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.sum")); err == nil {
		t.Errorf("a go.sum appeared: the module needed more than the SDK's folder")
	}
}

// TestBotNewJavaScript: a JavaScript bot made by `sandbot bot new --lang js`
// passes its own test (node --test, through `sandbot bot run`), and its
// README's commands run it locally, deploy it to a real server and execute
// it there.
func TestBotNewJavaScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sandbot")
	}
	// Built first: botRun moves XDG_CACHE_HOME, and with it the Go build
	// cache of any later build.
	bin := servertest.BuildBinary(t)
	dir := filepath.Join(t.TempDir(), "js greeter") // a name the templates must make safe
	code, out, errs := botNew(t, dir, "--lang", "js")
	if code != 0 {
		t.Fatalf("bot new: %d %s%s", code, out, errs)
	}
	var names []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"README.md", "index.js", "index.test.js", "package.json"}; !slices.Equal(names, want) {
		t.Fatalf("files %q, want %q", names, want)
	}
	if pkg, _ := os.ReadFile(filepath.Join(dir, "package.json")); !strings.Contains(string(pkg), `"name": "js-greeter"`) {
		t.Errorf("package.json %s", pkg)
	}
	code, out, errs = botRun(t, `{"name":"Ada"}`, "run", filepath.Join(dir, "index.js"), "--input", "-")
	jsAvailable(t, code, errs)
	if code != 0 || out != `{"result":{"greeting":"Hello, Ada"}}`+"\n" {
		t.Fatalf("bot run: code %d out %q err %q", code, out, errs)
	}

	if _, err := exec.LookPath("node"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("the JavaScript bot's test needs node")
		}
		t.Skip("the JavaScript bot's test needs node")
	}
	testOut := runIn(t, dir, authorEnv(t, bin, "SANDBOT="+bin), "node", "--test", "--test-reporter=tap")
	for _, s := range []string{"# pass 1", "# fail 0", "# skipped 0"} {
		if !strings.Contains(testOut, s) {
			t.Errorf("node --test: no %q:\n%s", s, testOut)
		}
	}

	out, bot, c := runReadme(t, dir, authorEnv(t, bin), 4)
	for _, s := range []string{`{"result":{"greeting":"Hello, Ada"}}`, "[info] greeting Ada", "All OK", `{"greeting":"Hello, Ada"}`} {
		if !strings.Contains(out, s) {
			t.Errorf("the README's commands did not print %s:\n%s", s, out)
		}
	}
	r := c.Do("GET", "fhir/R4/Bot/"+bot, nil, "")
	if r.Status != 200 || r.JSON()["runtimeVersion"] != "vmcontext" {
		t.Fatalf("Bot: %d %s", r.Status, r.Body)
	}
	r = c.Do("POST", "fhir/R4/Bot/"+bot+"/$execute", map[string]any{"name": "Grace"}, "application/json")
	if r.Status != 200 || strings.TrimSpace(string(r.Body)) != `{"greeting":"Hello, Grace"}` {
		t.Fatalf("$execute: %d %s", r.Status, r.Body)
	}
}

// TestBotNewRefuses: a directory that is not empty is left alone, and bad
// arguments are usage errors.
func TestBotNewRefuses(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "main.go")
	if err := os.WriteFile(keep, []byte("package mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs := botNew(t, "--sdk", repoSDK(t), dir)
	if code != 1 || !strings.Contains(errs, "is not empty") {
		t.Fatalf("non-empty dir: code %d err %q", code, errs)
	}
	if b, _ := os.ReadFile(keep); string(b) != "package mine\n" {
		t.Fatalf("main.go was changed: %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("%d files in the refused directory", len(entries))
	}
	for _, c := range []struct {
		args []string
		code int
		err  string
	}{
		{nil, 2, "Usage: sandbot bot new"},
		{[]string{"--lang", "rust", filepath.Join(t.TempDir(), "x")}, 2, `--lang "rust"`},
		{[]string{"a", "b"}, 2, `unexpected argument "b"`},
		{[]string{"--module", "has space", filepath.Join(t.TempDir(), "x")}, 2, "is not a module path"},
		{[]string{"--sdk", t.TempDir(), filepath.Join(t.TempDir(), "x")}, 1, "not the SDK's folder"},
		{[]string{"--sdk", filepath.Join("..", ".."), filepath.Join(t.TempDir(), "x")}, 1, "its go.mod is module github.com/sandbot/sandbot, not"},
	} {
		if code, _, errs := botNew(t, c.args...); code != c.code || !strings.Contains(errs, c.err) {
			t.Errorf("%q: code %d err %q, want %d and %q", c.args, code, errs, c.code, c.err)
		}
	}
}

// TestBotNewFindsTheSDK: without --sdk, a binary built from a checkout (as
// this test binary is, without -trimpath) writes that checkout's sdk folder
// into go.mod; SANDBOT_SDK chooses another.
func TestBotNewFindsTheSDK(t *testing.T) {
	t.Setenv("SANDBOT_SDK", "")
	dir := filepath.Join(t.TempDir(), "found")
	if code, _, errs := botNew(t, dir, "--module", "example.com/bots/found"); code != 0 {
		t.Fatalf("bot new: %d %s", code, errs)
	}
	gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	if !strings.Contains(string(gomod), "module example.com/bots/found\n") ||
		!strings.Contains(string(gomod), "replace github.com/sandbot/sandbot/sdk => "+repoSDK(t)+"\n") {
		t.Fatalf("go.mod:\n%s", gomod)
	}

	// An SDK (its go.mod is what marks it) in a path go.mod must quote.
	other := filepath.Join(t.TempDir(), "my sdk")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "go.mod"), []byte("module github.com/sandbot/sandbot/sdk\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SANDBOT_SDK", other)
	dir = filepath.Join(t.TempDir(), "elsewhere")
	if code, _, errs := botNew(t, dir); code != 0 {
		t.Fatalf("bot new: %d %s", code, errs)
	}
	gomod, _ = os.ReadFile(filepath.Join(dir, "go.mod"))
	if !strings.Contains(string(gomod), `replace github.com/sandbot/sandbot/sdk => "`+other+`"`) {
		t.Fatalf("go.mod:\n%s", gomod)
	}
	// The quoted path is one go.mod reads.
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Replace.Dir}}", "github.com/sandbot/sandbot/sdk")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOFLAGS=-mod=readonly")
	got, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(got)) != other {
		t.Fatalf("go list: %v %s", err, got)
	}
}
