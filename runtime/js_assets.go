package runtime

import (
	"embed"
	"errors"
)

// The JavaScript engine's third-party parts are fetched by `make js` (npm ci
// against runtime/jsengine/package-lock.json, which pins them with their
// checksums) into jsengine/dist, which holds only a .keep in the repository:
// a binary built without them still runs WebAssembly bots, and answers a
// JavaScript bot with ErrJSUnavailable.
//
//go:embed all:jsengine/dist
var jsDist embed.FS

// polyfills.js and bridge.js are sandbot's own JavaScript (see their heads).
var (
	//go:embed jsengine/polyfills.js
	jsPolyfills string
	//go:embed jsengine/bridge.js
	jsBridge string
)

// ErrJSUnavailable is returned for a JavaScript bot by a binary built
// without the engine.
var ErrJSUnavailable = errors.New("JavaScript bots are not available in this build of sandbot: its JavaScript engine was not fetched; run `make js` (npm ci in runtime/jsengine) and build again, or `make run` or `make build`, which do both")

// JSAvailable reports whether this binary embeds the JavaScript engine: a
// binary built by `go build`, `go install` or `go run` without `make js`
// first does not (it serves WebAssembly bots only).
func JSAvailable() bool {
	_, _, err := jsAssets()
	return err == nil
}

// jsAssets returns the engine (QuickJS-NG compiled to WASI) and the
// @medplum/core CommonJS bundle, or ErrJSUnavailable.
func jsAssets() (engine, core []byte, err error) {
	engine, err1 := jsDist.ReadFile("jsengine/dist/quickjs.wasm")
	core, err2 := jsDist.ReadFile("jsengine/dist/medplum-core.cjs")
	if err1 != nil || err2 != nil || len(engine) == 0 || len(core) == 0 {
		return nil, nil, ErrJSUnavailable
	}
	return engine, core, nil
}
