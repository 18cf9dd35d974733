package runtime

import (
	"context"
	"encoding/json"
	"github.com/sandbot/sandbot/internal/wasmtest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tetratelabs/wazero"

	"github.com/sandbot/sandbot/limits"
)

// FuzzInput: any body under any of the ABI's media types either is refused
// with an *InputError or becomes valid, compact JSON that Event.JSON can
// embed as it is (it does not re-validate); text comes back unchanged.
// The corpus entry in testdata is an HL7 body that is not UTF-8.
func FuzzInput(f *testing.F) {
	for _, s := range []string{"", "hello", `{"a":[1,2]}`, `{"resourceType":"Patient"}`, "a=1&b=2&a=3",
		"MSH|^~\\&|A|B|C|D|20240102||ADT^A01|1|P|2.5\rPID|||1\r", "\xff", " { \"x\" : 1 } "} {
		for mt := range 6 {
			f.Add(mt, []byte(s))
		}
	}
	types := []string{MediaText, MediaJSON, MediaFHIR, MediaForm, MediaHL7, ""}
	f.Fuzz(func(t *testing.T, mt int, body []byte) {
		mediaType := types[uint(mt)%uint(len(types))]
		in, err := Input(mediaType, body)
		if err != nil {
			if _, ok := err.(*InputError); !ok {
				t.Fatalf("%s: error %T %v is not an *InputError", mediaType, err, err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("%s: input %q is not valid JSON", mediaType, in)
		}
		ev := Event{ContentType: mediaType, Input: in}
		b, err := ev.JSON()
		if err != nil || !json.Valid(b) {
			t.Fatalf("%s: event %q not valid JSON: %v", mediaType, b, err)
		}
		if mediaType == MediaText || mediaType == MediaHL7 {
			// Text must be UTF-8 (else refused); HL7 in another encoding is
			// read as the reference reads it, each invalid byte as U+FFFD.
			want := string([]rune(string(body)))
			var s string
			if json.Unmarshal(in, &s) != nil || s != want || (mediaType == MediaText && !utf8.Valid(body)) {
				t.Fatalf("%s: text %q came back as %q", mediaType, body, in)
			}
		}
	})
}

// FuzzParseEnvelope: any bytes a bot returns are either refused as a bot
// failure or parsed into an envelope whose fields keep the ABI's rules.
func FuzzParseEnvelope(f *testing.F) {
	for _, s := range []string{`{}`, `{"result":1}`, `{"error":"x","status":404}`, `{"result":"a","contentType":"text/plain"}`,
		`{"status":500}`, `{"error":{"resourceType":"OperationOutcome"}}`, `{"result":1} x`, `[]`, "", `{"status":2e2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		env, err := parseEnvelope(b)
		if err != nil {
			if f, ok := err.(*Failure); !ok || f.Kind != FailEnvelope {
				t.Fatalf("error %T %v is not an envelope failure", err, err)
			}
			return
		}
		if env.Status != 0 && (env.Status < 200 || env.Status > 499) {
			t.Fatalf("status %d accepted", env.Status)
		}
		if env.Result != nil && !json.Valid(env.Result) {
			t.Fatalf("result %q is not valid JSON", env.Result)
		}
		if env.Error != nil && env.Error[0] != '"' && env.Error[0] != '{' {
			t.Fatalf("error %q is neither a string nor an object", env.Error)
		}
	})
}

// FuzzPrepareModule: the pre-parse and the rewrite never panic on any
// bytes, and the rewrite of a module the pre-parse accepts is valid for
// wazero exactly when the module is: the instrumentation never turns a valid
// module into an invalid one, nor an invalid one into a valid one. (wazero
// is only ever given what the pre-parse accepted: its own decoder allocates
// by the counts a module declares, so a 16-byte module can ask it for a
// 64 GB table.) Seeds: small hand-built modules (the fixtures, tens of
// kilobytes, slow the fuzzing engine to a crawl).
func FuzzPrepareModule(f *testing.F) {
	f.Add(wasmtest.Reactor(wasmtest.TightLoopBody))
	f.Add(wasmtest.Reactor(wasmtest.GrowBody))
	f.Add(wasmtest.CallTree(4).Build())
	f.Add(wasmtest.Module{Funcs: []wasmtest.Func{{Type: 2, Code: wasmtest.BrTable(5)}}}.Build())
	ctx := context.Background()
	wz := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer wz.Close(ctx)
	if err := instantiateHost(ctx, wz); err != nil {
		f.Fatal(err)
	}
	budget := limits.Default()
	b := &moduleBudget{
		functions: uint64(budget.ModuleFunctions), functionBytes: uint64(budget.ModuleFunctionBytes),
		functionLocals: uint64(budget.ModuleFunctionLocals), locals: uint64(budget.ModuleLocals),
		brTableTargets: uint64(budget.ModuleBrTableTargets), blockDepth: uint64(budget.ModuleBlockDepth),
		tableElements: uint64(budget.ModuleTableElements), types: uint64(budget.ModuleTypes),
		typeArity: uint64(budget.ModuleTypeArity), globals: uint64(budget.ModuleGlobals),
		dataSegments: uint64(budget.ModuleDataSegments), dataBytes: uint64(budget.BotMemoryBytes),
	}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		_, prepared, _, err := prepareModule(wasm, b, 1<<20)
		if err != nil {
			return
		}
		orig, oerr := wz.CompileModule(ctx, wasm)
		if oerr == nil {
			orig.Close(ctx)
		}
		cm, err := wz.CompileModule(ctx, prepared)
		if err == nil {
			cm.Close(ctx)
		}
		if oerr != nil && strings.Contains(oerr.Error(), "custom section") {
			return // the rewrite drops custom sections (wazero refuses an empty name)
		}
		if (oerr == nil) != (err == nil) {
			t.Fatalf("the module is valid: %v, its rewrite: %v", oerr, err)
		}
	})
}
