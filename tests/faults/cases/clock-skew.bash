# Fault case clock-skew: one replica's wall clock 3 s ahead, then 3 s behind; a caller 2 s ahead.
#
# libfaketime (Debian `faketime`) is preloaded into one of two replicas on one private
# PostgreSQL cluster with FAKETIME_DONT_FAKE_MONOTONIC=1, so only its wall clock moves: its
# monotonic clock — every timeout, budget and deadline it spends — stays true. The stubs, the
# database and the loader keep the machine's clock.
#
# Each skew is its own run ($RATE orders/s for 30 s with a fresh database and stubs; a 1,100 ms
# deadline and the wallet's Hold taking 200 ms — below the breaker's 250 ms slow-call
# threshold — so each order is still being worked 100 ms before its deadline minus 1 s, when a
# replica 3 s off would take it over): then no order may be taken over while its owner still works it, and no
# job may run before it is due by the owner's clock. Either would show as Hold calls beyond one
# per order held (a takeover re-sends the hold while the owner's is in flight), a capture
# before the deadline of the call that placed the order (its capture job claimed early), or an
# effect the wallet applied after the deadline its call carried (a replica behind sends
# `x-request-deadline` already past). A lease taken early is the same comparison as a job due
# early (each is a time one replica wrote and another compares with its own clock). The
# skewed replica must also report the offset it measured from the database's clock
# (`checkout_store_clock_offset_seconds`, about the skew negated) and log it.
#
# SKEWS (default "+3s -3s") chooses the offsets, one run each.
#
# Last, a caller whose clock is 2 s ahead sends `x-request-deadline` (1,000 ms by its clock)
# and nothing else: the service reads 2,995 ms (its deadline minus our now minus the 5 ms
# clock_skew_allowance), capped at server_budget_max, and says so in the waterfall
# (docs/design.md §3, Clock skew).

FAKETIME_LIB=
for lib in /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 /usr/lib/*/faketime/libfaketimeMT.so.1; do
  [[ -f $lib ]] && FAKETIME_LIB=$lib && break
done

skew_env() { # skew_env OFFSET: the `env` prefix that moves a command's wall clock by OFFSET
  SKEW_ENV=(env LD_PRELOAD="$FAKETIME_LIB" FAKETIME="$1" FAKETIME_DONT_FAKE_MONOTONIC=1)
}
skewed() { # skewed OFFSET COMMAND...: COMMAND with its wall clock moved by OFFSET (foreground)
  local SKEW_ENV
  skew_env "$1"
  shift
  "${SKEW_ENV[@]}" "$@"
}

skew_run() { # skew_run OFFSET NAME
  local offset=$1 name=$2 db
  db=$(pg_new_database "$name")
  stubs_start main 127.0.0.1 --behavior wallet.Hold=latency:200
  REPLICA=() REPLICA_ADMIN=() REPLICA_PID=()
  REPLICA_FLAGS=(--database-url "$db" --downstream "${STUBS[main]}")
  REPLICA_PREFIX=()
  replica_start 1 127.0.0.1
  # A replica's prefix must exec the server (env does) so that REPLICA_PID is the server's
  # own pid: a shell function here ran it as a child of a subshell, which replica_stop killed
  # while the skewed replica lived on with its port open.
  local SKEW_ENV
  skew_env "$offset"
  REPLICA_PREFIX=("${SKEW_ENV[@]}")
  replica_start 2 127.0.0.1
  REPLICA_PREFIX=()
  local their ours
  ours=$(date +%s)
  their=$(skewed "$offset" date +%s)
  say "checkout-2's wall clock at $offset (date there: $((their - ours)) s from ours); $RATE orders/s for 30 s, deadline 1100 ms, wallet Hold 200 ms"
  load_start 30 "CONFIRMED" --deadline-ms 1100
  # The skewed replica measured the database's clock: its offset cancels the skew, and it said
  # so in its log (the offset is over store::clock's LARGE_OFFSET of 1 s).
  local measured
  measured=$(curl -sf --max-time 2 "http://${REPLICA_ADMIN[2]}/metrics" |
    awk '/^checkout_store_clock_offset_seconds / { print $2 }')
  awk -v m="${measured:-nan}" -v s="${offset%s}" 'BEGIN { d = m + s; exit !(d < 0.5 && d > -0.5) }' ||
    fail "checkout-2's checkout_store_clock_offset_seconds is ${measured:-missing}, not about ${offset%s} negated"
  grep -q "clock is off the database's" "$WORK/checkout-2.log" ||
    fail "checkout-2 did not log that its clock is off the database's"
  say "checkout-2 measured checkout_store_clock_offset_seconds $measured and logged it"
  check_load
  local extra=$((FIG[hold_calls] - FIG[held]))
  ((extra == 0)) || fail "$extra Hold calls beyond one per order held: orders taken over while their owner still worked them"
  say "one Hold call per order held: no order taken over early, no job run before it was due"
  replica_stop 1
  replica_stop 2
  stop_pid "${STUBS_PID[main]}"
}

caller_ahead() {
  local db out
  db=$(pg_new_database caller_ahead)
  stubs_start main 127.0.0.1
  REPLICA=() REPLICA_ADMIN=() REPLICA_PID=()
  REPLICA_FLAGS=(--database-url "$db" --downstream "${STUBS[main]}")
  replica_start 1 127.0.0.1
  out=$(skewed +2s "$BIN" place --addr "http://${REPLICA[1]}" --deadline-header x-request-deadline \
    --deadline-ms 1000 --client-id faults 2>&1) || true
  echo "$out" >"$WORK/caller-ahead.out"
  grep -Eq '^status +CONFIRMED' <<<"$out" || { echo "$out" >&2; fail "the caller 2 s ahead was not answered CONFIRMED"; }
  grep -q 'deadline 2400ms from x-request-deadline' <<<"$out" ||
    { echo "$out" >&2; fail "a caller 2 s ahead asking for 1,000 ms: expected the capped 2,400 ms from x-request-deadline"; }
  say "a caller 2 s ahead asking for 1,000 ms by x-request-deadline alone: read as 2,995 ms, capped at 2,400 ms ($(grep -o 'deadline [0-9]*ms from [a-z-]*' <<<"$out"))"
}

case_main() {
  [[ -n $FAKETIME_LIB ]] || fail "libfaketime is not installed (apt-get install faketime)"
  pg_cluster_start
  local offset n=0
  for offset in ${SKEWS-+3s -3s}; do
    skew_run "$offset" "skew_$((n += 1))"
  done
  caller_ahead
}
