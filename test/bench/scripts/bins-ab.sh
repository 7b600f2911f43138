#!/usr/bin/env bash
# Several poolerd builds side by side on this machine (each with the same
# settings: transaction mode, pool 20, trust auth, event_loops LOOPS), with
# PgBouncer and the bare Go relay of ../shared/rig as yardsticks, each
# measured by pgbench -S in turn, ROUNDS rounds of SECS seconds. Prints TPS
# and the pooler's user and system CPU seconds per 10,000 transactions
# (from /proc/PID/stat), and context switches per transaction. For an A/B of
# a change: build the old and the new binary, then
#   usage: LOOPS=1 test/bench/scripts/bins-ab.sh ROUNDS SECS CLIENTS MODE BIN...
#   e.g.   test/bench/scripts/bins-ab.sh 3 8 16 simple /tmp/poolerd-old bin/poolerd
# PGBENCH_EXTRA adds pgbench options (PGBENCH_EXTRA=-C: a new connection per
# transaction).
# Ports 25432 and 26001-26004 (the first binary on 26001) plus 26011 and up
# for further binaries; as root PostgreSQL and PgBouncer run as postgres.
set -eu
ROUNDS=$1 SECS=$2 C=$3 M=$4
shift 4
POOLERD=$1 LOOPS=${LOOPS:-1} AB_NAME=bins-ab
. "$(dirname "$0")/ab-setup.sh"
# ab-setup started the first binary as "off" (event_loops off) and "loops":
# keep "loops" as the first binary's row, and add the others.
kill "$(head -1 $W/off.pid)" 2>/dev/null || true; rm -f $W/off.pid
targets=${targets#off:26001 }
targets="${targets/loops:26002/b1:26002}"; mv $W/loops.pid $W/b1.pid
i=1
for b in "${@:2}"; do
  i=$((i+1)); port=$((26010+i))
  POOLERD_EVENT_LOOPS=$LOOPS POOLERD_MAX_CLIENT_CONN=2000 $b --upstream postgres://postgres@127.0.0.1:25432/app \
    --listen 127.0.0.1:$port --pool-mode transaction --pool-size 20 --auth-type trust --http-listen "" \
    --log-level warn >$W/b$i.log 2>&1 &
  echo $! > $W/b$i.pid
  targets="$targets b$i:$port"
done
sleep 1
echo "binaries: $(i=0; for b in "$@"; do i=$((i+1)); printf 'b%d=%s ' $i $b; done)"
echo "round target clients mode tps user_s_per_10k sys_s_per_10k ctx_per_txn (event_loops=$LOOPS)"
ctx() { cat /proc/$1/task/*/status | awk '/ctxt_switches/{s+=$2} END{print s}'; }
for r in $(seq $ROUNDS); do
  for t in $targets; do
    n=${t%%:*}; port=${t#*:}; pid=$(head -1 $W/$n.pid)
    read u0 s0 < <(awk '{print $14, $15}' /proc/$pid/stat); x0=$(ctx $pid)
    out=$(pgbench -h 127.0.0.1 -p $port -U postgres -S -M $M -c $C -j 2 -T $SECS -n ${PGBENCH_EXTRA:-} app 2>&1)
    read u1 s1 < <(awk '{print $14, $15}' /proc/$pid/stat); x1=$(ctx $pid)
    txn=$(echo "$out" | awk '/actually processed/{print $NF}')
    echo "$r $n $C $M $(echo "$out" | awk '/^tps =/{printf "%.0f", $3}') $(awk -v a=$u0 -v b=$u1 -v x=$txn 'BEGIN{printf "%.3f", (b-a)/100/x*1e4}') $(awk -v a=$s0 -v b=$s1 -v x=$txn 'BEGIN{printf "%.3f", (b-a)/100/x*1e4}') $(awk -v a=$x0 -v b=$x1 -v x=$txn 'BEGIN{printf "%.2f", (b-a)/x}')"
  done
done
