#!/usr/bin/env bash
# Runs one fuzz target for a duration: scripts/fuzz.sh DIR PACKAGE TARGET FUZZTIME
#
# Go 1.26's fuzz coordinator can fail a run at the -fuzztime boundary with a
# bare "context deadline exceeded" when a worker is still mid-execution
# (go.dev/issue/75804, fixed in Go 1.27). Such a run found nothing: a real
# finding prints "Failing input written to" and saves a reproducer under
# testdata/fuzz. That one case is run again, once; every other failure fails.
set -uo pipefail
dir=$1 pkg=$2 target=$3 fuzztime=$4
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for attempt in 1 2; do
  (cd "$dir" && ${GO:-go} test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime") >"$log" 2>&1
  status=$?
  cat "$log"
  [ $status -eq 0 ] && exit 0
  if [ $attempt -eq 1 ] && grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written to' "$log"; then
    echo "fuzz.sh: $target stopped at the -fuzztime boundary without a finding (go.dev/issue/75804); running it again"
    continue
  fi
  exit $status
done
