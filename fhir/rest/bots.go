package rest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/fhirservice"
	"github.com/sandbot/sandbot/internal/httpx"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// Media types of bot input and output.
const (
	mediaText  = runtime.MediaText
	mediaJSON  = runtime.MediaJSON
	mediaFHIR  = runtime.MediaFHIR
	mediaForm  = runtime.MediaForm
	mediaHL7   = runtime.MediaHL7
	mediaWasm  = "application/wasm"
	moduleHash = "https://sandbot.dev/fhir/StructureDefinition/module-sha256"
)

// registerBots adds the Bot operations. Paths are matched after
// percent-decoding, so "%24execute" reaches the same routes as "$execute";
// anything after the operation name is accepted, as the reference does.
func (h *Handler) registerBots(r *mux.Router) {
	if h.cfg.Runtime == nil {
		return
	}
	r.HandleFunc("/Bot/{id}/$deploy", h.deploy).Methods(http.MethodPost)
	r.HandleFunc("/Bot/$execute{rest:(?:/.*)?}", h.execute).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/Bot/{id}/$execute{rest:(?:/.*)?}", h.execute).Methods(http.MethodGet, http.MethodPost)
}

func (h *Handler) deploy(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	for _, check := range []struct {
		typ string
		op  fhirservice.Op
	}{{"Bot", fhirservice.OpUpdate}, {"Binary", fhirservice.OpCreate}} {
		if err := fhirservice.Authorize(p, check.typ, check.op); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	ctx := r.Context()
	id := mux.Vars(r)["id"]
	rec, err := h.svc.LoadForUpdate(ctx, p, "Bot", id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	bot, err := rec.Resource()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := checkRuntimeVersion(bot); err != nil {
		h.fail(w, r, err)
		return
	}
	if isJSBot(bot) {
		h.deployJS(w, r, p, rec, bot)
		return
	}
	wasm, filename, err := h.deployBody(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if wasm == nil {
		// No code: redeploy what the Bot already points at.
		wasm, err = h.loadModuleBytes(ctx, rec.Project, bot)
		if err != nil {
			h.fail(w, r, err)
			return
		}
	}
	mod, err := h.cfg.Runtime.Compile(ctx, wasm)
	if err != nil {
		h.fail(w, r, busyError(moduleError(err)))
		return
	}
	if err := h.storeDeployedCode(ctx, p, rec, mediaWasm, wasm, filename, mod.Hash()); err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.WriteOutcome(w, r, http.StatusOK, fhir.AllOK())
}

// storeDeployedCode keeps deployed code as a Binary and points the Bot's
// executableCode at it, with the hash of the compiled module, in one
// transaction. Both are the caller's writes, through the FHIR service's
// rules like any other of theirs.
func (h *Handler) storeDeployedCode(ctx context.Context, p *principal.Principal, rec *store.Record, contentType string, code []byte, filename, hash string) error {
	return h.svc.InTx(ctx, func(tx *fhirservice.Service) error {
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
				"extension": []any{map[string]any{"url": moduleHash, "valueString": hash}}}
			if filename != "" {
				exec["title"] = filename
			}
			cur["executableCode"] = exec
			return cur, nil
		})
		return err
	})
}

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

// busyError maps a *runtime.BusyError (every compile slot taken, the
// execution memory budget or the project's share of it full) to a 429 with
// Retry-After; nothing waits in a queue for it. It is applied where an
// answer is written (an asynchronous job retries instead).
func busyError(err error) error {
	var b *runtime.BusyError
	if errors.As(err, &b) {
		return &fhir.Error{Code: fhir.EThrottled, Message: b.Reason, RetryAfter: b.RetryAfter}
	}
	return err
}

// deployBody reads the module of a $deploy: a raw application/wasm body, or
// the reference's JSON {code, filename} with the module in base64 (what
// `medplum bot deploy` sends from a dist file of base64 text). No body at
// all, or JSON without code (the web app's Deploy button), means no new
// module: a nil module redeploys the stored one.
func (h *Handler) deployBody(r *http.Request) ([]byte, string, error) {
	limit := h.cfg.Limits.ModuleBytes
	switch mt := httpx.MediaType(r); {
	case mt == "":
		// Only an empty body may come without a media type.
		if b, err := httpx.ReadBody(r, 0); err != nil || len(b) > 0 {
			return nil, "", fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type: $deploy takes application/wasm or JSON {code, filename}")
		}
		return nil, "", nil
	case mt == mediaWasm || mt == "application/octet-stream":
		b, err := httpx.ReadBody(r, limit)
		return b, r.URL.Query().Get("filename"), err
	case httpx.IsJSON(mt):
		body, err := readDeployJSON(r, limit*4/3+4<<10)
		if err != nil || body.Code == "" {
			return nil, body.Filename, err
		}
		wasm, err := decodeBase64(body.Code)
		if err != nil {
			return nil, "", fhir.Invalid("code must be the module in base64 (this Bot's runtimeVersion is wasm; a JavaScript bot has runtimeVersion vmcontext)", "code")
		}
		if int64(len(wasm)) > limit {
			return nil, "", fhir.Errorf(fhir.ETooLarge, "Module too large (limit %d bytes)", limit)
		}
		return wasm, body.Filename, nil
	default:
		return nil, "", fhir.Errorf(fhir.EUnsupportedMedia, "Unsupported media type: $deploy takes application/wasm or JSON {code, filename}")
	}
}

// deployJSON is the reference's $deploy body. Code is "" when absent or
// blank: redeploy what the Bot points at.
type deployJSON struct {
	Code     string `json:"code"`
	Filename string `json:"filename"`
}

func readDeployJSON(r *http.Request, limit int64) (deployJSON, error) {
	var body deployJSON
	b, err := httpx.ReadBody(r, limit)
	if err != nil {
		return body, err
	}
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

// checkRuntimeVersion accepts the Bot runtimes of DECISIONS 12: wasm (or
// none) and the reference's vmcontext and awslambda, which are JavaScript
// (isJSBot).
func checkRuntimeVersion(bot fhir.Resource) error {
	switch bot.String("runtimeVersion") {
	case "", "wasm", "vmcontext", "awslambda":
		return nil
	}
	return fhir.Invalid("Unsupported bot runtime")
}

// loadModuleBytes reads the module a Bot points at.
func (h *Handler) loadModuleBytes(ctx context.Context, project string, bot fhir.Resource) ([]byte, error) {
	code, _ := bot["executableCode"].(map[string]any)
	ref, _ := code["url"].(string)
	if ref == "" {
		return nil, fhir.Invalid("Bot missing executable code")
	}
	typ, id, ok := fhir.SplitReference(ref)
	if !ok || typ != "Binary" {
		return nil, fhir.Invalid("Executable code is not a Binary")
	}
	rec, err := h.store.Read(ctx, store.ProjectScope(project), "Binary", id)
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

// module returns the compiled module of a Bot: from the runtime's cache by the
// content hash recorded at deploy (so a redeploy is used by the next
// execution on every replica), compiling from the stored Binary on a miss.
func (h *Handler) module(ctx context.Context, project string, bot fhir.Resource) (*runtime.Module, error) {
	if code, _ := bot["executableCode"].(map[string]any); code == nil {
		return nil, fhir.Invalid("No executable code")
	}
	if mod, ok := h.heldModule(bot); ok {
		return mod, nil
	}
	hash := deployedHash(bot)
	if isJSBot(bot) {
		return h.jsModule(ctx, project, bot, hash)
	}
	wasm, err := h.loadModuleBytes(ctx, project, bot)
	if err != nil {
		return nil, err
	}
	if err := checkDeployed(wasm, hash); err != nil {
		return nil, err
	}
	mod, err := h.cfg.Runtime.Compile(ctx, wasm)
	if err != nil {
		return nil, moduleError(err)
	}
	return mod, nil
}

// heldModule is the Bot's compiled module if the runtime holds it: found by
// the content hash recorded at deploy (so a redeploy is used by the next
// execution on every replica), and of the Bot's kind (a JavaScript bot runs
// on the JavaScript engine's module).
func (h *Handler) heldModule(bot fhir.Resource) (*runtime.Module, bool) {
	hash := deployedHash(bot)
	if hash == "" {
		return nil, false
	}
	mod, ok := h.cfg.Runtime.Lookup(hash)
	if !ok || (mod.Shape() == runtime.JavaScript) != isJSBot(bot) {
		return nil, false
	}
	return mod, true
}

// deployedHash is the module hash $deploy recorded on a Bot, or "".
func deployedHash(bot fhir.Resource) string {
	code, _ := bot["executableCode"].(map[string]any)
	exts, _ := code["extension"].([]any)
	for _, e := range exts {
		if m, ok := e.(map[string]any); ok && m["url"] == moduleHash {
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

func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	p := principal.FromContext(r.Context())
	ctx := r.Context()
	// Whoever can read the Bot may execute it.
	if err := fhirservice.Authorize(p, "Bot", fhirservice.OpRead); err != nil {
		h.fail(w, r, err)
		return
	}
	query := r.URL.Query()
	rec, byIdentifier, err := h.findBot(ctx, p, mux.Vars(r)["id"], query.Get("identifier"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	bot, err := h.parsed.resource(rec)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	project, err := h.botProject(ctx, rec.Project, bot)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	mediaType, input, err := h.botInput(r, query, byIdentifier, isJSBot(bot))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	call := botCall{mediaType: mediaType, input: input, headers: eventHeaders(r), traceID: httpx.TraceID(ctx)}
	if h.jobs != nil && preferAsync(r) {
		h.submitExecution(w, r, p, rec, call)
		return
	}
	res, err := h.runBot(ctx, p, rec, bot, project, call)
	if err != nil {
		var f *runtime.Failure
		if errors.As(err, &f) {
			// A bot failure is the caller's 400, never a 5xx: the reference
			// client retries 5xx, which would run the bot again.
			h.fail(w, r, fhir.Invalid(f.Message))
			return
		}
		if ctx.Err() != nil {
			return // the caller went away
		}
		h.fail(w, r, busyError(err))
		return
	}
	h.writeBotResult(w, r, mediaType, &res.Envelope)
}

// botCall is what an execution was asked to do: the input as the event
// carries it (its media type, "" for a GET's query) and the event's
// headers and trace id. An asynchronous execution keeps it in its job.
type botCall struct {
	mediaType string
	input     json.RawMessage
	headers   map[string]string
	traceID   string
}

// runBot runs an execution of a Bot for p and audits it: the synchronous
// $execute and the asynchronous job both come here, so that both run under
// the same limits and admission and leave the same AuditEvent.
func (h *Handler) runBot(ctx context.Context, p *principal.Principal, rec *store.Record, bot, project fhir.Resource, call botCall) (*runtime.Result, error) {
	mod, err := h.module(ctx, rec.Project, bot)
	if err != nil {
		return nil, err
	}
	event, err := h.botEvent(p, rec, bot, project, call)
	if err != nil {
		return nil, err
	}
	h.metrics.observeInput(call.mediaType, len(call.input))
	ex := runtime.Execution{
		Event:  event,
		Limits: runtime.Limits{Timeout: h.botTimeout(bot, project)},
		FHIR:   h.botFHIR(ctx, rec),
		Tenant: rec.Project,
	}
	start := time.Now()
	res, err := h.cfg.Runtime.Execute(ctx, mod, ex)
	if errors.Is(err, runtime.ErrModuleEvicted) {
		// Dropped from the in-memory cache since it was looked up: compile
		// it again (from the on-disk cache) and run it.
		if mod, err = h.module(ctx, rec.Project, bot); err == nil {
			start = time.Now()
			res, err = h.cfg.Runtime.Execute(ctx, mod, ex)
		}
	}
	h.audit(p, rec, bot, call, start, res, err)
	return res, err
}

// maxBotTimeoutSetting is the Project.setting (valueInteger or valueDecimal,
// in seconds) that caps the timeout of every execution of the project's
// bots, whatever Bot.timeout says; the server's SANDBOT bot limits cap it
// in turn.
const maxBotTimeoutSetting = "maxBotTimeout"

// botTimeout is an execution's deadline: the Bot's timeout, or the server's
// default, capped by the project's maxBotTimeout setting; the runtime caps
// it by the server's maximum (docs/decisions.md 14).
func (h *Handler) botTimeout(bot, project fhir.Resource) time.Duration {
	timeout := h.cfg.Limits.BotTimeout
	if secs, ok := seconds(bot["timeout"]); ok {
		timeout = secs
	}
	if settings, ok := project["setting"].([]any); ok {
		for _, s := range settings {
			m, _ := s.(map[string]any)
			if m["name"] != maxBotTimeoutSetting {
				continue
			}
			for _, k := range []string{"valueInteger", "valueDecimal"} {
				if cap, ok := seconds(m[k]); ok {
					timeout = min(timeout, cap)
				}
			}
		}
	}
	return timeout
}

// seconds reads a positive JSON number of seconds.
func seconds(v any) (time.Duration, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	secs, err := n.Float64()
	if err != nil || secs <= 0 {
		return 0, false
	}
	const maxSecs = float64(math.MaxInt64 / time.Second) // beyond it a Duration overflows
	return time.Duration(min(secs, maxSecs) * float64(time.Second)), true
}

// findBot resolves the bot of an $execute, as the caller may read it: by id,
// or by identifier among the bots the caller can read, its own project's
// first (docs/decisions.md 10).
func (h *Handler) findBot(ctx context.Context, p *principal.Principal, id, identifier string) (*store.Record, bool, error) {
	if id != "" {
		rec, err := h.svc.Load(ctx, p, "Bot", id)
		return rec, false, err
	}
	if identifier == "" {
		return nil, false, fhir.Invalid("Must specify bot ID or identifier.")
	}
	query := "identifier=" + url.QueryEscape(identifier) + "&_count=2"
	queries := []string{query + "&_project=" + url.QueryEscape(p.ProjectID)}
	if p.SuperAdmin {
		queries = append(queries, query)
	}
	for i, q := range queries {
		req, err := fhir.ParseSearch("Bot", q)
		if err != nil {
			return nil, false, err
		}
		res, err := h.svc.Search(ctx, p, req)
		if err != nil {
			return nil, false, err
		}
		allProjects := i > 0
		switch {
		case len(res.Records) == 0:
			continue
		case len(res.Records) > 1 && (!allProjects || res.Records[0].Project == res.Records[1].Project):
			return nil, false, &fhir.Error{Code: fhir.EMultipleMatches, Message: "Multiple resources found matching condition"}
		}
		// The search answered what the caller may see; run the stored Bot.
		rec, err := h.svc.Load(ctx, p, "Bot", res.Records[0].ID)
		return rec, true, err
	}
	return nil, false, fhir.Errorf(fhir.ENotFound, "No bot found with identifier %s", identifier)
}

// botProject loads the bot's project and checks that it may run bots. It is
// read on every execution, like the Bot, so that a change to its settings or
// secrets, made on any replica, applies to the very next execution
// everywhere: on SQLite the read cache serves it from memory (and sees other
// processes' writes at once); on PostgreSQL it is one primary-key read. A
// cache invalidated by the change feed would be stale for the moment the
// notification takes to arrive (~1 ms), which a client that writes on one
// replica and executes on another can hit.
func (h *Handler) botProject(ctx context.Context, project string, bot fhir.Resource) (fhir.Resource, error) {
	if err := checkRuntimeVersion(bot); err != nil {
		return nil, err
	}
	prec, err := h.store.Read(ctx, store.AllProjects, "Project", project)
	if err != nil {
		return nil, err
	}
	pr, err := h.parsed.resource(prec)
	if err != nil {
		return nil, err
	}
	if settings, ok := pr["setting"].([]any); ok {
		for _, s := range settings {
			if m, ok := s.(map[string]any); ok && m["name"] == "bots" && m["valueBoolean"] == false {
				return nil, fhir.Invalid("Bots not enabled")
			}
		}
	}
	return pr, nil
}

// botInput maps the request to event.input (bot ABI, "Event"). For a
// JavaScript bot, as on the reference, an application/*+json body need not be
// a resource (MedplumClient.executeBot sends application/fhir+json unless
// told otherwise).
func (h *Handler) botInput(r *http.Request, query url.Values, byIdentifier, js bool) (string, json.RawMessage, error) {
	if r.Method == http.MethodGet {
		if byIdentifier {
			query.Del("identifier")
		}
		return "", runtime.FormInput(query), nil
	}
	mt := httpx.MediaType(r)
	limit := h.cfg.Limits.TextBodyBytes
	if httpx.IsJSON(mt) {
		limit = h.cfg.Limits.JSONBodyBytes
	}
	body, err := httpx.ReadBody(r, limit)
	if err != nil {
		return "", nil, err
	}
	inputType := mt
	if js && mt != mediaJSON && httpx.IsJSON(mt) {
		inputType = mediaJSON
	}
	in, err := runtime.Input(inputType, body)
	var ie *runtime.InputError
	switch {
	case errors.As(err, &ie) && ie.Unsupported:
		return "", nil, fhir.Errorf(fhir.EUnsupportedMedia, "%s", ie.Message)
	case errors.As(err, &ie):
		e := fhir.Invalid(ie.Message)
		if ie.HL7 != nil && ie.HL7.Segment != "" {
			e.Expression = []string{fmt.Sprintf("%s-%d", ie.HL7.Segment, ie.HL7.Field)}
		}
		return "", nil, e
	case err != nil:
		return "", nil, err
	}
	return mt, in, nil
}

// eventHeaders are the request's headers as the event carries them:
// lower-cased, without the caller's credentials.
func eventHeaders(r *http.Request) map[string]string {
	headers := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		lk := strings.ToLower(k)
		if lk == "authorization" || lk == "cookie" {
			continue
		}
		headers[lk] = strings.Join(v, ", ")
	}
	return headers
}

// botEvent builds the event JSON.
func (h *Handler) botEvent(p *principal.Principal, rec *store.Record, bot, project fhir.Resource, call botCall) ([]byte, error) {
	ev := runtime.Event{
		Bot:         runtime.Reference{Reference: "Bot/" + rec.ID, Display: bot.String("name")},
		Requester:   runtime.Reference{Reference: p.Profile},
		ContentType: call.mediaType,
		Input:       call.input,
		Secrets:     projectSecrets(project),
		TraceID:     call.traceID,
		Headers:     call.headers,
	}
	return ev.JSON()
}

// projectSecrets maps Project.secret to the name-keyed object of event.secrets.
func projectSecrets(project fhir.Resource) map[string]any {
	out := map[string]any{}
	if list, ok := project["secret"].([]any); ok {
		for _, s := range list {
			if m, ok := s.(map[string]any); ok {
				if name, _ := m["name"].(string); name != "" {
					out[name] = m
				}
			}
		}
	}
	return out
}

// writeBotResult maps the envelope to the HTTP answer (sdk/ABI.md §3, docs/decisions.md 7-8).
func (h *Handler) writeBotResult(w http.ResponseWriter, r *http.Request, requestType string, env *runtime.Envelope) {
	if len(env.Error) > 0 {
		status := http.StatusBadRequest
		if env.Status != 0 {
			status = env.Status
		}
		var msg string
		if json.Unmarshal(env.Error, &msg) == nil {
			httpx.WriteOutcome(w, r, status, fhir.OutcomeFor(fhir.Invalid(msg)))
			return
		}
		var oo fhir.OperationOutcome
		if json.Unmarshal(env.Error, &oo) == nil && oo.ResourceType == "OperationOutcome" {
			httpx.WriteJSON(w, status, httpx.FHIRJSON, env.Error)
			return
		}
		httpx.WriteOutcome(w, r, status, fhir.OutcomeFor(fhir.Invalid(string(env.Error))))
		return
	}
	status := http.StatusOK
	if env.Status != 0 {
		status = env.Status
	}
	if len(env.Result) == 0 {
		httpx.WriteOutcome(w, r, status, fhir.AllOK())
		return
	}
	ct := env.ContentType
	if ct == "" {
		if requestType == mediaText || requestType == mediaHL7 {
			ct = requestType + "; charset=utf-8"
		} else {
			ct = "application/json; charset=utf-8"
		}
	}
	body := []byte(env.Result)
	mt := strings.ToLower(strings.TrimSpace(strings.Split(ct, ";")[0]))
	var s string
	if !httpx.IsJSON(mt) && json.Unmarshal(env.Result, &s) == nil {
		// Text results go out as the text itself; JSON types get JSON, so a
		// string result to a JSON request is a JSON string (docs/decisions.md 7).
		body = []byte(s)
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// botFHIR answers a bot's FHIR calls (the sandbot.fhir import, a JavaScript
// bot's fetch) in-process through the FHIR service's dispatcher, as the
// bot's own ProjectMembership: its access policy and the Bot rows of
// fhirservice.Rules apply, and no token enters the guest.
func (h *Handler) botFHIR(ctx context.Context, rec *store.Record) func(context.Context, []byte) []byte {
	var p *principal.Principal
	var lookupErr error
	looked := false
	return func(callCtx context.Context, request []byte) []byte {
		if !looked {
			looked = true
			p, lookupErr = principal.ForUser(ctx, h.store, "Bot/"+rec.ID)
		}
		if lookupErr != nil || p == nil {
			return fhirReply(http.StatusForbidden, fhir.OutcomeFor(fhir.Errorf(fhir.EForbidden, "Bot has no project membership")))
		}
		var req struct {
			Method      string          `json:"method"`
			URL         string          `json:"url"`
			Body        json.RawMessage `json:"body"`
			IfNoneExist string          `json:"ifNoneExist"`
			IfMatch     string          `json:"ifMatch"`
		}
		if err := json.Unmarshal(request, &req); err != nil || req.URL == "" {
			return fhirReply(http.StatusBadRequest, fhir.OutcomeFor(fhir.Invalid("FHIR request must be {method, url, body}")))
		}
		if req.Method == "" {
			req.Method = http.MethodGet
		}
		in := &fhirservice.Request{Method: strings.ToUpper(req.Method), URL: req.URL, Accept: mediaFHIR,
			IfNoneExist: req.IfNoneExist, IfMatch: req.IfMatch}
		if len(req.Body) > 0 && string(req.Body) != "null" {
			in.Body = req.Body
			in.ContentType = mediaFHIR
			if in.Method == http.MethodPatch {
				in.ContentType = "application/json-patch+json"
			}
		}
		resp := h.svc.Do(callCtx, p, in)
		out := resp.Body
		if !json.Valid(out) {
			out, _ = json.Marshal(string(out))
		}
		reply, _ := json.Marshal(map[string]any{"status": resp.Status, "body": json.RawMessage(out)})
		return reply
	}
}

func fhirReply(status int, body any) []byte {
	b, _ := json.Marshal(map[string]any{"status": status, "body": body})
	return b
}
