package bots

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/mediatype"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/internal/services/fhirservice"
	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// HTTP statuses of results (the package speaks no HTTP; its results are
// shaped like HTTP answers, as the reference's are).
const (
	statusOK         = 200
	statusBadRequest = 400
	statusForbidden  = 403
)

// Media types of bot input and output.
const (
	mediaText = runtime.MediaText
	mediaJSON = runtime.MediaJSON
	mediaFHIR = runtime.MediaFHIR
	mediaForm = runtime.MediaForm
	mediaHL7  = runtime.MediaHL7
)

func isJSON(mt string) bool { return mediatype.IsJSON(mt) }

// call is what an execution was asked to do, once the request is decoded:
// the input as the event carries it (its media type, "" for a GET's query)
// and the event's headers and trace id. An asynchronous execution keeps it
// in its job.
type call struct {
	mediaType string
	input     json.RawMessage
	headers   map[string]string
	traceID   string
	trigger   Trigger
	entities  []string
	attempt   int
	details   []Detail
}

// target is a Bot resolved for an execution: its record, decoded, and its
// project's.
type target struct {
	rec     *fhir.Record
	bot     fhir.Resource
	project fhir.Resource
	// local is set for a local run (RunLocal).
	local *localRun
}

// Execute runs a Bot for ex.Caller, or accepts it as a job when ex.Async and
// the service has a job engine. A bot that fails (a trap, its deadline, a
// limit) is the caller's 400, never a 5xx: the reference client retries 5xx,
// which would run the bot again. Admission refused (the node's execution
// budget, the project's share of it) is a 429 with Retry-After.
func (s *Service) Execute(ctx context.Context, ex Execute) (*Result, error) {
	p := ex.Caller
	if err := s.AuthorizeExecute(p); err != nil {
		return nil, err
	}
	rec, byIdentifier, err := s.findBot(ctx, p, ex.BotID, ex.Identifier)
	if err != nil {
		return nil, err
	}
	t, err := s.resolve(ctx, rec)
	if err != nil {
		return nil, err
	}
	c := call{headers: ex.Headers, traceID: ex.TraceID, trigger: ex.Trigger, entities: ex.Entities, attempt: ex.Attempt, details: ex.Details}
	if ex.Query != nil {
		q := url.Values{}
		for k, v := range ex.Query {
			if !(byIdentifier && k == "identifier") {
				q[k] = v
			}
		}
		c.input = runtime.FormInput(q)
	} else if c.mediaType, c.input, err = s.decodeInput(ex.ContentType, ex.Input, isJSBot(t.bot)); err != nil {
		return nil, err
	}
	if ex.Async && s.cfg.Jobs != nil {
		return s.submit(ctx, p, rec, c, ex.RequestURL)
	}
	if c.trigger == "" {
		c.trigger = TriggerRequest
	}
	res, err := s.run(ctx, p, t, c)
	if err != nil {
		return nil, executionError(err)
	}
	return resultOf(c.mediaType, &res.Envelope), nil
}

// executionError maps what the runtime answered to the project's errors.
func executionError(err error) error {
	var f *runtime.Failure
	if errors.As(err, &f) {
		return fhir.Invalid(f.Message)
	}
	return busyError(err)
}

// busyError maps a *runtime.BusyError (every compile slot taken, the
// execution memory budget or the project's share of it full) to a 429 with
// Retry-After; nothing waits in a queue for it. It is applied where an
// answer is given (an asynchronous job tries again instead).
func busyError(err error) error {
	var b *runtime.BusyError
	if errors.As(err, &b) {
		return &fhir.Error{Code: fhir.EThrottled, Message: b.Reason, RetryAfter: b.RetryAfter}
	}
	return err
}

// resolve reads what an execution of rec needs besides the Bot: its
// project, which must allow bots.
func (s *Service) resolve(ctx context.Context, rec *fhir.Record) (*target, error) {
	bot, err := s.parsedOf(rec)
	if err != nil {
		return nil, err
	}
	project, err := s.botProject(ctx, rec.Project, bot)
	if err != nil {
		return nil, err
	}
	return &target{rec: rec, bot: bot, project: project}, nil
}

// run runs an execution of a Bot for p and audits it: every trigger comes
// here, so that all run under the same limits and admission and leave the
// same AuditEvent.
func (s *Service) run(ctx context.Context, p *principal.Principal, t *target, c call) (*runtime.Result, error) {
	var mod *runtime.Module
	var fhirCall func(context.Context, []byte) []byte
	var err error
	if t.local != nil {
		mod, fhirCall = t.local.mod, t.local.fhir
	} else {
		if mod, err = s.module(ctx, t.rec.Project, t.bot); err != nil {
			return nil, err
		}
		fhirCall = s.botFHIR(ctx, t.rec)
	}
	event, err := botEvent(p, t, c)
	if err != nil {
		return nil, err
	}
	s.metrics.observeInput(c.mediaType, len(c.input))
	ex := runtime.Execution{
		Event:  event,
		Limits: runtime.Limits{Timeout: s.botTimeout(t.bot, t.project)},
		FHIR:   fhirCall,
		Tenant: t.rec.Project,
	}
	start := time.Now()
	res, err := s.rt.Execute(ctx, mod, ex)
	if errors.Is(err, runtime.ErrModuleEvicted) && t.local == nil {
		// Dropped from the in-memory cache since it was looked up: compile
		// it again (from the on-disk cache) and run it.
		if mod, err = s.module(ctx, t.rec.Project, t.bot); err == nil {
			start = time.Now()
			res, err = s.rt.Execute(ctx, mod, ex)
		}
	}
	s.metrics.executions.WithLabelValues(string(c.trigger), outcomeLabel(res, err)).Inc()
	s.audit(p, t, c, start, res, err)
	return res, err
}

// outcomeLabel names how an execution ended, for the metrics.
func outcomeLabel(res *runtime.Result, err error) string {
	var f *runtime.Failure
	var busy *runtime.BusyError
	switch {
	case errors.As(err, &busy):
		return "refused"
	case errors.As(err, &f):
		return "failed"
	case err != nil:
		return "error"
	case res != nil && len(res.Envelope.Error) > 0:
		return "bot_error"
	}
	return "ok"
}

// maxBotTimeoutSetting is the Project.setting (valueInteger or valueDecimal,
// in seconds) that caps the timeout of every execution of the project's
// bots, whatever Bot.timeout says; the server's bot limits cap it in turn.
const maxBotTimeoutSetting = "maxBotTimeout"

// Timeout is how long an execution of Bot/id of project may run (the
// Bot's timeout, capped by its project's maxBotTimeout; the server's
// default when the Bot cannot be read): what a trigger that waits for the
// bot's answer (an HL7 feed in application mode) waits.
func (s *Service) Timeout(ctx context.Context, project, id string) time.Duration {
	rec, err := s.store.Read(ctx, store.ProjectScope(project), "Bot", id)
	if err != nil {
		return s.cfg.Limits.BotTimeout
	}
	t, err := s.resolve(ctx, rec)
	if err != nil {
		return s.cfg.Limits.BotTimeout
	}
	return s.botTimeout(t.bot, t.project)
}

// botTimeout is an execution's deadline: the Bot's timeout, or the server's
// default, capped by the project's maxBotTimeout setting; the runtime caps
// it by the server's maximum (docs/decisions.md 14).
func (s *Service) botTimeout(bot, project fhir.Resource) time.Duration {
	timeout := s.cfg.Limits.BotTimeout
	if secs, ok := seconds(bot["timeout"]); ok {
		timeout = secs
	}
	if settings, ok := project["setting"].([]any); ok {
		for _, st := range settings {
			m, _ := st.(map[string]any)
			if m["name"] != maxBotTimeoutSetting {
				continue
			}
			for _, k := range []string{"valueInteger", "valueDecimal"} {
				if limit, ok := seconds(m[k]); ok {
					timeout = min(timeout, limit)
				}
			}
		}
	}
	return timeout
}

// findBot resolves the bot of an execution, as the caller may read it: by
// id, or by identifier among the bots the caller can read, its own
// project's first (docs/decisions.md 10).
func (s *Service) findBot(ctx context.Context, p *principal.Principal, id, identifier string) (*fhir.Record, bool, error) {
	if id != "" {
		rec, err := s.fhir.LoadCached(ctx, p, "Bot", id)
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
		res, err := s.fhir.Search(ctx, p, req)
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
		rec, err := s.fhir.LoadCached(ctx, p, "Bot", res.Records[0].ID)
		return rec, true, err
	}
	return nil, false, fhir.Errorf(fhir.ENotFound, "No bot found with identifier %s", identifier)
}

// botProject loads the bot's project and checks that it may run bots. It is
// looked up on every execution, like the Bot, so that a change to its
// settings or secrets, made on any replica, applies to the very next
// execution everywhere: on SQLite the read cache serves it from memory (and
// sees other processes' writes at once); on PostgreSQL the store's copy
// (ReadCached), which a write of a Bot or Project drops on every live
// replica before it answers (decision 58, Changed).
func (s *Service) botProject(ctx context.Context, project string, bot fhir.Resource) (fhir.Resource, error) {
	if err := checkRuntimeVersion(bot); err != nil {
		return nil, err
	}
	prec, err := s.store.ReadCached(ctx, store.AllProjects, "Project", project)
	if err != nil {
		return nil, err
	}
	pr, err := s.parsedOf(prec)
	if err != nil {
		return nil, err
	}
	if settings, ok := pr["setting"].([]any); ok {
		for _, st := range settings {
			if m, ok := st.(map[string]any); ok && m["name"] == "bots" && m["valueBoolean"] == false {
				return nil, fhir.Invalid("Bots not enabled")
			}
		}
	}
	return pr, nil
}

// decodeInput maps a body to event.input (bot ABI, "Event"). For a
// JavaScript bot, as on the reference, an application/*+json body need not
// be a resource (MedplumClient.executeBot sends application/fhir+json unless
// told otherwise).
func (s *Service) decodeInput(mt string, body []byte, js bool) (string, json.RawMessage, error) {
	if int64(len(body)) > s.InputLimit(mt) {
		return "", nil, fhir.Errorf(fhir.ETooLarge, "Request body too large (limit %d bytes)", s.InputLimit(mt))
	}
	inputType := mt
	if js && mt != mediaJSON && isJSON(mt) {
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

// botEvent builds the event JSON.
func botEvent(p *principal.Principal, t *target, c call) ([]byte, error) {
	ev := runtime.Event{
		Bot:         runtime.Reference{Reference: "Bot/" + t.rec.ID, Display: t.bot.String("name")},
		Requester:   runtime.Reference{Reference: p.Profile},
		ContentType: c.mediaType,
		Input:       c.input,
		Secrets:     projectSecrets(t.project),
		TraceID:     c.traceID,
		Headers:     c.headers,
	}
	return ev.JSON()
}

// projectSecrets maps Project.secret to the name-keyed object of event.secrets.
func projectSecrets(project fhir.Resource) map[string]any {
	out := map[string]any{}
	if list, ok := project["secret"].([]any); ok {
		for _, sec := range list {
			if m, ok := sec.(map[string]any); ok {
				if name, _ := m["name"].(string); name != "" {
					out[name] = m
				}
			}
		}
	}
	return out
}

// resultOfError maps an error envelope to the answer.
func resultOfError(env *runtime.Envelope) *Result {
	status := statusBadRequest
	if env.Status != 0 {
		status = env.Status
	}
	var msg string
	if json.Unmarshal(env.Error, &msg) == nil {
		return &Result{Status: status, Outcome: fhir.OutcomeFor(fhir.Invalid(msg))}
	}
	var oo fhir.OperationOutcome
	if json.Unmarshal(env.Error, &oo) == nil && oo.ResourceType == "OperationOutcome" {
		return &Result{Status: status, ContentType: mediatype.FHIRJSON, Body: env.Error}
	}
	return &Result{Status: status, Outcome: fhir.OutcomeFor(fhir.Invalid(string(env.Error)))}
}

// resultOf maps the envelope to the answer (sdk/ABI.md §3, docs/decisions.md 7-8).
func resultOf(requestType string, env *runtime.Envelope) *Result {
	if len(env.Error) > 0 {
		res := resultOfError(env)
		res.Thrown = env.Status == 0
		return res
	}
	status := statusOK
	if env.Status != 0 {
		status = env.Status
	}
	if len(env.Result) == 0 {
		return &Result{Status: status, Outcome: fhir.AllOK()}
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
	mt := mediatype.Of(ct)
	var str string
	if !isJSON(mt) && json.Unmarshal(env.Result, &str) == nil {
		// Text results go out as the text itself; JSON types get JSON, so a
		// string result to a JSON request is a JSON string (docs/decisions.md 7).
		body = []byte(str)
	}
	return &Result{Status: status, ContentType: ct, Body: body}
}

// botFHIR answers a bot's FHIR calls (the sandbot.fhir import, a JavaScript
// bot's fetch) in-process through the FHIR service's dispatcher, as the
// bot's own ProjectMembership: its access policy and the Bot rows of
// fhirservice.Rules apply, and no token enters the guest.
func (s *Service) botFHIR(ctx context.Context, rec *fhir.Record) func(context.Context, []byte) []byte {
	var p *principal.Principal
	var lookupErr error
	looked := false
	return func(callCtx context.Context, request []byte) []byte {
		if !looked {
			looked = true
			p, lookupErr = principal.ForUser(ctx, s.store, "Bot/"+rec.ID)
		}
		if lookupErr != nil || p == nil {
			return fhirReply(statusForbidden, fhir.OutcomeFor(fhir.Errorf(fhir.EForbidden, "Bot has no project membership")))
		}
		var req struct {
			Method      string          `json:"method"`
			URL         string          `json:"url"`
			Body        json.RawMessage `json:"body"`
			IfNoneExist string          `json:"ifNoneExist"`
			IfMatch     string          `json:"ifMatch"`
		}
		if err := json.Unmarshal(request, &req); err != nil || req.URL == "" {
			return fhirReply(statusBadRequest, fhir.OutcomeFor(fhir.Invalid("FHIR request must be {method, url, body}")))
		}
		if req.Method == "" {
			req.Method = "GET"
		}
		in := &fhirservice.Request{Method: strings.ToUpper(req.Method), URL: req.URL, Accept: mediaFHIR,
			IfNoneExist: req.IfNoneExist, IfMatch: req.IfMatch}
		if len(req.Body) > 0 && string(req.Body) != "null" {
			in.Body = req.Body
			in.ContentType = mediaFHIR
			if in.Method == "PATCH" {
				in.ContentType = "application/json-patch+json"
			}
		}
		resp := s.fhir.Do(callCtx, p, in)
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
