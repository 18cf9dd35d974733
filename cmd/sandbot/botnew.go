package main

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

const botNewUsage = `Usage: sandbot bot new [--lang go|js] [--sdk DIR] [--module PATH] <dir>

Creates a bot in dir (made if missing; refused when it is not empty): a
module that builds, a test that runs it through "sandbot bot run", and a
README with the commands to build it, run it locally and deploy it.

  --lang go      (default) a Go bot on the sandbot SDK: go.mod, main.go,
                 main_test.go, README.md, .gitignore. Its go.mod requires the
                 SDK and replaces it with the SDK's folder, nothing else.
  --lang js      a JavaScript bot written as for the reference platform:
                 index.js, index.test.js (node --test), package.json, README.md.
  --sdk DIR      the sdk folder of a sandbot checkout (Go only). Default:
                 $SANDBOT_SDK, else the one this binary was built from when it
                 can be found (the source tree of "go run" or "go build", or
                 the checkout the binary lies in, as bin/sandbot of make build),
                 else the checkout holding the current directory.
  --module PATH  the Go module path (default: the directory's name).
`

// botTemplates are the files "bot new" writes, one folder per language. A
// file's name is its name in the bot without ".tmpl" (which keeps the Go
// tools from taking the Go templates for a package of this module), and
// "gitignore" is written as ".gitignore".
//
//go:embed templates
var botTemplates embed.FS

// sdkModulePath is the SDK's module path: what a bot requires and what
// marks a folder as the SDK.
const sdkModulePath = "github.com/sandbot/sandbot/sdk"

// botNewData fills the templates.
type botNewData struct {
	Name         string // the directory's name, made safe for JSON, shell words and npm
	Module       string // the Go module path
	Package      string // the npm package name
	SDKPath      string // the SDK folder, absolute
	GoModSDKPath string // SDKPath as a go.mod token (quoted when it must be)
	GoVersion    string // the SDK's go directive: the oldest Go that builds it
}

// runBotNew implements "sandbot bot new". args are the arguments after
// "new".
func runBotNew(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("sandbot bot new", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	lang := flags.String("lang", "go", "")
	sdkFlag := flags.String("sdk", "", "")
	module := flags.String("module", "", "")
	// Flags may come before or after the directory.
	var dir string
	for {
		if err := flags.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, botNewUsage)
				return 0
			}
			fmt.Fprintf(stderr, "sandbot bot new: %v\n\n%s", err, botNewUsage)
			return 2
		}
		if flags.NArg() == 0 {
			break
		}
		if dir != "" {
			fmt.Fprintf(stderr, "sandbot bot new: unexpected argument %q\n\n%s", flags.Arg(0), botNewUsage)
			return 2
		}
		dir, args = flags.Arg(0), flags.Args()[1:]
	}
	if dir == "" {
		fmt.Fprint(stderr, botNewUsage)
		return 2
	}
	if *lang != "go" && *lang != "js" {
		fmt.Fprintf(stderr, "sandbot bot new: --lang %q: want go or js\n", *lang)
		return 2
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot new: %v\n", err)
		return 1
	}
	name := safeName(filepath.Base(abs))
	data := botNewData{Name: name, Module: name, Package: strings.ToLower(name)}
	if *module != "" {
		if !validModulePath(*module) {
			fmt.Fprintf(stderr, "sandbot bot new: --module %q is not a module path (letters, digits, and - . _ ~ /)\n", *module)
			return 2
		}
		data.Module = *module
	}
	if *lang == "go" {
		sdkDir, err := findSDK(*sdkFlag)
		if err != nil {
			fmt.Fprintf(stderr, "sandbot bot new: %v\n", err)
			return 1
		}
		data.SDKPath, data.GoModSDKPath = sdkDir, goModToken(sdkDir)
		if data.GoVersion, err = goDirective(filepath.Join(sdkDir, "go.mod")); err != nil {
			fmt.Fprintf(stderr, "sandbot bot new: %v\n", err)
			return 1
		}
	}
	// Never mix a new bot into existing files: an empty or missing directory
	// only.
	switch entries, err := os.ReadDir(abs); {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(abs, 0o755); err != nil {
			fmt.Fprintf(stderr, "sandbot bot new: %v\n", err)
			return 1
		}
	case err != nil:
		fmt.Fprintf(stderr, "sandbot bot new: %v\n", err)
		return 1
	case len(entries) > 0:
		fmt.Fprintf(stderr, "sandbot bot new: %s is not empty: give a new or empty directory\n", dir)
		return 1
	}
	written, err := writeBotFiles(abs, *lang, data)
	if err != nil {
		fmt.Fprintf(stderr, "sandbot bot new: %v\n", err)
		return 1
	}
	what, test := "Go bot", "go test ./..."
	if *lang == "js" {
		what, test = "JavaScript bot", "npm test"
	}
	fmt.Fprintf(stdout, "Created a %s in %s: %s\n", what, dir, strings.Join(written, " "))
	if *lang == "go" {
		fmt.Fprintf(stdout, "Its go.mod uses the SDK at %s.\n", data.SDKPath)
	}
	fmt.Fprintf(stdout, "Next: cd %s && %s (with sandbot on PATH, or SANDBOT naming it); README.md has the commands to build, run and deploy it.\n", dir, test)
	return 0
}

// writeBotFiles executes the templates of lang into dir and returns the
// names of the files written.
func writeBotFiles(dir, lang string, data botNewData) ([]string, error) {
	root := path.Join("templates", lang)
	var written []string
	err := fs.WalkDir(botTemplates, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		src, err := botTemplates.ReadFile(p)
		if err != nil {
			return err
		}
		tmpl, err := template.New(p).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return err
		}
		var out bytes.Buffer
		if err := tmpl.Execute(&out, data); err != nil {
			return err
		}
		rel := strings.TrimSuffix(strings.TrimPrefix(p, root+"/"), ".tmpl")
		if path.Base(rel) == "gitignore" {
			rel = path.Join(path.Dir(rel), ".gitignore")
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		// O_EXCL: a file that appeared meanwhile is not overwritten.
		f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.Write(out.Bytes()); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		written = append(written, rel)
		return nil
	})
	slices.Sort(written)
	return written, err
}

// findSDK returns the SDK folder, absolute: flag, else $SANDBOT_SDK, else
// the checkout this binary comes from or the current directory is in.
func findSDK(flagValue string) (string, error) {
	for _, given := range []struct{ value, what string }{{flagValue, "--sdk"}, {os.Getenv("SANDBOT_SDK"), "SANDBOT_SDK"}} {
		if given.value == "" {
			continue
		}
		dir, err := filepath.Abs(given.value)
		if err == nil {
			err = isSDK(dir)
		}
		if err != nil {
			return "", fmt.Errorf("%s %s: %v", given.what, given.value, err)
		}
		return dir, nil
	}
	var candidates []string
	// Built without -trimpath (go run, go build, go test), the file's path
	// is where it was compiled: cmd/sandbot of a checkout.
	if _, self, _, ok := goruntime.Caller(0); ok && filepath.IsAbs(self) {
		candidates = append(candidates, filepath.Join(filepath.Dir(self), "..", "..", "sdk"))
	}
	// A binary built into the checkout (make build's bin/sandbot), or
	// anywhere below it.
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			candidates = append(candidates, ancestorsSDK(filepath.Dir(exe))...)
		}
	}
	if wd, err := os.Getwd(); err == nil {
		candidates = append(candidates, ancestorsSDK(wd)...)
	}
	for _, c := range candidates {
		if isSDK(c) == nil {
			return filepath.Abs(c)
		}
	}
	return "", errors.New("cannot find the sandbot SDK: give the sdk folder of a sandbot checkout with --sdk DIR (or SANDBOT_SDK)")
}

// ancestorsSDK lists dir/sdk, dir/../sdk, … up to the root.
func ancestorsSDK(dir string) []string {
	var out []string
	for {
		out = append(out, filepath.Join(dir, "sdk"))
		parent := filepath.Dir(dir)
		if parent == dir {
			return out
		}
		dir = parent
	}
}

// isSDK tells whether dir holds the SDK's module.
func isSDK(dir string) error {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return errors.New("not the SDK's folder: no go.mod")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			if strings.Trim(fields[1], "\"`") == sdkModulePath {
				return nil
			}
			return fmt.Errorf("not the SDK's folder: its go.mod is module %s, not %s", fields[1], sdkModulePath)
		}
	}
	return errors.New("not the SDK's folder: its go.mod names no module")
}

// goDirective returns the go version a go.mod declares.
func goDirective(gomod string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		if fields := strings.Fields(line); len(fields) == 2 && fields[0] == "go" {
			return fields[1], nil
		}
	}
	return "", fmt.Errorf("%s has no go directive", gomod)
}

// goModToken writes a path as go.mod reads it: bare when it can be, quoted
// when it holds a space, a quote or a comment marker.
func goModToken(p string) string {
	if strings.ContainsAny(p, " \t\"'`\\") || strings.Contains(p, "//") {
		return strconv.Quote(p)
	}
	return p
}

// safeName makes a directory's name usable as a module path element, an npm
// name and a word inside JSON in shell quotes: letters, digits, - . _ only.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	name := strings.Trim(string(b), "-.")
	if name == "" {
		return "bot"
	}
	return name
}

// validModulePath is a loose check of a Go module path: what go.mod and the
// go command accept, without quoting.
func validModulePath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || strings.Contains(p, "//") {
		return false
	}
	for _, c := range p {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-._~/", c)) {
			return false
		}
	}
	return true
}
