#!/usr/bin/env bash
# The replicas topology as plain processes: its own PostgreSQL cluster (a
# temporary data directory on a free port; the machine's own PostgreSQL is
# never touched), three sandbot replicas built from this checkout, and
# HAProxy in front of them, health-checking /readyz. The same topology as
# deploy/compose and deploy/kubernetes, for machines without a container
# engine; deploy/local/replicas_test.go runs the fault tests on it.
#
#   deploy/local/run.sh test          start everything, run the tests, stop everything
#                                     (SANDBOT_TOPOLOGY_RUN=regexp: only those tests)
#   deploy/local/run.sh up [DIR]      start everything in DIR (default: a new temporary
#                                     directory) and print how to reach it; DIR/env has
#                                     the addresses
#   deploy/local/run.sh down DIR      stop what `up` started
#
# Subcommands the tests use on a running topology (STATE=DIR in the environment):
#   pg-restart fast|immediate         restart PostgreSQL with that shutdown mode
#   replica-signal N SIGNAL           send SIGNAL to replica N (1-3)
#   replica-start N                   start replica N again
#
# Needs: Go, PostgreSQL server binaries (initdb, pg_ctl), HAProxy (Debian:
# apt-get install haproxy). As root, PostgreSQL runs as the postgres user.
set -euo pipefail
shopt -s inherit_errexit
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
REPLICAS=3

pgbin() {
  if [ -n "${PGBIN:-}" ]; then echo "$PGBIN"; return; fi
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
  if [ -n "$d" ]; then echo "$d"; else dirname "$(command -v initdb)"; fi
}

# as_pg runs a PostgreSQL command as the postgres user when we are root
# (initdb refuses root).
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# free_ports prints N distinct ports no one listens on, below the kernel's
# range of ephemeral ports (outgoing connections take those, and a port
# taken that way cannot be bound).
free_ports() {
  local p lo picked=" " n=0
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  while [ $n -lt "$1" ]; do
    p=$((15000 + RANDOM % (lo - 15000)))
    case "$picked" in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      picked="$picked$p "
      echo "$p"
      n=$((n + 1))
    fi
  done
}

wait_http() { # URL SECONDS
  local i
  for i in $(seq 1 $(($2 * 10))); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2
  return 1
}

requirements() {
  local missing=()
  command -v go >/dev/null || missing+=(go)
  command -v haproxy >/dev/null || missing+=("haproxy (apt-get install haproxy)")
  command -v curl >/dev/null || missing+=(curl)
  [ -x "$(pgbin)/initdb" ] || missing+=("PostgreSQL server binaries (initdb, pg_ctl)")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "deploy/local: missing: ${missing[*]}" >&2
    return 1
  fi
}

start_replica() { # N
  local n=$1
  # shellcheck disable=SC1091
  . "$STATE/env"
  local api="SANDBOT_REPLICA${n}_API" ops="SANDBOT_REPLICA${n}_OPS"
  mkdir -p "$STATE/replica$n"
  (
    export SANDBOT_ADDR="${!api#http://}" SANDBOT_METRICS_ADDR="${!ops#http://}"
    export SANDBOT_DATABASE_URL="$SANDBOT_TOPOLOGY_DATABASE_URL" SANDBOT_BASE_URL="$SANDBOT_LB_URL/"
    export SANDBOT_DATA_DIR="$STATE/replica$n" SANDBOT_ADMIN_CLIENT_ID="$SANDBOT_TOPOLOGY_ADMIN_ID"
    export SANDBOT_ADMIN_CLIENT_SECRET="$SANDBOT_TOPOLOGY_ADMIN_SECRET" SANDBOT_TRUSTED_PROXIES=127.0.0.2/32
    export SANDBOT_SHUTDOWN_DRAIN=3s SANDBOT_SHUTDOWN_TIMEOUT=20s SANDBOT_LOG_LEVEL=warn
    # Schedules with seconds, so that the cron test need not wait minutes.
    export SANDBOT_CRON_FIELDS=6
    exec "$STATE/sandbot" serve >>"$STATE/logs/replica$n.log" 2>&1
  ) &
  echo $! >"$STATE/replica$n.pid"
  wait_http "${!ops}/readyz" 60
}

up() {
  requirements
  STATE="${1:-$(mktemp -d /tmp/sandbot-replicas.XXXXXX)}"
  export STATE
  mkdir -p "$STATE/logs"
  chmod 755 "$STATE"
  echo "deploy/local: building sandbot" >&2
  (cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$STATE/sandbot" ./cmd/sandbot)

  local pgport lbport ports
  mapfile -t ports < <(free_ports $((2 + 2 * REPLICAS)))
  pgport=${ports[0]}
  lbport=${ports[1]}
  {
    echo "STATE=$STATE"
    echo "PGDATA=$STATE/pgdata"
    echo "PGPORT=$pgport"
    echo "SANDBOT_TOPOLOGY_DATABASE_URL=postgres://postgres@127.0.0.1:$pgport/sandbot?sslmode=disable"
    echo "SANDBOT_TOPOLOGY_ADMIN_ID=topology-admin"
    echo "SANDBOT_TOPOLOGY_ADMIN_SECRET=topology-admin-secret-$RANDOM$RANDOM"
    echo "SANDBOT_LB_URL=http://127.0.0.1:$lbport"
    for n in $(seq 1 $REPLICAS); do
      echo "SANDBOT_REPLICA${n}_API=http://127.0.0.1:${ports[2 * n]}"
      echo "SANDBOT_REPLICA${n}_OPS=http://127.0.0.1:${ports[2 * n + 1]}"
    done
  } >"$STATE/env"
  # shellcheck disable=SC1091
  . "$STATE/env"

  echo "deploy/local: PostgreSQL on port $pgport ($STATE/pgdata)" >&2
  mkdir -p "$STATE/pgdata" "$STATE/pgsock"
  [ "$(id -u)" = 0 ] && chown postgres "$STATE/pgdata" "$STATE/pgsock" "$STATE/logs"
  as_pg "$(pgbin)/initdb" -D "$STATE/pgdata" -A trust -U postgres >"$STATE/logs/initdb.log" 2>&1
  cat >>"$STATE/pgdata/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $pgport
unix_socket_directories = '$STATE/pgsock'
max_connections = 200
# Durable commits, as in production: what a client saw committed must
# survive the -m immediate restart of the tests.
fsync = on
synchronous_commit = on
CONF
  as_pg "$(pgbin)/pg_ctl" -D "$STATE/pgdata" -l "$STATE/logs/postgres.log" -w start >/dev/null
  as_pg "$(pgbin)/psql" -h 127.0.0.1 -p "$pgport" -U postgres -qc 'CREATE DATABASE sandbot' >/dev/null

  # Migrations once, as the Kubernetes Job does; then the replicas.
  SANDBOT_DATABASE_URL="$SANDBOT_TOPOLOGY_DATABASE_URL" SANDBOT_DATA_DIR="$STATE" SANDBOT_LOG_LEVEL=warn \
    "$STATE/sandbot" migrate >>"$STATE/logs/migrate.log" 2>&1
  for n in $(seq 1 $REPLICAS); do start_replica "$n"; done

  # HAProxy connects to the replicas from 127.0.0.2, the one address they
  # trust to say who the client is (SANDBOT_TRUSTED_PROXIES).
  {
    cat <<CFG
global
  maxconn 4096
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  option forwardfor
  option redispatch
  retries 3
frontend api
  bind 127.0.0.1:$lbport
  default_backend sandbot
backend sandbot
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  timeout check 1s
  default-server inter 200ms fastinter 100ms downinter 200ms fall 2 rise 2 source 127.0.0.2
CFG
    for n in $(seq 1 $REPLICAS); do
      api="SANDBOT_REPLICA${n}_API" ops="SANDBOT_REPLICA${n}_OPS"
      echo "  server replica$n ${!api#http://} check port ${!ops##*:}"
    done
  } >"$STATE/haproxy.cfg"
  haproxy -f "$STATE/haproxy.cfg" -db >>"$STATE/logs/haproxy.log" 2>&1 &
  echo $! >"$STATE/haproxy.pid"
  wait_http "$SANDBOT_LB_URL/healthcheck" 30
  echo "deploy/local: up; balancer $SANDBOT_LB_URL, state in $STATE (deploy/local/run.sh down $STATE)" >&2
  echo "$STATE"
}

kill_pidfile() { # PIDFILE [SIGNAL]
  [ -f "$1" ] || return 0
  local pid
  pid=$(cat "$1")
  kill -s "${2:-TERM}" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$1"
}

down() {
  STATE="$1"
  [ -f "$STATE/env" ] || { rm -rf "$STATE"; return 0; }
  # shellcheck disable=SC1091
  . "$STATE/env"
  kill_pidfile "$STATE/haproxy.pid"
  # SIGINT: stop without the drain a SIGTERM would wait for.
  for n in $(seq 1 $REPLICAS); do kill_pidfile "$STATE/replica$n.pid" INT; done
  as_pg "$(pgbin)/pg_ctl" -D "$STATE/pgdata" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$STATE"
}

case "${1:-}" in
up) shift; up "$@" ;;
down) down "$2" ;;
pg-restart)
  # shellcheck disable=SC1091
  . "$STATE/env"
  as_pg "$(pgbin)/pg_ctl" -D "$PGDATA" -l "$STATE/logs/postgres.log" -m "$2" -w restart >/dev/null
  ;;
replica-signal)
  kill -s "$3" "$(cat "$STATE/replica$2.pid")"
  ;;
replica-start)
  start_replica "$2"
  ;;
test)
  if ! requirements; then
    if [ "${CI:-}" = true ]; then exit 1; fi
    echo "deploy/local: skipping the replicas tests" >&2
    exit 0
  fi
  STATE="$(mktemp -d /tmp/sandbot-replicas.XXXXXX)"
  export STATE
  # Whatever happens, what was started is stopped; on failure the logs are
  # shown first.
  on_exit() {
    local status=$?
    if [ $status -ne 0 ]; then
      for f in "$STATE"/logs/*.log; do echo "== $f"; tail -n 40 "$f"; done
    fi
    down "$STATE"
    exit $status
  }
  trap on_exit EXIT
  up "$STATE" >/dev/null
  cd "$repo"
  SANDBOT_TOPOLOGY="$here/run.sh" go test -tags replicas -count=1 -v -timeout 10m ${SANDBOT_TOPOLOGY_RUN:+-run "$SANDBOT_TOPOLOGY_RUN"} ./deploy/local/
  ;;
*)
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
