// Package runtime executes sandbot bots: user functions compiled to
// WebAssembly and run, one request at a time, inside wazero sandboxes.
//
// The contract between host and guest is the bot ABI (sdk/ABI.md, version 1):
// a module is either a reactor exporting sandbot_alloc and sandbot_handle or
// a WASI command exporting _start; it receives one event JSON and answers
// one result envelope JSON; it may import only sandbot.log, sandbot.fhir and
// wasi_snapshot_preview1.
//
// A Runtime validates and compiles a module once ([Runtime.Compile]): it
// holds the module against a budget of its structure before wazero sees it,
// instruments it (fuel checked at every function entry and loop header, so
// that every code shape meets its deadline and returns to Go for the garbage
// collector, and a call depth limit), and has it compiled in a child process
// under CPU and memory rlimits ([RunCompilerChild]). It keeps the module in
// memory under the SHA-256 of its bytes and in wazero's on-disk compilation
// cache, and runs every execution in a fresh anonymous instance
// ([Runtime.Execute]) under a deadline and memory, output and log limits,
// once admitted against the node's execution memory budget.
// JavaScript bots, the reference platform's ([Runtime.CompileJS]), run in
// QuickJS-NG compiled to WASI, instrumented the same way (fuel is the only
// deadline of any code the runtime runs), inside the same wazero runtime and
// limits,
// each execution restored from an image of the engine with @medplum/core and
// the bot's module evaluated.
// The package knows nothing of HTTP or storage. Of FHIR and HL7 it knows
// only what the ABI's input mapping needs ([Input]: an application/fhir+json
// input is an object with a resourceType; an HL7 input must parse with
// package hl7); a bot's FHIR calls go to a callback supplied per execution
// ([Execution].FHIR). Its limits come from package limits ([Config].Limits).
// See RATIONALE.md for the design choices.
package runtime
