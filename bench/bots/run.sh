#!/usr/bin/env bash
# Bot latency and throughput: wrk against a real sandbot executing the C echo
# and Go hello examples, and, in the same run, the reference approach (a Node
# server running the same handler through vm.runInNewContext per request).
#
# Usage: bench/bots/run.sh [duration, default 10s]   (needs wrk: apt-get install wrk)
# DATABASE_URL=postgres://... runs the server on PostgreSQL instead of SQLite.
# ONLY=js runs only the JavaScript comparison: a trivial JavaScript bot
# (return { ok: true }) through $execute against the Node peer running the
# same bot as the reference's vmcontext does, with a MedplumClient per request.
# ONLY=steady runs the C echo bot for the whole duration (CONNS_STEADY
# connections, default 1) and prints the audit journal's backlog every 10 s
# and how late the AuditEvents were stored.
# ONLY=tail runs the tail comparison: the C echo bot through $execute against
# the machine's floor (floor/main.go, a bare net/http handler answering the
# same request) and the durable floor (the same handler answering once a
# line is synced to disk, as sandbot's audit journal does), at 1 and 8
# connections, ROUNDS rounds (default 2), as wrk
# sees them (p50, p99, requests/s) and as ratios to both floors, and the
# server-side percentiles of the same requests.
# Server-side latency comes from sandbot's access log (exact per-request
# durations); client-side figures are wrk's.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR=${1:-10s}
CONNS=${CONNS:-8}
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }
work=$(mktemp -d)
# SIGINT stops the server without its drain, and the wait frees the ports for
# the next run; the floor, a background job of a script, ignores SIGINT and
# gets TERM (else a run that failed midway would wait for it forever).
trap 'kill -INT $(jobs -p) 2>/dev/null || true; [ -n "${FLOOR:-}" ] && kill "$FLOOR" "${DFLOOR:-}" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"' EXIT

make -s js # the JavaScript engine, embedded by the build
go build -o "$work/sandbot" ./cmd/sandbot
go build -o "$work/floor" ./bench/bots/floor
ID=bench-admin SECRET=bench-admin-secret-0123456789
# A server left from an earlier run would be measured instead of this one.
if curl -sf http://127.0.0.1:18110/healthcheck >/dev/null || curl -sf http://127.0.0.1:18130/ >/dev/null; then
  echo "port 18110 or 18130 is already in use: stop what listens there first" >&2
  exit 1
fi
SANDBOT_ADDR=127.0.0.1:18110 SANDBOT_METRICS_ADDR=127.0.0.1:19110 SANDBOT_BASE_URL=http://127.0.0.1:18110/ \
SANDBOT_DATA_DIR="$work/data" SANDBOT_DATABASE_URL="${DATABASE_URL:-}" SANDBOT_ADMIN_CLIENT_ID=$ID SANDBOT_ADMIN_CLIENT_SECRET=$SECRET \
SANDBOT_PPROF=true "$work/sandbot" serve >"$work/out.log" 2>"$work/server.log" &
for _ in $(seq 1 50); do curl -sf http://127.0.0.1:18110/healthcheck >/dev/null && break; sleep 0.2; done
B=http://127.0.0.1:18110
TOKEN=$(curl -s -u "$ID:$SECRET" -d grant_type=client_credentials $B/oauth2/token | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])')
export TOKEN
auth=(-H "Authorization: Bearer $TOKEN")

deploy() { # name wasm [auditEventTrigger] -> bot id
  local id trigger=""
  [ -n "${3:-}" ] && trigger=",\"auditEventTrigger\":\"$3\""
  id=$(curl -s "${auth[@]}" -H 'Content-Type: application/fhir+json' -d "{\"resourceType\":\"Bot\",\"name\":\"$1\"$trigger}" $B/fhir/R4/Bot | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  curl -sf "${auth[@]}" -H 'Content-Type: application/wasm' --data-binary @"$2" "$B/fhir/R4/Bot/$id/\$deploy" >/dev/null
  echo "$id"
}
deploy_js() { # name code -> bot id (runtimeVersion vmcontext)
  local id
  id=$(curl -s "${auth[@]}" -H 'Content-Type: application/fhir+json' -d "{\"resourceType\":\"Bot\",\"name\":\"$1\",\"runtimeVersion\":\"vmcontext\"}" $B/fhir/R4/Bot | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  curl -sf "${auth[@]}" -H 'Content-Type: application/javascript' --data-binary "$2" "$B/fhir/R4/Bot/$id/\$deploy" >/dev/null
  echo "$id"
}
if [ "${ONLY:-}" = tail ]; then
  ECHO=$(deploy c-echo examples/c-echo/c-echo.wasm)
  # (a background job of a script ignores SIGINT: the floor gets TERM.)
  "$work/floor" 127.0.0.1:18130 &
  FLOOR=$!
  # The durable floor: the same, answering once a 300-byte line is synced
  # to a file in the data directory's file system (floor/main.go).
  mkdir -p "$work/floor-data"
  "$work/floor" 127.0.0.1:18131 "$work/floor-data" &
  DFLOOR=$!
  sleep 1
  wrk -t1 -c2 -d2s -s bench/bots/post.lua "$B/fhir/R4/Bot/$ECHO/\$execute" >/dev/null
  wrk -t1 -c2 -d2s -s bench/bots/post.lua http://127.0.0.1:18130/ >/dev/null
  wrk -t1 -c2 -d2s -s bench/bots/post.lua http://127.0.0.1:18131/ >/dev/null
  tail_run() { # label conns url -> "p50_us p99_us rps"
    wrk -t1 -c"$2" -d"$DUR" --latency -s bench/bots/post.lua "$3" | python3 bench/bots/wrkstats.py
  }
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for c in 1 8; do
      f=$(TOKEN= tail_run floor "$c" http://127.0.0.1:18130/)
      d=$(TOKEN= tail_run durable "$c" http://127.0.0.1:18131/)
      seen=$(wc -l <"$work/server.log")
      s=$(tail_run sandbot "$c" "$B/fhir/R4/Bot/$ECHO/\$execute")
      # The same requests as the server timed them (its access log): what
      # wrk sees beyond is the response's way back and wrk's own wait.
      tail -n +"$((seen + 1))" "$work/server.log" >"$work/round.log"
      python3 - "$round" "$c" "$f" "$s" "$(python3 bench/bots/latency.py "$work/round.log" '$execute')" "$d" <<'PY'
import sys
r, c, f, s, srv, d = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(), sys.argv[5], sys.argv[6].split()
f50, f99, frps = map(float, f); s50, s99, srps = map(float, s); d50, d99, drps = map(float, d)
print(f"round {r}, {c} connection(s): floor p50 {f50:.0f} us p99 {f99:.0f} us {frps:,.0f}/s | "
      f"sandbot p50 {s50:.0f} us p99 {s99:.0f} us {srps:,.0f}/s | ratios p50 {s50/f50:.2f}x p99 {s99/f99:.2f}x rps {srps/frps:.2f}x")
print(f"  durable floor p50 {d50:.0f} us p99 {d99:.0f} us {drps:,.0f}/s | sandbot's ratios to it: "
      f"p50 {s50/d50:.2f}x p99 {s99/d99:.2f}x rps {srps/drps:.2f}x")
print(f"  sandbot {srv}")
PY
    done
  done
  kill "$FLOOR" "$DFLOOR"
  # Were the AuditEvents kept? (dropped, or executions that waited for the writer)
  curl -s http://127.0.0.1:19110/metrics | grep -E '^sandbot_bot_audit_(events_dropped|queue_full|journal_failures)' || true
  # How long the journal's syncs took, which an execution waits for (the
  # histogram's buckets: the quantile is at most the bound printed).
  curl -s http://127.0.0.1:19110/metrics | python3 -c '
import re, sys
b = [(float(le), float(c)) for le, c in re.findall(r"^sandbot_bot_audit_journal_sync_seconds_bucket\{le=\"([^\"]+)\"\} (\S+)", sys.stdin.read(), re.M)]
if b and b[-1][1]:
    q = lambda p: next(f"{le*1e3:g} ms" for le, c in b if c >= p * b[-1][1])
    print(f"audit journal syncs: p50 <= {q(.5)}, p99 <= {q(.99)} ({b[-1][1]:.0f} syncs)")
' || true
  exit 0
fi
if [ "${ONLY:-}" = steady ]; then
  # A steady load for DUR (say 60s) at CONNS connections (default here 1):
  # the audit journal's backlog every 10 s, then how late the AuditEvents
  # were stored (decision 60: at most about 10 s while executions go on).
  ECHO=$(deploy c-echo examples/c-echo/c-echo.wasm)
  wrk -t1 -c"${CONNS_STEADY:-1}" -d"$DUR" --latency -s bench/bots/post.lua "$B/fhir/R4/Bot/$ECHO/\$execute" >"$work/wrk.txt" &
  WRK=$!
  while kill -0 "$WRK" 2>/dev/null; do
    sleep 10
    echo "backlog: $(curl -s http://127.0.0.1:19110/metrics | grep -E '^sandbot_bot_audit_(queue_depth|journal_bytes) ' | tr '\n' ' ')"
  done
  grep -E 'Requests/sec|50%|99%' "$work/wrk.txt"
  for _ in $(seq 1 60); do # until the backlog is stored
    curl -s http://127.0.0.1:19110/metrics | grep -qE '^sandbot_bot_audit_queue_depth 0$' && break
    sleep 1
  done
  curl -s http://127.0.0.1:19110/metrics | python3 -c '
import re, sys
b = [(float(le), float(c)) for le, c in re.findall(r"^sandbot_bot_audit_write_lag_seconds_bucket\{le=\"([^\"]+)\"\} (\S+)", sys.stdin.read(), re.M)]
if b and b[-1][1]:
    print("AuditEvents stored within: " + ", ".join(f"{le:g} s: {c/b[-1][1]:.1%}" for le, c in b if le >= 1))
'
  exit 0
fi
TRIVIAL_JS=$(deploy_js trivial-js 'exports.handler = async function handler(medplum, event) { return { ok: true }; };')
if [ "${ONLY:-}" != js ]; then
ECHO=$(deploy c-echo examples/c-echo/c-echo.wasm)
ECHO_QUIET=$(deploy c-echo examples/c-echo/c-echo.wasm on-error)
HELLO=$(deploy hello examples/hello/hello.wasm)
fi

run() { # label url   (CONNS connections)
  echo "== $1"
  : >"$work/server.log"
  wrk -t1 -c"$CONNS" -d"$DUR" --latency -s bench/bots/post.lua "$2" | grep -E 'Requests/sec|50%|99%|Non-2xx' || true
}
# The JavaScript comparison: sandbot's JavaScript bot, then the Node peer.
wrk -t1 -c2 -d2s -s bench/bots/post.lua "$B/fhir/R4/Bot/$TRIVIAL_JS/\$execute" >/dev/null
run "sandbot trivial JavaScript bot (QuickJS in wazero, MedplumClient)" "$B/fhir/R4/Bot/$TRIVIAL_JS/\$execute"
python3 bench/bots/latency.py "$work/server.log" '$execute'
CONNS=1 run "sandbot trivial JavaScript bot at 1 connection (service time)" "$B/fhir/R4/Bot/$TRIVIAL_JS/\$execute"
python3 bench/bots/latency.py "$work/server.log" '$execute'
node bench/bots/node-vm-peer.mjs 18122 medplum 2>/dev/null &
sleep 1
wrk -t1 -c2 -d2s -s bench/bots/post.lua "http://127.0.0.1:18122/" >/dev/null
TOKEN= run "node vm.runInNewContext peer, reference vmcontext with a MedplumClient per request" "http://127.0.0.1:18122/"
kill %% 2>/dev/null || true
[ "${ONLY:-}" = js ] && exit 0

# warm up (compile caches, connections)
wrk -t1 -c2 -d2s -s bench/bots/post.lua "$B/fhir/R4/Bot/$ECHO/\$execute" >/dev/null
wrk -t1 -c2 -d2s -s bench/bots/post.lua "$B/fhir/R4/Bot/$HELLO/\$execute" >/dev/null

run "sandbot c-echo (C, reactor)" "$B/fhir/R4/Bot/$ECHO/\$execute"
python3 bench/bots/latency.py "$work/server.log" '$execute'
run "sandbot c-echo, auditEventTrigger=on-error (no AuditEvent per success)" "$B/fhir/R4/Bot/$ECHO_QUIET/\$execute"
python3 bench/bots/latency.py "$work/server.log" '$execute'
CONNS=1 run "sandbot c-echo at 1 connection (service time)" "$B/fhir/R4/Bot/$ECHO/\$execute"
python3 bench/bots/latency.py "$work/server.log" '$execute'
run "sandbot hello (Go SDK)" "$B/fhir/R4/Bot/$HELLO/\$execute"
python3 bench/bots/latency.py "$work/server.log" '$execute'

node bench/bots/node-vm-peer.mjs 18120 echo 2>/dev/null &
sleep 1
TOKEN= run "node vm.runInNewContext peer (echo)" "http://127.0.0.1:18120/"
kill %% 2>/dev/null || true
node bench/bots/node-vm-peer.mjs 18121 hello 2>/dev/null &
sleep 1
TOKEN= run "node vm.runInNewContext peer (hello)" "http://127.0.0.1:18121/"
