package bots

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// moduleHashExtension records on Bot.executableCode the SHA-256 of the code
// $deploy checked and compiled.
const moduleHashExtension = "https://sandbot.dev/fhir/StructureDefinition/module-sha256"

// isJSBot reports whether the Bot runs JavaScript (docs/decisions.md 12): its
// runtimeVersion is one of the reference's codes, vmcontext or awslambda.
func isJSBot(bot fhir.Resource) bool {
	switch bot.String("runtimeVersion") {
	case "vmcontext", "awslambda":
		return true
	}
	return false
}

// checkRuntimeVersion accepts the Bot runtimes of docs/decisions.md 12: wasm
// (or none) and the reference's vmcontext and awslambda (JavaScript).
func checkRuntimeVersion(bot fhir.Resource) error {
	switch bot.String("runtimeVersion") {
	case "", "wasm", "vmcontext", "awslambda":
		return nil
	}
	return fhir.Invalid("Unsupported bot runtime")
}

func executableCode(bot fhir.Resource) map[string]any {
	code, _ := bot["executableCode"].(map[string]any)
	return code
}

// loadCode reads the code a Bot points at.
func (s *Service) loadCode(ctx context.Context, project string, bot fhir.Resource) ([]byte, error) {
	ref, _ := executableCode(bot)["url"].(string)
	if ref == "" {
		return nil, fhir.Invalid("Bot missing executable code")
	}
	typ, id, ok := fhir.SplitReference(ref)
	if !ok || typ != "Binary" {
		return nil, fhir.Invalid("Executable code is not a Binary")
	}
	rec, err := s.store.Read(ctx, store.ProjectScope(project), "Binary", id)
	if err != nil {
		if fhir.IsCode(err, fhir.ENotFound) || fhir.IsCode(err, fhir.EGone) {
			return nil, fhir.Invalid("Bot executable code not found")
		}
		return nil, err
	}
	bin, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(bin.String("data"))
}

// loadJSCode reads the code a JavaScript Bot points at.
func (s *Service) loadJSCode(ctx context.Context, project string, bot fhir.Resource) ([]byte, error) {
	if ct, _ := executableCode(bot)["contentType"].(string); ct != "" && ct != mediaJS && ct != "text/javascript" {
		return nil, fhir.Invalid("The Bot runs JavaScript (runtimeVersion " + bot.String("runtimeVersion") + ") but its executable code is " + ct + ": deploy JavaScript code")
	}
	return s.loadCode(ctx, project, bot)
}

// module returns the compiled module of a Bot: from the runtime's cache by the
// content hash recorded at deploy (so a redeploy is used by the next
// execution on every replica), compiling from the stored Binary on a miss.
func (s *Service) module(ctx context.Context, project string, bot fhir.Resource) (*runtime.Module, error) {
	if executableCode(bot) == nil {
		return nil, fhir.Invalid("No executable code")
	}
	if mod, ok := s.heldModule(bot); ok {
		return mod, nil
	}
	hash := deployedHash(bot)
	if isJSBot(bot) {
		code, err := s.loadJSCode(ctx, project, bot)
		if err != nil {
			return nil, err
		}
		if err := checkDeployed(code, hash); err != nil {
			return nil, err
		}
		filename, _ := executableCode(bot)["title"].(string)
		mod, err := s.rt.CompileJS(ctx, code, filename)
		if err != nil {
			return nil, jsCodeError(err)
		}
		return mod, nil
	}
	wasm, err := s.loadCode(ctx, project, bot)
	if err != nil {
		return nil, err
	}
	if err := checkDeployed(wasm, hash); err != nil {
		return nil, err
	}
	mod, err := s.rt.Compile(s.sharing(ctx), wasm)
	if err != nil {
		return nil, moduleError(err)
	}
	return mod, nil
}

// heldModule is the Bot's compiled module if the runtime holds it: found by
// the content hash recorded at deploy, and of the Bot's kind (a JavaScript
// bot runs on the JavaScript engine's module).
func (s *Service) heldModule(bot fhir.Resource) (*runtime.Module, bool) {
	hash := deployedHash(bot)
	if hash == "" {
		return nil, false
	}
	mod, ok := s.rt.Lookup(hash)
	if !ok || (mod.Shape() == runtime.JavaScript) != isJSBot(bot) {
		return nil, false
	}
	return mod, true
}

// deployedHash is the module hash $deploy recorded on a Bot, or "".
func deployedHash(bot fhir.Resource) string {
	exts, _ := executableCode(bot)["extension"].([]any)
	for _, e := range exts {
		if m, ok := e.(map[string]any); ok && m["url"] == moduleHashExtension {
			hash, _ := m["valueString"].(string)
			return hash
		}
	}
	return ""
}

// checkDeployed refuses code that is not what $deploy checked and recorded
// (hash): its Binary was rewritten since, which anyone who may write
// Binaries could do.
func checkDeployed(code []byte, hash string) error {
	if hash != "" && runtime.HashBytes(code) != hash {
		return fhir.Invalid("Bot code changed since it was deployed: deploy it again")
	}
	return nil
}

// moduleError maps a Compile failure to the caller's 400.
func moduleError(err error) error {
	var me *runtime.ModuleError
	if errors.As(err, &me) {
		return fhir.Invalid("Invalid bot module: " + me.Reason)
	}
	if errors.Is(err, runtime.ErrJSUnavailable) {
		return fhir.Invalid(err.Error())
	}
	return err
}

// jsCodeError maps a CompileJS failure to the caller's 400.
func jsCodeError(err error) error {
	var me *runtime.ModuleError
	if errors.As(err, &me) {
		e := fhir.Invalid("Invalid bot code: " + me.Reason)
		if me.Line > 0 {
			e.Expression = []string{fmt.Sprintf("line %d, column %d", me.Line, me.Column)}
		}
		return e
	}
	return moduleError(err)
}

// parsedCache keeps decoded resources by id and version. An execution reads
// the Bot and its Project every time (so that a redeploy or a settings
// change applies to the very next execution, on every replica) but decodes
// their JSON only when the version changed. Callers must not modify what
// they get.
type parsedCache struct {
	mu sync.Mutex
	m  map[string]parsedEntry
}

type parsedEntry struct {
	version string
	res     fhir.Resource
}

const parsedCacheMax = 4096

// resource decodes rec, or returns the decoding of the same version.
func (c *parsedCache) resource(rec *fhir.Record) (fhir.Resource, error) {
	c.mu.Lock()
	e, ok := c.m[rec.ID]
	c.mu.Unlock()
	if ok && e.version == rec.VersionID {
		return e.res, nil
	}
	res, err := rec.Resource()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= parsedCacheMax {
		c.m = make(map[string]parsedEntry, 64)
	}
	c.m[rec.ID] = parsedEntry{version: rec.VersionID, res: res}
	c.mu.Unlock()
	return res, nil
}
