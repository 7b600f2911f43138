#!/usr/bin/env bash
# System calls and context switches per transaction of the pooler process,
# side by side on this machine: poolerd with event_loops off, poolerd with
# event loops, and PgBouncer (transaction mode, pool 20, trust auth), each
# counted with perf stat over SECS seconds of pgbench -S -c N, for each N in
# CLIENTS. Needs perf (linux-perf) and permission to trace (root, or
# kernel.perf_event_paranoid <= 1). perf slows the targets: compare the
# counts per transaction, not the TPS. Ports 25432 and 26001-26003; as root
# PostgreSQL and PgBouncer run as postgres.
#   usage: test/bench/scripts/syscalls-ab.sh [LOOPS] [SECS] ["CLIENTS"]
#   e.g.   test/bench/scripts/syscalls-ab.sh 1 5 "1 16 400"
set -eu
LOOPS=${1:-1} SECS=${2:-5} CLIENTS=${3:-"1 16 400"}
BIN=${POOLERD:-bin/poolerd}
[ -x "$BIN" ] || go build -o "$BIN" ./cmd/poolerd
command -v perf >/dev/null || { echo "perf not found (apt-get install linux-perf)" >&2; exit 1; }
W=$(mktemp -d /tmp/syscalls-ab.XXXX); chmod 777 $W
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
  for f in $W/*.pid; do [ -f "$f" ] && kill "$(head -1 $f)" 2>/dev/null || true; done
  as_pg pg_ctl -D $W/pg -m immediate stop >/dev/null 2>&1 || true
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
sleep 1
echo "per transaction, system calls made at least 0.01 times (event_loops=$LOOPS for 'loops')"
for c in $CLIENTS; do
  for t in $targets; do
    n=${t%%:*}; port=${t#*:}; pid=$(head -1 $W/$n.pid)
    pgbench -h 127.0.0.1 -p $port -U postgres -S -c $c -j 2 -T 2 -n app >/dev/null 2>&1 # warm up
    perf stat -e 'syscalls:sys_enter_*' -e context-switches -p $pid -o $W/$n.perf -- sleep $SECS &
    ppid=$!
    out=$(pgbench -h 127.0.0.1 -p $port -U postgres -S -c $c -j 2 -T $SECS -n app 2>&1)
    wait $ppid
    txn=$(echo "$out" | awk '/actually processed/{print $NF}')
    echo "c$c $n $(awk -v x=$txn '/syscalls:sys_enter_|context-switches/{gsub(",","",$1); if ($1/x>=0.01) {k=$2; sub("syscalls:sys_enter_","",k); printf "%s=%.2f ", k, $1/x}}' $W/$n.perf)"
  done
done
