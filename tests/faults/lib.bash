# Sourced by tests/faults/run: what every fault case shares. A case starts real processes
# (a private PostgreSQL cluster, `checkout stubs`, `checkout serve` replicas, `checkout
# loadgen`), injects one fault, heals it, and hands the load's result to the one checker
# (`check_load`), which fails the case on any broken invariant. Everything a case starts or
# changes (processes, databases, namespaces, mounts) is undone by `cleanup` on any exit.
#
#   on_exit CMD...             run CMD at the case's exit (last registered, first run)
#   free_port                  a free 127.0.0.1 port
#   wait_until SECS WHAT CMD.. poll CMD every 0.2 s; fail the case loudly after SECS
#   fail MESSAGE               fail the case: the message, the logs kept
#   pg_cluster_start [ADDRS]   a private cluster (initdb into $WORK, own port); PG_PORT, PG_HOST
#   pg_ctl_do ARGS...          pg_ctl on it, as the postgres user
#   pg_new_database NAME       create NAME there and migrate it; prints its URL
#   stubs_start NAME HOST [FLAGS..]  `checkout stubs` on HOST (a free port), run under the
#                              command prefix STUBS_PREFIX (an array: `ip netns exec NS`);
#                              STUBS[NAME]=host:port, STUBS_ADMIN[NAME]
#   replica_start N HOST       `checkout serve` number N on HOST (a free port, the same one
#                              again on a restart), run under REPLICA_PREFIX (an array: `ip
#                              netns exec NS`, `env LD_PRELOAD=...`) with the flags
#                              REPLICA_FLAGS; REPLICA[N]=host:port, REPLICA_ADMIN[N],
#                              REPLICA_PID[N]
#   replica_stop N [SIGNAL]    stop it (TERM by default) and wait for it (tests/faults/run
#                              fails a case that leaves any of its processes running)
#   serving N / not_serving N  gRPC health of replica N says SERVING / NOT_SERVING
#   readyz N                   the HTTP status of replica N's /readyz
#   metric ADMIN REGEX         the sum of the samples of /metrics at ADMIN whose line matches
#   stub_calls NAME            every downstream call stubs NAME has answered (not StubControl,
#                              not health)
#   load_start SECS EXPECT [FLAGS..]  loadgen in the background at $RATE/s over every replica
#                              in REPLICA, --expect EXPECT, --ledger at STUBS[wallet] (or
#                              STUBS[main]); LOAD_PID, LOAD_OUT
#   check_load                 wait for it; print its figures; fail on any broken invariant
#   judge_load OUTPUT RC       the same checks over the output and exit code of a load run
#                              made elsewhere (deploy/local/run --crash-loop)

FAULTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$FAULTS_DIR/../.." && pwd)
BIN=${CHECKOUT_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/checkout}
BENCH=${CHECKOUT_BENCH_BIN:-$(dirname "$BIN")/checkout-bench}
RATE=${RATE:-300}

CLEANUP=()
on_exit() { CLEANUP+=("$(printf '%q ' "$@")"); }
cleanup() {
  local i
  for ((i = ${#CLEANUP[@]} - 1; i >= 0; i--)); do
    eval "${CLEANUP[$i]}" >/dev/null 2>&1 || true
  done
  CLEANUP=()
  if [[ -n "${KEEP:-}" ]]; then echo "  logs kept in $WORK"; else rm -rf "$WORK"; fi
}

say() { printf '  %s %s\n' "$(date +%T)" "$*"; }

fail() {
  printf '\n  FAILED: %s\n  logs in %s\n' "$*" "$WORK" >&2
  KEEP=1
  exit 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

wait_until() { # wait_until SECONDS WHAT COMMAND...
  local limit=$1 what=$2
  local until=$((SECONDS + limit))
  shift 2
  until "$@"; do
    ((SECONDS < until)) || fail "$what: not within $limit s${LAST_HEALTH:+ (health said: $LAST_HEALTH)}"
    sleep 0.2
  done
}

# Stops a process we started: SIGTERM (or the signal given), then SIGKILL after 15 s.
stop_pid() { # stop_pid PID [SIGNAL]
  kill -"${2:-TERM}" "$1" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# --- A private PostgreSQL cluster ---------------------------------------------------------------
# Why not the machine's server (127.0.0.1:5432): restarting or stopping it would break every
# other user of it — the CI's own PostgreSQL suites, other work on this machine — and its
# address cannot be moved into a namespace's reach. A cluster of our own (initdb into the case's
# directory, its own port) is restarted, stopped and cut off at will, and removed at the end.
PG_BIN=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
as_postgres() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pg_ctl_do() { as_postgres "$PG_BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" -w -t 30 "$@" >/dev/null; }
pg_cluster_start() { # pg_cluster_start [LISTEN_ADDRESSES]
  PG_PORT=$(free_port)
  PG_HOST=127.0.0.1
  mkdir -p "$WORK/pg"
  [[ $(id -u) -ne 0 ]] || chown postgres "$WORK" "$WORK/pg"
  as_postgres "$PG_BIN/initdb" -D "$WORK/pg" -U postgres -A trust --no-sync >"$WORK/initdb.log" 2>&1 ||
    { cat "$WORK/initdb.log" >&2; fail "initdb"; }
  cat >>"$WORK/pg/postgresql.conf" <<CONF
listen_addresses = '${1:-127.0.0.1}'
port = $PG_PORT
unix_socket_directories = '$WORK/pg'
max_connections = 200
CONF
  # Replicas in a namespace reach it over their veth (10.26.0.0/16).
  echo "host all all 10.26.0.0/16 trust" >>"$WORK/pg/pg_hba.conf"
  on_exit pg_ctl_do stop -m immediate
  pg_ctl_do start || { cat "$WORK/pg.log" >&2; fail "the private PostgreSQL did not start"; }
}
pg_new_database() { # pg_new_database NAME: prints postgres://postgres@$PG_HOST:$PG_PORT/NAME
  psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c "CREATE DATABASE $1" >/dev/null
  local url="postgres://postgres@${2:-$PG_HOST}:$PG_PORT/$1"
  "$BIN" migrate --database-url "postgres://postgres@127.0.0.1:$PG_PORT/$1" >>"$WORK/migrate.log" 2>&1 ||
    fail "migrating $1 (see migrate.log)"
  echo "$url"
}

# --- The stubs and the replicas -----------------------------------------------------------------
declare -A STUBS STUBS_ADMIN STUBS_PID
STUBS_PREFIX=()
stubs_start() { # stubs_start NAME HOST [FLAGS...]
  local name=$1 host=$2
  shift 2
  STUBS[$name]="$host:$(free_port)"
  STUBS_ADMIN[$name]="$host:$(free_port)"
  # The history keeps every effect of the load, so the ledger audit sees them all.
  "${STUBS_PREFIX[@]}" "$BIN" stubs --listen "${STUBS[$name]}" \
    --admin-listen "${STUBS_ADMIN[$name]}" --history-capacity 2000000 "$@" \
    >>"$WORK/stubs-$name.log" 2>&1 &
  STUBS_PID[$name]=$!
  on_exit stop_pid "$!"
  wait_until 20 "stubs $name listening" stubs_up "$name"
}
stubs_up() { curl -sf --max-time 2 "http://${STUBS_ADMIN[$1]}/healthz" >/dev/null; }

declare -A REPLICA REPLICA_ADMIN REPLICA_PID
REPLICA_PREFIX=()
REPLICA_FLAGS=()
replica_start() { # replica_start N HOST
  local n=$1 host=$2
  [[ -n "${REPLICA[$n]:-}" ]] || REPLICA[$n]="$host:$(free_port)"
  [[ -n "${REPLICA_ADMIN[$n]:-}" ]] || REPLICA_ADMIN[$n]="$host:$(free_port)"
  "${REPLICA_PREFIX[@]}" "$BIN" serve --listen "${REPLICA[$n]}" \
    --admin-listen "${REPLICA_ADMIN[$n]}" "${REPLICA_FLAGS[@]}" >>"$WORK/checkout-$n.log" 2>&1 &
  REPLICA_PID[$n]=$!
  on_exit stop_pid "$!"
  wait_until 30 "checkout-$n SERVING" serving "$n"
}
replica_stop() { stop_pid "${REPLICA_PID[$1]}" "${2:-TERM}"; }
# gRPC health of replica N as `checkout health` prints it (SERVING, NOT_SERVING, UNREACHABLE);
# the last answer is kept in LAST_HEALTH for the failure message.
LAST_HEALTH=
health_is() { # health_is N STATUS
  LAST_HEALTH=$("$BIN" health --addr "${REPLICA[$1]}" --timeout 2s 2>&1 | tr '\n' ' ')
  [[ $LAST_HEALTH == "$2 "* ]]
}
serving() { health_is "$1" SERVING; }
not_serving() { health_is "$1" NOT_SERVING; }
readyz() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://${REPLICA_ADMIN[$1]}/readyz" || true; }

metric() { # metric ADMIN REGEX: the sum of the matching samples (0 when none)
  curl -sf --max-time 2 "http://$1/metrics" | grep -E "$2" | grep -v '^#' |
    awk '{ s += $NF } END { printf "%d\n", s }'
}
stub_calls() { # every call of the four downstream services stubs $1 has answered
  metric "${STUBS_ADMIN[$1]}" '^rpc_server_call_duration_seconds_count\{rpc_method="(cart|fraud|inventory|wallet)\.'
}

# --- The load and the one checker ---------------------------------------------------------------
LOAD_PID=
LOAD_OUT=
load_start() { # load_start SECONDS EXPECT [LOADGEN FLAGS...]
  local seconds=$1 expect=$2 targets=() n
  shift 2
  for n in $(printf '%s\n' "${!REPLICA[@]}" | sort -n); do targets+=("${REPLICA[$n]}"); done
  LOAD_OUT="$WORK/loadgen.out"
  "$BENCH" loadgen --target "faults=$(
    IFS=,
    echo "${targets[*]}"
  )" --mode open --rate "$RATE" --duration "${seconds}s" --warmup 0s --window 5s \
    --drain 60s --expect "$expect" --ledger "${STUBS[wallet]:-${STUBS[main]}}" "$@" \
    >"$LOAD_OUT" 2>&1 &
  LOAD_PID=$!
  on_exit stop_pid "$LOAD_PID"
}

# The shared checker. loadgen has already judged every answer (--expect: only the outcomes the
# case allows, none after its deadline) and audited every order against the wallet (--ledger:
# none stuck PENDING after the drain; CONFIRMED held and captured once, never released;
# DECLINED never captured, any hold released; nothing captured for no order, nor before the
# deadline of the call that placed it; no hold left active; no effect after its call's
# deadline). Here its figures are printed and read back, so that a check that cannot see the
# orders (a lost ledger line, an empty run) fails too.
declare -A FIG
check_load() {
  local rc=0
  wait "$LOAD_PID" || rc=$?
  grep -E '^ +[0-9]+-[0-9]+s ' "$LOAD_OUT" | sed 's/^/    /' || true
  judge_load "$LOAD_OUT" "$rc"
}

# judge_load OUTPUT RC: the checker over a loadgen run's OUTPUT (with --expect and --ledger) and
# its exit code RC; FIG holds its figures after.
judge_load() {
  local out=$1 rc=$2
  grep -E '^ledger:' "$out" | sed 's/^/  /' || true
  local figures
  figures=$(grep -E '^ *figures:' "$out" | tail -n 1 | sed 's/^ *//')
  [[ -n "$figures" ]] || { tail -n 30 "$out" >&2; fail "loadgen printed no figures (exit $rc)"; }
  FIG=()
  local kv
  for kv in ${figures#figures: }; do FIG[${kv%%=*}]=${kv#*=}; done
  say "orders ${FIG[orders]}, held ${FIG[held]}, captured ${FIG[captured]}, released ${FIG[released]}, late ${FIG[late]}, stuck ${FIG[stuck]} (CONFIRMED ${FIG[confirmed]}, DECLINED ${FIG[declined]}, never recorded ${FIG[not_recorded]}, Hold calls ${FIG[hold_calls]})"
  echo "$CASE $figures" >>"$FAULTS_FIGURES"
  if ((rc != 0)); then
    grep -E 'behaviour check failed|ledger audit failed' -A12 "$out" >&2 || tail -n 20 "$out" >&2
    fail "the load's invariants are broken (exit $rc)"
  fi
  ((FIG[orders] > 0 && FIG[confirmed] > 0)) || fail "no order was confirmed: nothing was tested"
  local k
  for k in late stuck active after_deadline captured_early; do
    ((FIG[$k] == 0)) || fail "$k = ${FIG[$k]}"
  done
  ((FIG[captured] == FIG[confirmed])) || fail "captured ${FIG[captured]} != CONFIRMED ${FIG[confirmed]}"
}
