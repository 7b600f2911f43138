#!/usr/bin/env bash
# Side by side on this machine: poolerd with event_loops off, poolerd with
# event loops, and PgBouncer, in transaction mode, pool 20, trust auth, each
# measured by pgbench -S in turn, ROUNDS rounds. Prints TPS, pooler CPU
# seconds per 10,000 transactions and pooler context switches per
# transaction (all threads, from /proc). Everything runs on 127.0.0.1 and is
# stopped at the end (ports 25432 and 26001-26003: below the ephemeral range,
# so a test's lingering client sockets do not hold them). As root, PostgreSQL and PgBouncer run as postgres.
#   usage: test/bench/scripts/loops-ab.sh [LOOPS] [ROUNDS] [SECS] [CLIENTS] [MODE]
#   e.g.   test/bench/scripts/loops-ab.sh 1 3 8 16 simple
set -eu
LOOPS=${1:-1} ROUNDS=${2:-3} SECS=${3:-8} C=${4:-16} M=${5:-simple}
BIN=${POOLERD:-bin/poolerd}
[ -x "$BIN" ] || go build -o "$BIN" ./cmd/poolerd
W=$(mktemp -d /tmp/loops-ab.XXXX); chmod 777 $W
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
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
ctx() { cat /proc/$1/task/*/status | awk '/ctxt_switches/{s+=$2} END{print s}'; }
echo "round target clients mode tps cpu_s_per_10k ctx_per_txn (event_loops=$LOOPS)"
for r in $(seq $ROUNDS); do
  for t in $targets; do
    n=${t%%:*}; port=${t#*:}; pid=$(head -1 $W/$n.pid)
    c0=$(cpu $pid); x0=$(ctx $pid)
    out=$(pgbench -h 127.0.0.1 -p $port -U postgres -S -M $M -c $C -j 2 -T $SECS -n app 2>&1)
    c1=$(cpu $pid); x1=$(ctx $pid)
    txn=$(echo "$out" | awk '/actually processed/{print $NF}')
    echo "$r $n $C $M $(echo "$out" | awk '/^tps =/{print $3}') $(awk -v a=$c0 -v b=$c1 -v x=$txn 'BEGIN{printf "%.3f", (b-a)/100/x*1e4}') $(awk -v a=$x0 -v b=$x1 -v x=$txn 'BEGIN{printf "%.3f", (b-a)/x}')"
  done
done
