# Sourced by deploy/pgbouncer-test and bench/run: a private PgBouncer on a free 127.0.0.1 port in
# front of the machine's PostgreSQL (127.0.0.1:5432, trust auth), configured as operators run
# it: beyond where to listen, whom to let in and the pool mode, the only setting is
# `ignore_startup_parameters = extra_float_digits` (sqlx sends that parameter; PgBouncer refuses
# any it does not know, `options` among them).
#
#   pgbouncer_install          apt-get install pgbouncer when it is missing
#   pgbouncer_start MODE DIR   start one in pool_mode MODE, its files in DIR; sets PGBOUNCER_PORT
#                              and PGBOUNCER_PID, returns non-zero (with its log) if it did not
#                              come up within 10 s
#   pgbouncer_stop             stop the one started last
#
# pgbouncer refuses to run as root, so as root it runs as the `postgres` user.

PGBOUNCER_SERVER_HOST=${PGBOUNCER_SERVER_HOST:-127.0.0.1}
PGBOUNCER_SERVER_PORT=${PGBOUNCER_SERVER_PORT:-5432}
PGBOUNCER_PID=""
PGBOUNCER_PORT=""

pgbouncer_install() {
  if ! command -v pgbouncer >/dev/null; then
    echo "installing pgbouncer" >&2
    apt-get update -qq
    # The package starts its own service where it can; these scripts run a private one.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >&2
  fi
}

pgbouncer_start() {
  local mode=$1 dir=$2 run_as=()
  mkdir -p "$dir"
  chmod 755 "$dir"
  PGBOUNCER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  printf '"postgres" ""\n' >"$dir/userlist.txt"
  cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=$PGBOUNCER_SERVER_HOST port=$PGBOUNCER_SERVER_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGBOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = $mode
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
  if [[ $(id -u) -eq 0 ]]; then
    chown -R postgres "$dir"
    run_as=(runuser -u postgres --)
  fi
  "${run_as[@]}" pgbouncer "$dir/pgbouncer.ini" >"$dir/stdout.log" 2>&1 &
  PGBOUNCER_PID=$!
  for _ in $(seq 1 100); do
    if pg_isready -h 127.0.0.1 -p "$PGBOUNCER_PORT" -q; then
      return 0
    fi
    kill -0 "$PGBOUNCER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "pgbouncer ($mode) did not start:" >&2
  cat "$dir/stdout.log" "$dir/pgbouncer.log" >&2 2>/dev/null || true
  return 1
}

pgbouncer_stop() {
  if [[ -n "$PGBOUNCER_PID" ]] && kill -0 "$PGBOUNCER_PID" 2>/dev/null; then
    kill -TERM "$PGBOUNCER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$PGBOUNCER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PGBOUNCER_PID" 2>/dev/null || true
  fi
  PGBOUNCER_PID=""
}
