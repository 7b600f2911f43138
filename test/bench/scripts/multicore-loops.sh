#!/usr/bin/env bash
# On a bare many-core x86-64 machine: PostgreSQL 15 + pgbench, with direct, PgBouncer (1 process),
# PgBouncer x4 (so_reuseport), Odyssey and poolerd in front, side by side.
# poolerd rows: one process per event_loops setting (off, 2, 4, 8), beside PgBouncer x4.
# Derived from ../shared/rig/multicore.sh (see docs/benchmarks.md, "Event loops").
# Needs b.tar.xz from device-bundle.sh (BUNDLE=path, default .bundle/b.tar.xz). Odyssey rows only if bundled. usage: rig/multicore.sh [SECS] [CLIENTS...]
set -u
SECS=${SECS:-15}; POOL=${POOL:-32}; POOL4=${POOL4:-$POOL}; CLIENTS=${CLIENTS:-"1 64 256"}; MODES=${MODES:-"simple prepared"}
OUTF=${OUT:-/tmp}/multicore.txt
log() { echo "$*" | tee -a $OUTF; }
tar -C / -xJf ${BUNDLE:-.bundle/b.tar.xz} || exit 1
export TZ=UTC PGTZ=UTC
[ -e /usr/share/zoneinfo/UTC ] || { mkdir -p /usr/share/zoneinfo; cp /opt/b/zoneinfo/UTC /usr/share/zoneinfo/UTC; }
id postgres >/dev/null 2>&1 || useradd -r -m postgres
P=/opt/b/usr/lib/postgresql/15/bin; B=/opt/b/bin
log "pool=$POOL pgbouncer_x4 pool each=$POOL4 secs=$SECS"; log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(uname -r)"
for f in /tmp/w/*.pid; do [ -f $f ] && kill $(cat $f) 2>/dev/null; done
[ -f /tmp/pgd/postmaster.pid ] && runuser -u postgres -- $P/pg_ctl -D /tmp/pgd -m immediate stop >/dev/null 2>&1
sleep 1
D=/tmp/pgd; rm -rf $D; mkdir -p $D; chown postgres $D
runuser -u postgres -- $P/initdb -D $D -U postgres --auth=trust -E UTF8 --locale=C >/tmp/initdb.log 2>&1 || { tail -5 /tmp/initdb.log; exit 1; }
cat >> $D/postgresql.conf <<CONF
listen_addresses='127.0.0.1'
port=5432
max_connections=600
shared_buffers=2GB
fsync=off
synchronous_commit=off
unix_socket_directories='/tmp'
CONF
runuser -u postgres -- $P/pg_ctl -D $D -l /tmp/pg.log -w start >/dev/null || { tail /tmp/pg.log; exit 1; }
$P/psql -h 127.0.0.1 -U postgres -qc "create role app superuser login" -c "create database bench owner app"
$P/pgbench -h 127.0.0.1 -U app -i -s 20 -q bench >/dev/null 2>&1
W=/tmp/w; mkdir -p $W; chown postgres $W
echo '"app" ""' > $W/userlist.txt
pgb_ini() { # port name reuseport poolsize
cat > $W/$2.ini <<INI
[databases]
* = host=127.0.0.1 port=5432
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $1
unix_socket_dir =
auth_type = trust
auth_file = $W/userlist.txt
pool_mode = transaction
default_pool_size = $4
max_client_conn = 5000
logfile = $W/$2.log
pidfile = $W/$2.pid
so_reuseport = $3
INI
}
pgb_ini 16001 pgb 0 $POOL; for i in 1 2 3 4; do pgb_ini 16002 pgb4_$i 1 $POOL4; done
$B/pgbouncer --version | grep -q "1\.1[0-9]\." || for f in $W/*.ini; do echo "max_prepared_statements = 200" >> $f; done
chown postgres $W/*
runuser -u postgres -- bash -c "ulimit -n 20000; $B/pgbouncer -d $W/pgb.ini"
for i in 1 2 3 4; do runuser -u postgres -- bash -c "ulimit -n 20000; $B/pgbouncer -d $W/pgb4_$i.ini"; done
cat > $W/ody.conf <<ODY
log_format "%p %t %l [%i %s] (%c) %m\n"
daemonize no
log_to_stdout no
log_file "$W/ody.log"
workers 8
listen {
	host "127.0.0.1"
	port 16003
}
storage "pg" {
	type "remote"
	host "127.0.0.1"
	port 5432
}
database default {
	user default {
		authentication "none"
		storage "pg"
		pool "transaction"
		pool_size $POOL
		pool_discard no
		pool_reserve_prepared_statement yes
	}
}
ODY
ulimit -n 20000
[ -x $B/odyssey ] && { runuser -u postgres -- $B/odyssey $W/ody.conf >/tmp/ody.out 2>&1 & }
pdrun() { # port loops
  POOLERD_EVENT_LOOPS=$2 $B/poolerd --auth-type trust --upstream postgres://app@127.0.0.1:5432/bench --listen 127.0.0.1:$1 \
    --pool-size $POOL --http-listen "" --log-level warn >/tmp/poolerd_$2.log 2>&1 &
  echo $! > $W/pd_$2.pid
}
pdrun 16004 off; pdrun 16005 2; pdrun 16006 4; pdrun 16007 8
sleep 2
pids() { case $1 in pgbouncer) cat $W/pgb.pid;; pgbouncer_x4) cat $W/pgb4_*.pid;; odyssey) pgrep -x odyssey;; pd_off) cat $W/pd_off.pid;; pd_l2) cat $W/pd_2.pid;; pd_l4) cat $W/pd_4.pid;; pd_l8) cat $W/pd_8.pid;; esac; }
cpu() { local t=0; for p in $(pids $1); do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done; echo $t; }
for t in 5432 16002 16004 16005 16006 16007; do $P/pg_isready -q -h 127.0.0.1 -p $t || log "port $t not ready"; done
log "target mode clients tps pooler_cpu_s_per_10k_txn lat_ms"
for mode in $MODES; do for c in $CLIENTS; do
  j=$(( c < 16 ? c : 16 ))
  for tp in ${TARGETS:-pgbouncer_x4:16002 pd_off:16004 pd_l2:16005 pd_l4:16006 pd_l8:16007}; do
    n=${tp%%:*}; port=${tp##*:}
    c0=$(cpu $n)
    o=$($P/pgbench -h 127.0.0.1 -p $port -U app -S -M $mode -c $c -j $j -T $SECS -n bench 2>&1)
    c1=$(cpu $n)
    tps=$(echo "$o" | sed -n 's/^tps = \([0-9.]*\).*/\1/p'); tx=$(echo "$o" | sed -n 's/.*actually processed: \([0-9]*\).*/\1/p')
    lat=$(echo "$o" | sed -n 's/^latency average = \([0-9.]*\).*/\1/p'); fl=$(echo "$o" | sed -n 's/.*failed transactions: \([0-9]*\).*/\1/p')
    cp=$(awk -v a=$c0 -v b=$c1 -v x=${tx:-0} 'BEGIN{ if (x>0) printf "%.3f", (b-a)/100/x*1e4; else print "-"}')
    log "$n $mode $c ${tps:-ERR} $cp ${lat:-} failed=${fl:-?}"
    [ -z "$tps" ] && log "  $(echo "$o" | tail -2 | tr '\n' ' ')"
  done
done; done
