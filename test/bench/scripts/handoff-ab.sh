#!/usr/bin/env bash
# What the hand-off check (verify_handoff) costs: three poolerds side by
# side on this machine, verify_handoff off, sample (the default rate) and
# always, in transaction mode, pool 20, trust auth, each measured by
# pgbench -S in turn, ROUNDS rounds of SECS seconds for each client count.
# Prints TPS and poolerd CPU seconds per 10,000 transactions. A throwaway
# PostgreSQL on 127.0.0.1:25442 (pgbench scale 10), poolerds on 26011-26013
# (below the ephemeral range); everything is stopped at the end. As root,
# PostgreSQL runs as postgres.
#   usage: test/bench/scripts/handoff-ab.sh [ROUNDS] [SECS] [CLIENTS...]
#   e.g.   test/bench/scripts/handoff-ab.sh 3 6 16 400
set -eu
ROUNDS=${1:-3} SECS=${2:-6}
shift 2 || true
CLIENTS=${*:-16 400}
BIN=${POOLERD:-bin/poolerd}
[ -x "$BIN" ] || go build -o "$BIN" ./cmd/poolerd
W=$(mktemp -d /tmp/handoff-ab.XXXX); chmod 777 $W
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
  for f in $W/*.pid; do [ -f "$f" ] && kill "$(head -1 $f)" 2>/dev/null || true; done
  as_pg pg_ctl -D $W/pg -m immediate stop >/dev/null 2>&1 || true
  rm -rf $W
}
trap cleanup EXIT
mkdir $W/pg; [ "$(id -u)" = 0 ] && chown postgres $W/pg
as_pg initdb -D $W/pg -A trust -U postgres >/dev/null
printf "listen_addresses='127.0.0.1'\nport=25442\nmax_connections=300\nfsync=off\nunix_socket_directories='$W'\n" >> $W/pg/postgresql.conf
as_pg pg_ctl -D $W/pg -l $W/pg.log -w start >/dev/null
psql -qh 127.0.0.1 -p 25442 -U postgres -c "create database app"
pgbench -qh 127.0.0.1 -p 25442 -U postgres -i -s 10 app >/dev/null 2>&1
pd() { # name port verify_handoff
  POOLERD_VERIFY_HANDOFF=$3 POOLERD_MAX_CLIENT_CONN=2000 $BIN --upstream postgres://postgres@127.0.0.1:25442/app \
    --listen 127.0.0.1:$2 --pool-mode transaction --pool-size 20 --auth-type trust --http-listen "" \
    --log-level warn >$W/$1.log 2>&1 &
  echo $! > $W/$1.pid
}
pd off 26011 off; pd sample 26012 sample; pd always 26013 always
targets="off:26011 sample:26012 always:26013"
sleep 1
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
echo "round verify_handoff clients tps cpu_s_per_10k"
for r in $(seq $ROUNDS); do
  for C in $CLIENTS; do
    for t in $targets; do
      n=${t%%:*}; port=${t#*:}; pid=$(head -1 $W/$n.pid)
      c0=$(cpu $pid)
      out=$(pgbench -h 127.0.0.1 -p $port -U postgres -S -M simple -c $C -j 2 -T $SECS -n app 2>&1)
      c1=$(cpu $pid)
      txn=$(echo "$out" | awk '/actually processed/{print $NF}')
      echo "$r $n $C $(echo "$out" | awk '/^tps =/{print $3}') $(awk -v a=$c0 -v b=$c1 -v x=$txn 'BEGIN{printf "%.3f", (b-a)/100/x*1e4}')"
    done
  done
done
# A check that found anything would have logged a WARN: none expected.
if grep -h "hand-off check" $W/*.log; then echo "DIRTY HAND-OFFS ABOVE"; exit 1; fi
