# Fault case partition: network partitions between processes, in network namespaces.
#
# Every replica and the wallet run in a namespace of their own (`ip netns`), joined to this
# machine's namespace by veth pairs on one bridge (10.26.0.0/24): the private PostgreSQL
# cluster, the other stubs and the load stay here (10.26.0.1), checkout-1 is 10.26.0.11,
# checkout-2 10.26.0.12, the wallet 10.26.0.20 (its own `checkout stubs`: the replicas'
# [downstream] table sends only the wallet there; the ledger audits that process). Faults are
# nftables rules that DROP packets inside a namespace — never a refusal: an established
# connection is left half-open, and a new one never completes its handshake — and
# tests/faults/delay_relay.py for added latency (this kernel has no `tc netem`; the relay sits
# on the wallet's address in its namespace, so every replica's wallet traffic crosses it).
#
# $RATE orders/s over both replicas for 100 s, through three faults:
# 1. checkout-1 cut off from PostgreSQL for 15 s: it must turn NOT_SERVING and answer UNAVAILABLE
#    with RetryInfo (or PENDING for an order recorded before) — never OVERLOADED — while
#    checkout-2 keeps serving and takes over what checkout-1 left; after the heal checkout-1
#    serves again, unrestarted, with no answer late.
# 2. the wallet cut off from both replicas for 15 s while holds are in flight (100 ms added on
#    its link for the while, some 30 holds under way at any moment): every answer still in time — PENDING WALLET_OUTCOME_UNKNOWN for the holds cut
#    mid-way; OVERLOADED too, while orders wait out their hold's cap until the breaker opens —
#    the Hold breaker opens, closes again after the heal, and the reconciler resolves every
#    unknown hold (the checker: none stuck), none applied after its call's deadline.
# 3. 200 ms of added latency and 5 % packet loss each way on the wallet link for 20 s: answers
#    stay in time, the replicas' Hold calls take the added 200 ms (their client histogram).
# Needs root (ip netns, veth, a bridge, nft; iproute2 and nftables are installed when missing).

SUFFIX=$(($$ % 10000))
NS_NET=ck$SUFFIX-net
declare -A NS_ADDR=([r1]=10.26.0.11 [r2]=10.26.0.12 [w]=10.26.0.20)
HOST_ADDR=10.26.0.1

ns() { echo "ck$SUFFIX-$1"; }
in_ns() { local n=$1; shift; ip netns exec "$(ns "$n")" "$@"; }

network_up() {
  ip netns add "$NS_NET"
  on_exit ip netns del "$NS_NET"
  ip netns exec "$NS_NET" ip link add br0 type bridge
  ip netns exec "$NS_NET" ip link set br0 up
  # This machine's end.
  ip link add "vh$SUFFIX" type veth peer name "bh$SUFFIX"
  on_exit ip link del "vh$SUFFIX"
  ip link set "bh$SUFFIX" netns "$NS_NET"
  ip netns exec "$NS_NET" ip link set "bh$SUFFIX" master br0 up
  ip addr add "$HOST_ADDR/24" dev "vh$SUFFIX"
  ip link set "vh$SUFFIX" up
  local n
  for n in r1 r2 w; do
    ip netns add "$(ns "$n")"
    on_exit ip netns del "$(ns "$n")"
    ip link add "v$n$SUFFIX" type veth peer name "b$n$SUFFIX"
    ip link set "b$n$SUFFIX" netns "$NS_NET"
    ip netns exec "$NS_NET" ip link set "b$n$SUFFIX" master br0 up
    ip link set "v$n$SUFFIX" netns "$(ns "$n")"
    in_ns "$n" ip addr add "${NS_ADDR[$n]}/24" dev "v$n$SUFFIX"
    in_ns "$n" ip link set "v$n$SUFFIX" up
    in_ns "$n" ip link set lo up
    # One table per namespace for the faults' rules, empty until a fault.
    in_ns "$n" nft add table inet fault
    in_ns "$n" nft add chain inet fault out '{ type filter hook output priority 0; }'
    in_ns "$n" nft add chain inet fault in '{ type filter hook input priority 0; }'
  done
}

# drop NS WHAT MATCH: drops, both ways, the packets in namespace NS that MATCH names in the
# direction of the peer (e.g. `ip daddr 10.26.0.1 tcp dport 5432`); `undrop NS` removes all.
drop() {
  local n=$1 out=$2 in=$3
  in_ns "$n" nft add rule inet fault out $out drop
  in_ns "$n" nft add rule inet fault in $in drop
}
undrop() {
  in_ns "$1" nft flush chain inet fault out
  in_ns "$1" nft flush chain inet fault in
}

hold_breaker() { # hold_breaker N STATE: checkout-N's Hold breaker is in STATE
  [[ $(metric "${REPLICA_ADMIN[$1]}" "^checkout_breaker_state\\{rpc_method=\"wallet.v1.WalletService/Hold\",state=\"$2\"\\}") == 1 ]]
}
wallet_connections() { # local ports of replica N's connections to the wallet's address
  in_ns "r$1" ss -tnH state established dst "${NS_ADDR[w]}:$2" | awk '{ print $3 }' | sort
}
overloaded_count() { metric "${REPLICA_ADMIN[$1]}" '^checkout_overloaded_total'; }
any_hold_breaker_open() { hold_breaker 1 open || hold_breaker 2 open; }
both_hold_breakers_closed() { hold_breaker 1 closed && hold_breaker 2 closed; }
hold_seconds() { # the sum and count of checkout-N's Hold call durations, "SUM COUNT"
  curl -sf --max-time 2 "http://${REPLICA_ADMIN[$1]}/metrics" |
    awk '/^rpc_client_call_duration_seconds_(sum|count)\{rpc_method="wallet.v1.WalletService\/Hold"/ {
      if ($1 ~ /_sum/) s += $NF; else c += $NF } END { printf "%f %d\n", s, c }'
}

case_main() {
  [[ $(id -u) -eq 0 ]] || fail "needs root: network namespaces, veth, nft"
  if ! command -v nft >/dev/null || ! command -v ip >/dev/null; then
    say "installing iproute2 and nftables"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 nftables >/dev/null
  fi
  network_up
  pg_cluster_start "127.0.0.1,$HOST_ADDR"
  wait_until 10 "a namespace reaching PostgreSQL over the bridge" \
    in_ns r1 bash -c "exec 3<>/dev/tcp/$HOST_ADDR/$PG_PORT"
  local db
  db=$(pg_new_database faults "$HOST_ADDR")
  stubs_start main "$HOST_ADDR"
  STUBS_PREFIX=(ip netns exec "$(ns w)")
  stubs_start wallet "${NS_ADDR[w]}"
  STUBS_PREFIX=()
  local relay_port
  relay_port=$(free_port)
  echo 0 >"$WORK/wallet-delay"
  # `ip netns exec` directly, not the in_ns function: backgrounded, a function runs in a
  # subshell whose pid $! would be, and stopping that left the relay running after the case.
  ip netns exec "$(ns w)" python3 "$FAULTS_DIR/delay_relay.py" "${NS_ADDR[w]}:$relay_port" \
    "${STUBS[wallet]}" "$WORK/wallet-delay" >"$WORK/relay.log" 2>&1 &
  on_exit stop_pid "$!"
  cat >"$WORK/checkout.toml" <<TOML
[downstream]
cart = "${STUBS[main]}"
fraud = "${STUBS[main]}"
inventory = "${STUBS[main]}"
wallet = "${NS_ADDR[w]}:$relay_port"
TOML
  REPLICA_FLAGS=(--config "$WORK/checkout.toml" --database-url "$db")
  REPLICA_PREFIX=(ip netns exec "$(ns r1)")
  replica_start 1 "${NS_ADDR[r1]}"
  REPLICA_PREFIX=(ip netns exec "$(ns r2)")
  replica_start 2 "${NS_ADDR[r2]}"
  REPLICA_PREFIX=()
  say "checkout-1 and -2 in namespaces of their own, the wallet in a third; $RATE orders/s for 100 s"
  # OVERLOADED is an answer while the wallet hangs (orders wait out their hold's cap until its
  # breaker opens, and the admission limit sheds); never while the store is cut off (checked
  # on the replicas' counters after fault 1).
  load_start 100 "CONFIRMED,PENDING IN_PROGRESS,PENDING BUDGET_EXHAUSTED,PENDING WALLET_OUTCOME_UNKNOWN,DECLINED WALLET_UNAVAILABLE,error Unavailable with RetryInfo,error ResourceExhausted OVERLOADED with RetryInfo"
  local t0=$SECONDS

  # 1. checkout-1 cut off from PostgreSQL.
  sleep 8
  say "1. checkout-1 cut off from PostgreSQL (packets dropped both ways) for 15 s"
  drop r1 "ip daddr $HOST_ADDR tcp dport $PG_PORT" "ip saddr $HOST_ADDR tcp sport $PG_PORT"
  local cut=$SECONDS
  wait_until 10 "checkout-1 NOT_SERVING while cut off from PostgreSQL" not_serving 1
  say "checkout-1 NOT_SERVING after $((SECONDS - cut)) s"
  serving 2 || fail "checkout-2 is not SERVING while only checkout-1 is cut off"
  sleep $((cut + 15 - SECONDS))
  undrop r1
  wait_until 30 "checkout-1 SERVING after the heal" serving 1
  say "healed: checkout-1 SERVING again $((SECONDS - cut - 15)) s after, same process"
  local overloaded
  overloaded=$(($(overloaded_count 1) + $(overloaded_count 2)))
  ((overloaded == 0)) || fail "$overloaded orders refused OVERLOADED while checkout-1's store was cut off"
  say "0 orders refused OVERLOADED while the store was cut off"

  # 2. The wallet cut off mid-hold: 100 ms on the link first, so some 30 holds are under way
  # at any moment (and the Hold breaker's slow-call threshold of 250 ms is not reached).
  sleep $((t0 + 33 - SECONDS))
  echo 100 >"$WORK/wallet-delay"
  sleep 2
  say "2. the wallet cut off from both replicas mid-hold (packets dropped both ways) for 15 s"
  local before
  before=$(wallet_connections 1 "$relay_port")
  drop w "tcp sport $relay_port" "tcp dport $relay_port"
  cut=$SECONDS
  [[ -n $before ]] || fail "checkout-1 had no connection to the wallet when it was cut off"
  wait_until 15 "a Hold breaker open while the wallet is cut off" any_hold_breaker_open
  say "Hold breaker open after $((SECONDS - cut)) s"
  # The half-open connection is given up by checkout-1's kernel (TCP_USER_TIMEOUT, 3 s of
  # unacknowledged data), discarding what it had not delivered, while packets are still dropped.
  sleep $((cut + 10 - SECONDS))
  local still
  still=$(comm -12 <(echo "$before") <(wallet_connections 1 "$relay_port"))
  [[ -z $still ]] || fail "checkout-1's connection(s) to the wallet from port(s) $still still open 10 s into the partition"
  say "checkout-1's half-open connection(s) to the wallet (port(s) $(echo $before)) aborted within 10 s"
  sleep $((cut + 15 - SECONDS))
  undrop w
  echo 0 >"$WORK/wallet-delay"
  local healed=$SECONDS
  wait_until 30 "both Hold breakers closed after the heal" both_hold_breakers_closed
  say "healed: both Hold breakers closed $((SECONDS - healed)) s after"

  # 3. Latency and loss on the wallet link.
  sleep $((t0 + 65 - SECONDS))
  local before after
  before=$(hold_seconds 1)
  say "3. 200 ms added latency and 5 % loss each way on the wallet link for 20 s"
  echo 200 >"$WORK/wallet-delay"
  drop w "tcp sport $relay_port numgen random mod 100 < 5" "tcp dport $relay_port numgen random mod 100 < 5"
  sleep 20
  echo 0 >"$WORK/wallet-delay"
  undrop w
  after=$(hold_seconds 1)
  local mean
  mean=$(awk -v a="$before" -v b="$after" 'BEGIN { split(a, x, " "); split(b, y, " ");
    n = y[2] - x[2]; if (n > 0) printf "%.0f", 1000 * (y[1] - x[1]) / n; else print 0 }')
  say "checkout-1's Hold calls during it: $mean ms on average"
  ((mean >= 200)) || fail "the Hold calls took $mean ms on average: the added 200 ms did not show"

  check_load
  local unknown
  unknown=$(grep -oE 'PENDING WALLET_OUTCOME_UNKNOWN [0-9]+' "$LOAD_OUT" | tail -n 1 | awk '{ print $NF }')
  ((${unknown:-0} > 0)) || fail "no order was answered PENDING WALLET_OUTCOME_UNKNOWN: no hold was cut mid-way"
  say "$unknown orders answered PENDING WALLET_OUTCOME_UNKNOWN, every one resolved by the reconciler"
}
