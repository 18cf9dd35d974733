// Package sdk is the Go SDK for sandbot bots: functions compiled to
// WebAssembly (GOOS=wasip1 GOARCH=wasm) and run by the sandbot server, one
// request at a time, in a fresh sandbox. It implements the bot ABI
// (ABI.md, version 1) so that a bot is only a handler:
//
//	package main
//
//	import "github.com/sandbot/sandbot/sdk"
//
//	func main() {}
//
//	func init() {
//		sdk.Handle(func(ctx sdk.Context, e sdk.Event) (any, error) {
//			var in struct{ Name string `json:"name"` }
//			if err := e.JSON(&in); err != nil {
//				return nil, err
//			}
//			return map[string]string{"greeting": "Hello, " + in.Name}, nil
//		})
//	}
//
// built as a reactor module:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o bot.wasm .
//
// In a c-shared build main is never called, so the handler is registered in
// init. Alternatively write
//
//	func main() { sdk.Handle(handler) }
//
// and build without -buildmode=c-shared: the module is then a WASI command
// (ABI.md, "Command"), and Handle, seeing itself called from main, reads the
// event from stdin and writes the envelope to stdout. Both shapes start a
// fresh Go runtime for every execution; the reactor is the recommended one.
//
// The handler's return value becomes the result envelope: a value is
// {"result": value}; a [Response] also sets the HTTP status and content
// type; an error is {"error": message} (an [*Error] may carry a status and
// an OperationOutcome). [Event] has typed accessors for the input (Text,
// JSON, Form, Resource, HL7). [Log] and [Logf] write to the execution's log;
// [Context.FHIR] calls the server's FHIR API as the bot.
//
// The SDK is a module of its own that needs nothing but the standard
// library; HL7 v2 parsing, editing and acknowledgements are its package
// github.com/sandbot/sandbot/sdk/hl7 ([Event.HL7] returns an *hl7.Message).
// A bot's go.mod therefore requires only the SDK, replaced with the path of
// the sdk folder of a sandbot checkout (the SDK is not published):
//
//	require github.com/sandbot/sandbot/sdk v0.0.0
//
//	replace github.com/sandbot/sandbot/sdk => /path/to/sandbot/sdk
//
// `sandbot bot new <dir>` writes such a module, with a test and a README.
//
// Outside wasip1 (for unit tests on the host) the package builds too:
// [Invoke] runs the registered handler on an event, Log writes to stderr and
// FHIR calls go to [SetFHIRTransport] (default: status 501).
package sdk
