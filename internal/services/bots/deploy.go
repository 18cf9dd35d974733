package bots

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/runtime"
)

// Media types of deployed code.
const (
	mediaWasm = "application/wasm"
	mediaJS   = "application/javascript"
)

// Deploy asks for code to be deployed on a Bot.
type Deploy struct {
	BotID  string
	Caller *principal.Principal
	// Body is the request's body, of media type ContentType: a raw module
	// (application/wasm) or JavaScript (application/javascript), or the
	// reference's JSON {code, filename} (what `medplum bot deploy` sends: a
	// WebAssembly bot's module in base64, a JavaScript bot's code as
	// text). No body, or JSON without code (the web app's Deploy button),
	// deploys again what the Bot points at.
	Body        []byte
	ContentType string
	// Filename names a raw body's code (the request's ?filename=).
	Filename string
}

// Deploy validates and compiles code (a syntax error or an invalid module
// is the caller's 400), keeps it as a Binary in the Bot's project and
// points Bot.executableCode at it with the code's hash, in one transaction,
// as the caller's writes. The other replicas hear of the changed Bot and
// load or compile its module in the background (Changed); Deploy answers
// once every live replica holds it, or after deployReadyWait.
func (s *Service) Deploy(ctx context.Context, d Deploy) error {
	p := d.Caller
	if err := s.AuthorizeDeploy(p); err != nil {
		return err
	}
	rec, err := s.fhir.LoadForUpdate(ctx, p, "Bot", d.BotID)
	if err != nil {
		return err
	}
	bot, err := rec.Resource()
	if err != nil {
		return err
	}
	if err := checkRuntimeVersion(bot); err != nil {
		return err
	}
	if isJSBot(bot) {
		return s.deployJS(ctx, p, rec, bot, d)
	}
	wasm, filename, err := s.wasmOf(d)
	if err != nil {
		return err
	}
	if wasm == nil {
		if wasm, err = s.loadCode(ctx, rec.Project, bot); err != nil {
			return err
		}
	}
	mod, err := s.rt.Compile(s.sharing(runtime.Deploying(ctx)), wasm)
	if err != nil {
		return busyError(moduleError(err))
	}
	return s.storeDeployedCode(ctx, p, rec, mediaWasm, wasm, filename, mod.Hash())
}

// deployJS deploys a JavaScript bot's code, loaded into the engine now so
// that a syntax error is this request's 400.
func (s *Service) deployJS(ctx context.Context, p *principal.Principal, rec *fhir.Record, bot fhir.Resource, d Deploy) error {
	code, filename, err := s.jsOf(d)
	if err != nil {
		return err
	}
	if code == nil {
		if code, err = s.loadJSCode(ctx, rec.Project, bot); err != nil {
			return err
		}
		if filename == "" {
			filename, _ = executableCode(bot)["title"].(string)
		}
	}
	if filename == "" {
		filename = "index.js" // the reference's default
	}
	mod, err := s.rt.CompileJS(ctx, code, filename)
	if err != nil {
		return busyError(jsCodeError(err))
	}
	return s.storeDeployedCode(ctx, p, rec, mediaJS, code, filename, mod.Hash())
}

// storeDeployedCode keeps deployed code as a Binary and points the Bot's
// executableCode at it, with the hash of the compiled module, in one
// transaction. Both are the caller's writes, through the FHIR service's
// rules like any other of theirs.
func (s *Service) storeDeployedCode(ctx context.Context, p *principal.Principal, rec *fhir.Record, contentType string, code []byte, filename, hash string) error {
	err := s.fhir.InTx(ctx, func(tx *fhirservice.Service) error {
		// In the Bot's project, where executions read it: a super admin
		// deploying another project's Bot would otherwise keep it in its
		// own (meta.project is the server's for everyone else, and the
		// Bot's project is theirs).
		bin, err := tx.Create(ctx, p, fhir.Resource{"resourceType": "Binary", "contentType": contentType,
			"data": base64.StdEncoding.EncodeToString(code), "meta": map[string]any{"project": rec.Project}})
		if err != nil {
			return err
		}
		_, err = tx.Modify(ctx, p, "Bot", rec.ID, func(cur fhir.Resource) (fhir.Resource, error) {
			exec := map[string]any{"contentType": contentType, "url": "Binary/" + bin.ID,
				"extension": []any{map[string]any{"url": moduleHashExtension, "valueString": hash}}}
			if filename != "" {
				exec["title"] = filename
			}
			cur["executableCode"] = exec
			return cur, nil
		})
		return err
	})
	if err == nil && s.presence != nil {
		// The other replicas hear of the changed Bot and load its module
		// from the artifact stored by the compile above: the caller hears
		// of the deploy once they can run it (docs/decisions.md 56).
		s.presence.await(ctx, hash)
	}
	return err
}

var errDeployMedia = fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type: $deploy takes application/wasm or JSON {code, filename}")

// wasmOf reads the module of a WebAssembly bot's $deploy (nil: none).
func (s *Service) wasmOf(d Deploy) ([]byte, string, error) {
	limit := s.cfg.Limits.ModuleBytes
	switch mt := d.ContentType; {
	case mt == "":
		// Only an empty body may come without a media type.
		if len(d.Body) > 0 {
			return nil, "", errDeployMedia
		}
		return nil, "", nil
	case mt == mediaWasm || mt == "application/octet-stream":
		if int64(len(d.Body)) > limit {
			return nil, "", tooLarge("Module", limit)
		}
		return d.Body, d.Filename, nil
	case isJSON(mt):
		body, err := deployJSONOf(d.Body)
		if err != nil || body.Code == "" {
			return nil, body.Filename, err
		}
		wasm, err := decodeBase64(body.Code)
		if err != nil {
			return nil, "", fhir.Invalid("code must be the module in base64 (this Bot's runtimeVersion is wasm; a JavaScript bot has runtimeVersion vmcontext)", "code")
		}
		if int64(len(wasm)) > limit {
			return nil, "", tooLarge("Module", limit)
		}
		return wasm, body.Filename, nil
	default:
		return nil, "", errDeployMedia
	}
}

// jsOf reads the code of a JavaScript bot's $deploy (nil: none).
func (s *Service) jsOf(d Deploy) ([]byte, string, error) {
	limit := s.cfg.Limits.ModuleBytes
	notJS := fhir.Invalid("The code is a WebAssembly module, and this Bot's runtimeVersion (vmcontext or awslambda) runs JavaScript: set runtimeVersion to wasm for a WebAssembly bot", "code")
	switch mt := d.ContentType; {
	case mt == "":
		if len(d.Body) > 0 {
			return nil, "", errDeployJSMedia
		}
		return nil, "", nil
	case mt == mediaJS || mt == "text/javascript" || mt == "application/x-javascript":
		if int64(len(d.Body)) > limit {
			return nil, "", tooLarge("Code", limit)
		}
		if bytes.HasPrefix(d.Body, []byte("\x00asm")) {
			return nil, "", notJS
		}
		if !utf8.Valid(d.Body) {
			return nil, "", fhir.Invalid("The code is not UTF-8 text")
		}
		return d.Body, d.Filename, nil
	case mt == mediaWasm:
		return nil, "", notJS
	case isJSON(mt):
		body, err := deployJSONOf(d.Body)
		if err != nil || body.Code == "" {
			return nil, body.Filename, err
		}
		if wasm, err := decodeBase64(body.Code); err == nil && bytes.HasPrefix(wasm, []byte("\x00asm")) {
			return nil, "", notJS
		}
		code := []byte(body.Code)
		if int64(len(code)) > limit {
			return nil, "", tooLarge("Code", limit)
		}
		return code, body.Filename, nil
	default:
		return nil, "", errDeployJSMedia
	}
}

var errDeployJSMedia = fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type: $deploy of a JavaScript bot takes application/javascript or JSON {code, filename}")

func tooLarge(what string, limit int64) error {
	return fhir.Errorf(fhir.ETooLarge, "%s too large (limit %d bytes)", what, limit)
}

// deployJSON is the reference's $deploy body. Code is "" when absent or
// blank: deploy again what the Bot points at.
type deployJSON struct {
	Code     string `json:"code"`
	Filename string `json:"filename"`
}

func deployJSONOf(b []byte) (deployJSON, error) {
	var body deployJSON
	if err := json.Unmarshal(b, &body); err != nil {
		return deployJSON{}, fhir.Invalid("Content could not be parsed")
	}
	if strings.TrimSpace(body.Code) == "" {
		body.Code = ""
	}
	return body, nil
}

func decodeBase64(s string) ([]byte, error) {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == ' ' || r == '\t' {
			return -1
		}
		return r
	}, s)
	if i := strings.Index(s, ";base64,"); i >= 0 && strings.HasPrefix(s, "data:") {
		s = s[i+len(";base64,"):]
	}
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}
