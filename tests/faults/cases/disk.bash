# Fault case disk: the SQLite store's disk fills up, then turns read-only.
#
# One replica on SQLite, its data dir on a 64 MiB tmpfs, $RATE orders/s for 60 s. The tmpfs is
# seen through tests/faults/flakyfs.py, a pass-through FUSE filesystem that can turn read-only
# under open files (the kernel refuses `mount -o remount,ro` while SQLite holds its database and
# WAL open for writing: see that file). At 8 s a file fills the tmpfs (`dd` until ENOSPC), so
# the WAL and the database cannot grow; once the replica serves again after the file is
# deleted, the filesystem turns read-only (EROFS on every write) and then back. During each
# fault the replica must turn NOT_SERVING on gRPC health and 503 on /readyz, answer PlaceOrder
# UNAVAILABLE with RetryInfo (or PENDING for an order recorded before), and call no one from
# 3 s into the fault to its end; after it, the same process — never restarted — serves again.
# The shared checker then finds every order the load was answered with by its key (nothing
# recorded was lost) and audits the wallet, and SQLite's integrity_check passes on the file.
#
# Needs root (mount) and FUSE (/dev/fuse, Debian's python3-fusepy; installed when missing).

fs_mode() { echo "$1" >"$WORK/fs-mode"; }

stays_down() { # stays_down SECONDS WHAT: NOT_SERVING and /readyz 503 at every read for SECONDS
  local until=$((SECONDS + $1))
  while ((SECONDS < until)); do
    not_serving 1 || fail "checkout-1 turned SERVING before the fault was healed ($2)"
    [[ $(readyz 1) == 503 ]] || fail "/readyz turned $(readyz 1) before the fault was healed ($2)"
    sleep 0.5
  done
}

fault_window() { # fault_window WHAT INJECT HEAL: inject, prove the outage, heal, prove recovery
  local what=$1 inject=$2 heal=$3 started
  say "$what"
  started=$SECONDS
  eval "$inject"
  wait_until 15 "checkout-1 NOT_SERVING ($what)" not_serving 1
  [[ $(readyz 1) == 503 ]] || fail "/readyz is $(readyz 1), not 503 ($what)"
  say "NOT_SERVING and /readyz 503 after $((SECONDS - started)) s"
  # Out of rotation for the whole fault, read twice a second: a probe whose one-row write fits in
  # WAL space SQLite already owns must not bring it back while orders' writes fail.
  stays_down 3 "$what"
  local calls
  calls=$(stub_calls main)
  stays_down 5 "$what"
  calls=$(($(stub_calls main) - calls))
  eval "$heal"
  ((calls == 0)) || fail "$calls downstream calls during the fault ($what): PlaceOrder must call no one"
  wait_until 15 "checkout-1 SERVING after the heal ($what)" serving 1
  [[ $(readyz 1) == 200 ]] || fail "/readyz is $(readyz 1) after the heal ($what)"
  kill -0 "${REPLICA_PID[1]}" 2>/dev/null || fail "checkout-1 exited ($what)"
  say "healed: SERVING again, same process (pid ${REPLICA_PID[1]}); no downstream call during the fault"
}

case_main() {
  [[ $(id -u) -eq 0 ]] || fail "needs root: it mounts a tmpfs and a FUSE filesystem"
  [[ -e /dev/fuse ]] || fail "no /dev/fuse: this kernel has no FUSE"
  if ! /usr/bin/python3 -c 'import fusepy' 2>/dev/null; then
    say "installing python3-fusepy"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-fusepy >/dev/null
  fi
  mkdir -p "$WORK/disk" "$WORK/data"
  mount -t tmpfs -o size=64m tmpfs "$WORK/disk"
  on_exit umount -l "$WORK/disk"
  mkdir "$WORK/disk/backing"
  fs_mode rw
  /usr/bin/python3 "$FAULTS_DIR/flakyfs.py" "$WORK/disk/backing" "$WORK/data" "$WORK/fs-mode" \
    >"$WORK/flakyfs.log" 2>&1 &
  local fs_pid=$!
  on_exit umount -l "$WORK/data"
  on_exit stop_pid "$fs_pid"
  wait_until 10 "the FUSE filesystem mounted" mountpoint -q "$WORK/data"

  stubs_start main 127.0.0.1
  REPLICA_FLAGS=(--data-dir "$WORK/data/checkout" --downstream "${STUBS[main]}")
  replica_start 1 127.0.0.1
  say "1 replica on SQLite in a 64 MiB tmpfs (through FUSE); $RATE orders/s for 60 s"
  load_start 60 "CONFIRMED,PENDING IN_PROGRESS,PENDING BUDGET_EXHAUSTED,PENDING WALLET_OUTCOME_UNKNOWN,error Unavailable with RetryInfo"
  sleep 8
  fault_window "the disk fills up (a file written until ENOSPC)" \
    'dd if=/dev/zero of="$WORK/disk/filler" bs=1M >/dev/null 2>&1 || true; say "$(df -h "$WORK/disk" | tail -n 1)"' \
    'rm -f "$WORK/disk/filler"'
  sleep 8
  fault_window "the filesystem turns read-only (EROFS)" 'fs_mode ro' 'fs_mode rw'

  check_load
  local refused
  refused=$(grep -oE 'error Unavailable with RetryInfo [0-9]+' "$LOAD_OUT" | tail -n 1 | awk '{ print $NF }')
  ((${refused:-0} > 0)) || fail "no order was refused UNAVAILABLE during the faults: they did not bite"
  replica_stop 1
  local integrity
  integrity=$(/usr/bin/python3 -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("PRAGMA integrity_check").fetchone()[0])' \
    "$WORK/data/checkout/checkout.db" 2>&1)
  [[ $integrity == ok ]] || fail "SQLite integrity_check: $integrity"
  say "$refused orders refused UNAVAILABLE with RetryInfo; the database file's integrity_check: ok"
}
