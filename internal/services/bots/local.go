package bots

import (
	"context"
	"encoding/json"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/internal/principal"
	"github.com/sandbot/sandbot/runtime"
)

// Local is an execution outside any server (sandbot bot run): a module the
// caller compiled, an input it decoded with LocalInput, and its own answer
// to the bot's FHIR calls. It runs through the same path as every other
// execution: the same limits and admission, and an AuditEvent handed to
// Config.AuditTo.
type Local struct {
	Module *runtime.Module
	// Name is the Bot's display name (the file's).
	Name string
	// MediaType and Input are the event's (LocalInput).
	MediaType string
	Input     json.RawMessage
	Headers   map[string]string
	TraceID   string
	// FHIR answers the bot's FHIR calls; nil leaves them to the runtime,
	// which answers 501.
	FHIR func(context.Context, []byte) []byte
}

// localProject and localBot stand for the project and Bot of a local run.
const (
	localProject = "local"
	localBot     = "local"
)

// LocalInput decodes a local run's input as $execute decodes a body of
// mediaType (a JavaScript bot takes any JSON type as JSON).
func (s *Service) LocalInput(mediaType string, body []byte, javaScript bool) (json.RawMessage, error) {
	_, in, err := s.decodeInput(mediaType, body, javaScript)
	return in, err
}

// RunLocal runs l.
func (s *Service) RunLocal(ctx context.Context, l Local) (*runtime.Result, error) {
	runtimeVersion := "wasm"
	if l.Module.Shape() == runtime.JavaScript {
		runtimeVersion = "vmcontext"
	}
	t := &target{
		rec:     &fhir.Record{ResourceType: "Bot", ID: localBot, Project: localProject},
		bot:     fhir.Resource{"resourceType": "Bot", "id": localBot, "name": l.Name, "runtimeVersion": runtimeVersion},
		project: fhir.Resource{"resourceType": "Project", "id": localProject},
		local:   &localRun{mod: l.Module, fhir: l.FHIR},
	}
	p := &principal.Principal{ProjectID: localProject, Profile: "ClientApplication/local"}
	c := call{mediaType: l.MediaType, input: l.Input, headers: l.Headers, traceID: l.TraceID, trigger: TriggerLocal}
	return s.run(ctx, p, t, c)
}

// localRun is what a local run brings instead of the store's: the module,
// and the answer to the bot's FHIR calls.
type localRun struct {
	mod  *runtime.Module
	fhir func(context.Context, []byte) []byte
}
