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
AB_NAME=loops-ab
. "$(dirname "$0")/ab-setup.sh"
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
