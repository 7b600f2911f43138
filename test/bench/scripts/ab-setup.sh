# Sourced by loops-ab.sh and syscalls-ab.sh (set LOOPS first): builds
# bin/poolerd if missing, starts a throwaway PostgreSQL on 127.0.0.1:25432
# (database app, pgbench scale 10, trust auth), poolerd with event_loops off
# on 26001 and with LOOPS loops on 26002, and PgBouncer on 26003 when
# installed (transaction mode, pool 20 for all), and stops everything at
# exit, and the bare Go relay of ../shared/rig on 26004 when it is there.
# AB_LOGS=DIR copies the poolers' logs there at exit.
# The ports are below the kernel's ephemeral range, so a lingering
# client socket never holds them. Sets W (the work directory), targets
# ("name:port ..."; each name's pid is in $W/NAME.pid) and as_pg.
BIN=${POOLERD:-bin/poolerd}
[ -x "$BIN" ] || go build -o "$BIN" ./cmd/poolerd
W=$(mktemp -d /tmp/${AB_NAME:-ab}.XXXX); chmod 777 $W
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
  for f in $W/*.pid; do [ -f "$f" ] && kill "$(head -1 $f)" 2>/dev/null || true; done
  as_pg pg_ctl -D $W/pg -m immediate stop >/dev/null 2>&1 || true
  # AB_LOGS=DIR keeps the poolers' logs (a target that died says why).
  [ -n "${AB_LOGS:-}" ] && mkdir -p "$AB_LOGS" && cp $W/*.log "$AB_LOGS"/ 2>/dev/null
  rm -rf $W
}
trap cleanup EXIT
mkdir $W/pg; [ "$(id -u)" = 0 ] && chown postgres $W/pg
as_pg initdb -D $W/pg -A trust -U postgres >/dev/null
printf "listen_addresses='127.0.0.1'\nport=25432\nmax_connections=300\nfsync=off\nunix_socket_directories='$W'\n" >> $W/pg/postgresql.conf
as_pg pg_ctl -D $W/pg -l $W/pg.log -w start >/dev/null
psql -qh 127.0.0.1 -p 25432 -U postgres -c "create database app"
pgbench -qh 127.0.0.1 -p 25432 -U postgres -i -s 10 app >/dev/null 2>&1
pd() { # name port loops
  POOLERD_EVENT_LOOPS=$3 POOLERD_MAX_CLIENT_CONN=2000 $BIN --upstream postgres://postgres@127.0.0.1:25432/app \
    --listen 127.0.0.1:$2 --pool-mode transaction --pool-size 20 --auth-type trust --http-listen "" \
    --log-level warn >$W/$1.log 2>&1 &
  echo $! > $W/$1.pid
}
pd off 26001 off; pd loops 26002 $LOOPS
targets="off:26001 loops:26002"
if command -v pgbouncer >/dev/null; then
  printf '[databases]\napp = host=127.0.0.1 port=25432 dbname=app user=postgres\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = 26003\nauth_type = trust\nauth_file = %s/users.txt\npool_mode = transaction\ndefault_pool_size = 20\nmax_client_conn = 2000\nunix_socket_dir =\nlogfile = %s/pgb.log\npidfile = %s/pgbouncer.pid\n' $W $W $W > $W/pgb.ini
  echo '"postgres" ""' > $W/users.txt
  [ "$(id -u)" = 0 ] && chown postgres $W/pgb.ini $W/users.txt
  as_pg pgbouncer -d $W/pgb.ini
  targets="$targets pgbouncer:26003"
fi
# The bare Go relay of ../shared/rig (no pooling, no parsing; 1:1 upstream
# connections), the yardstick of what Go itself costs, when it is there.
RELAY_DIR=${BARE_RELAY_DIR:-$(dirname "$0")/../../../../shared/rig/bare-relay}
if [ -f "$RELAY_DIR/main.go" ] && (cd "$RELAY_DIR" && go build -o $W/bare-relay .); then
  $W/bare-relay -mode nested -loops 1 -listen 127.0.0.1:26004 -upstream 127.0.0.1:25432 >$W/bare.log 2>&1 &
  echo $! > $W/bare.pid
  targets="$targets bare:26004"
fi
sleep 1
