# Fault case pg-restart: PostgreSQL restarted under load, then down for 10 s.
#
# Two replicas on one private cluster, $RATE orders/s over both for 50 s. At 8 s the cluster is
# restarted (`pg_ctl restart -m fast`: every connection closed, down about a second); once both
# replicas serve again it is stopped for 10 s and started. While it is down each replica must
# (1) turn NOT_SERVING on gRPC health and 503 on /readyz, (2) answer PlaceOrder UNAVAILABLE with
# RetryInfo — never RESOURCE_EXHAUSTED OVERLOADED (a store that is down is not overload), or
# PENDING for an order recorded before — and (3) call no one: no downstream call between 3 s
# into the outage (the orders and job attempts in flight when it began have ended by then: a
# deadline is at most 2.4 s, an attempt 2 s) and its end. After it, both serve again without a
# restart and every recorded order finishes: the shared checker.

case_main() {
  pg_cluster_start
  local db
  db=$(pg_new_database faults)
  stubs_start main 127.0.0.1
  REPLICA_FLAGS=(--database-url "$db" --downstream "${STUBS[main]}")
  replica_start 1 127.0.0.1
  replica_start 2 127.0.0.1
  say "2 replicas on a private PostgreSQL (port $PG_PORT); $RATE orders/s for 50 s"

  load_start 50 "CONFIRMED,PENDING IN_PROGRESS,PENDING BUDGET_EXHAUSTED,PENDING WALLET_OUTCOME_UNKNOWN,error Unavailable with RetryInfo"
  sleep 8
  say "pg_ctl restart -m fast"
  pg_ctl_do restart -m fast
  wait_until 30 "checkout-1 SERVING after the restart" serving 1
  wait_until 30 "checkout-2 SERVING after the restart" serving 2
  say "both replicas SERVING again"

  sleep 8
  say "pg_ctl stop -m fast: down for 10 s"
  local down_at=$SECONDS
  pg_ctl_do stop -m fast
  local n
  for n in 1 2; do
    wait_until 5 "checkout-$n NOT_SERVING while PostgreSQL is down" not_serving "$n"
    [[ $(readyz "$n") == 503 ]] || fail "checkout-$n /readyz is $(readyz "$n"), not 503, while PostgreSQL is down"
  done
  say "both replicas NOT_SERVING, /readyz 503"
  sleep $((down_at + 3 - SECONDS))
  local calls_before
  calls_before=$(stub_calls main)
  sleep $((down_at + 10 - SECONDS))
  local calls_during=$(($(stub_calls main) - calls_before))
  for n in 1 2; do
    not_serving "$n" || fail "checkout-$n turned SERVING while PostgreSQL is still down"
  done
  say "pg_ctl start; downstream calls from 3 s into the outage to its end: $calls_during"
  pg_ctl_do start
  ((calls_during == 0)) || fail "$calls_during downstream calls while the store was down: PlaceOrder must call no one"
  for n in 1 2; do
    wait_until 30 "checkout-$n SERVING after PostgreSQL came back" serving "$n"
    [[ $(readyz "$n") == 200 ]] || fail "checkout-$n /readyz is $(readyz "$n") after recovery"
  done
  say "both replicas SERVING and /readyz 200 again, $((SECONDS - down_at)) s after the stop"

  check_load
  local refused overloaded
  refused=$(grep -oE 'error Unavailable with RetryInfo [0-9]+' "$LOAD_OUT" | tail -n 1 | awk '{ print $NF }')
  ((${refused:-0} > 0)) || fail "no order was refused UNAVAILABLE while PostgreSQL was down: the fault did not bite"
  overloaded=0
  for n in 1 2; do
    overloaded=$((overloaded + $(metric "${REPLICA_ADMIN[$n]}" '^checkout_admission_rejected_total\{reason="overloaded"\}')))
  done
  ((overloaded == 0)) || fail "$overloaded orders refused OVERLOADED while the store was down"
  say "$refused orders refused UNAVAILABLE with RetryInfo, 0 OVERLOADED; $calls_during downstream calls while down"
}
