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
command -v perf >/dev/null || { echo "perf not found (apt-get install linux-perf)" >&2; exit 1; }
AB_NAME=syscalls-ab
. "$(dirname "$0")/ab-setup.sh"
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
