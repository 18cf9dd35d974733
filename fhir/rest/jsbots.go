package rest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// JavaScript bots (DECISIONS 12): a Bot whose runtimeVersion is one of the
// reference's codes, vmcontext or awslambda, runs JavaScript in the runtime's
// JavaScript engine. Its code is kept as an application/javascript Binary.

const mediaJS = "application/javascript"

// isJSBot reports whether the Bot runs JavaScript.
func isJSBot(bot fhir.Resource) bool {
	switch bot.String("runtimeVersion") {
	case "vmcontext", "awslambda":
		return true
	}
	return false
}

// deployJS is $deploy for a JavaScript bot: the reference's JSON body
// {code, filename} with the code as text (what `medplum bot deploy` sends
// from a dist file), or a raw application/javascript body. The code is
// loaded into the engine now, so a syntax error is this request's 400.
func (h *Handler) deployJS(w http.ResponseWriter, r *http.Request, p *principal.Principal, rec *store.Record, bot fhir.Resource) {
	ctx := r.Context()
	code, filename, err := h.jsDeployBody(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if code == nil {
		// No code: redeploy what the Bot already points at.
		if code, err = h.loadJSCode(ctx, rec.Project, bot); err != nil {
			h.fail(w, r, err)
			return
		}
		if filename == "" {
			filename, _ = executableCode(bot)["title"].(string)
		}
	}
	if filename == "" {
		filename = "index.js" // the reference's default
	}
	mod, err := h.cfg.Runtime.CompileJS(ctx, code, filename)
	if err != nil {
		h.fail(w, r, busyError(jsCodeError(err)))
		return
	}
	if err := h.storeDeployedCode(ctx, p, rec, mediaJS, code, filename, mod.Hash()); err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
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

// jsDeployBody reads the code of a JavaScript $deploy.
func (h *Handler) jsDeployBody(r *http.Request) ([]byte, string, error) {
	limit := h.cfg.Limits.ModuleBytes
	notJS := fhir.Invalid("The code is a WebAssembly module, and this Bot's runtimeVersion (vmcontext or awslambda) runs JavaScript: set runtimeVersion to wasm for a WebAssembly bot", "code")
	switch mt := httpx.MediaType(r); {
	case mt == mediaJS || mt == "text/javascript" || mt == "application/x-javascript":
		b, err := httpx.ReadBody(r, limit)
		if err != nil {
			return nil, "", err
		}
		return b, r.URL.Query().Get("filename"), checkJSText(b)
	case mt == mediaWasm:
		return nil, "", notJS
	case httpx.IsJSON(mt):
		body, err := readDeployJSON(r, 2*limit+4<<10) // JSON escapes can double text
		if err != nil || body.Code == "" {
			return nil, body.Filename, err
		}
		code := []byte(body.Code)
		if wasm, err := decodeBase64(body.Code); err == nil && bytes.HasPrefix(wasm, []byte("\x00asm")) {
			return nil, "", notJS
		}
		if int64(len(code)) > limit {
			return nil, "", fhir.Errorf(fhir.ETooLarge, "Code too large (limit %d bytes)", limit)
		}
		return code, body.Filename, nil
	default:
		return nil, "", fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type: $deploy of a JavaScript bot takes application/javascript or JSON {code, filename}")
	}
}

func checkJSText(b []byte) error {
	if bytes.HasPrefix(b, []byte("\x00asm")) {
		return fhir.Invalid("The code is a WebAssembly module, and this Bot's runtimeVersion (vmcontext or awslambda) runs JavaScript: set runtimeVersion to wasm for a WebAssembly bot")
	}
	if !utf8.Valid(b) {
		return fhir.Invalid("The code is not UTF-8 text")
	}
	return nil
}

func executableCode(bot fhir.Resource) map[string]any {
	code, _ := bot["executableCode"].(map[string]any)
	return code
}

// loadJSCode reads the code a JavaScript Bot points at.
func (h *Handler) loadJSCode(ctx context.Context, project string, bot fhir.Resource) ([]byte, error) {
	if ct, _ := executableCode(bot)["contentType"].(string); ct != "" && ct != mediaJS && ct != "text/javascript" {
		return nil, fhir.Invalid("The Bot runs JavaScript (runtimeVersion " + bot.String("runtimeVersion") + ") but its executable code is " + ct + ": deploy JavaScript code")
	}
	return h.loadModuleBytes(ctx, project, bot)
}

// jsModule loads a JavaScript Bot's code into the engine (from the engine's
// cache when this process has loaded the same code). hash, when set, is what
// $deploy recorded: other code is refused.
func (h *Handler) jsModule(ctx context.Context, project string, bot fhir.Resource, hash string) (*runtime.Module, error) {
	code, err := h.loadJSCode(ctx, project, bot)
	if err != nil {
		return nil, err
	}
	if err := checkDeployed(code, hash); err != nil {
		return nil, err
	}
	filename, _ := executableCode(bot)["title"].(string)
	mod, err := h.cfg.Runtime.CompileJS(ctx, code, filename)
	if err != nil {
		return nil, jsCodeError(err)
	}
	return mod, nil
}
