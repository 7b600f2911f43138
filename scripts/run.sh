#!/usr/bin/env bash
# Quick start: a throwaway PostgreSQL in ./.run and poolerd in front of it.
#
#   scripts/run.sh [poolerd flags...]   start both (what `make run ARGS=...` runs);
#                                       Ctrl-C stops both
#   scripts/run.sh stop                 stop the .run PostgreSQL if it is running
#   scripts/run.sh clean                stop it and delete its files (`make clean`)
#
# Environment:
#   RUN_PG_PORT      PostgreSQL's TCP port (default 15432: below the range the
#                    kernel picks outgoing ports from, so a lingering outgoing
#                    connection never holds it)
#   RUN_LISTEN_PORT  poolerd's client port (default 6432)
#   RUN_HTTP_PORT    poolerd's health/metrics port (default 9930)
#
# The first run creates a cluster in .run/pgdata (initdb, superuser "postgres"
# with a random password in .run/superuser.password, trust over the Unix
# socket, scram-sha-256 over TCP) with a LOGIN role app (password "secret")
# owning a database app. Later runs reuse it. Everything listens on 127.0.0.1
# only. Only bash, coreutils and util-linux (runuser, setsid, flock) are
# needed besides PostgreSQL, which is installed with apt-get when missing.

# shellcheck disable=SC2317 # the trap handlers below are invoked indirectly
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
RUN_DIR=$ROOT/.run
PG_PORT=${RUN_PG_PORT:-15432}
LISTEN_PORT=${RUN_LISTEN_PORT:-6432}
HTTP_PORT=${RUN_HTTP_PORT:-9930}
POOLERD=$ROOT/bin/poolerd
PG_OS_USER=postgres
# A per-checkout directory in /tmp (keyed by the repository path), used for
# the Unix socket when .run's path is too long for one, and for the whole
# cluster when the postgres OS user cannot reach .run (see choose_dirs).
TMP_DIR=/tmp/poolerd-run-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)

log() { printf 'run.sh: %s\n' "$*" >&2 || true; }
die() {
	log "$*"
	exit 1
}

for v in PG_PORT LISTEN_PORT HTTP_PORT; do
	if ! [[ ${!v} =~ ^[0-9]{1,5}$ ]] || ((10#${!v} < 1 || 10#${!v} > 65535)); then
		die "RUN_$v=${!v} is not a port number"
	fi
	printf -v "$v" '%d' "$((10#${!v}))"
done

# PostgreSQL refuses to run as root. As root, every server command (initdb,
# pg_ctl, and so postgres) runs as the postgres OS user through runuser, and
# the directories it writes are chowned to that user.
AS_ROOT=0
[[ $(id -u) -eq 0 ]] && AS_ROOT=1

# as_pg runs a PostgreSQL server command as the user that owns the cluster.
# It runs from / because the postgres user may not be able to enter our cwd.
as_pg() {
	if ((AS_ROOT)); then
		(cd / && runuser -u "$PG_OS_USER" -- "$@")
	else
		"$@"
	fi
}

# port_open reports whether something accepts TCP connections on
# 127.0.0.1:$1.
port_open() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

has_server_bins() {
	local b
	for b in initdb pg_ctl postgres; do
		[[ -f $1/$b && -x $1/$b ]] || return 1
	done
}

# find_bindir prints the directory holding initdb, pg_ctl and postgres: that
# of the initdb on PATH (symlinks resolved) if any, else the highest
# /usr/lib/postgresql/<version>/bin (Debian's layout, not on PATH).
find_bindir() {
	local p d
	if p=$(command -v initdb 2>/dev/null); then
		for d in "$(dirname -- "$(readlink -f -- "$p")")" "$(dirname -- "$p")"; do
			if has_server_bins "$d"; then
				printf '%s\n' "$d"
				return 0
			fi
		done
	fi
	while IFS= read -r d; do
		if has_server_bins "$d"; then
			printf '%s\n' "$d"
			return 0
		fi
	done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -rV)
	return 1
}

install_postgresql() {
	local cmd="apt-get update && apt-get install -y postgresql"
	command -v apt-get >/dev/null ||
		die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin; install PostgreSQL and retry"
	local -a sudo=()
	if ((!AS_ROOT)); then
		command -v sudo >/dev/null ||
			die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Install them as root, then retry:  $cmd"
		sudo=(sudo)
	fi
	log "PostgreSQL server binaries not found; installing them: ${sudo[*]}${sudo[*]:+ }$cmd"
	log "(Debian's package also creates and may start its own cluster on port 5432; this script does not use it.)"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
}

# choose_dirs sets PG_HOME (the directory holding pgdata and postgres.log,
# owned by the cluster's user), PGDATA, PG_LOG and SOCK_DIR.
#
# Normally PG_HOME is .run. As root, the postgres user must be able to
# traverse every directory down to .run; a repository under /root (mode 700)
# or a private home directory breaks that, and PostgreSQL would fail with a
# confusing "permission denied". Rather than loosening permissions on the
# user's directories, the cluster then lives in $TMP_DIR (a 0700 directory
# owned by postgres, named after a hash of the repository path so each
# checkout gets its own and later runs find it again), and .run/pgdata and
# .run/postgres.log are symlinks to it. `make clean` removes both.
choose_dirs() {
	PG_HOME=$RUN_DIR
	if ((AS_ROOT)) && ! runuser -u "$PG_OS_USER" -- test -x "$ROOT" 2>/dev/null; then
		PG_HOME=$TMP_DIR
	fi
	PGDATA=$PG_HOME/pgdata
	PG_LOG=$PG_HOME/postgres.log
	# A Unix socket path (dir + "/.s.PGSQL.<port>") must fit in sun_path
	# (107 bytes); keep a margin.
	SOCK_DIR=$PG_HOME
	if (($(printf '%s/.s.PGSQL.%s' "$SOCK_DIR" "$PG_PORT" | wc -c) > 100)); then
		SOCK_DIR=$TMP_DIR
	fi
}

# make_tmp_dir creates $TMP_DIR, refusing one that someone else made.
make_tmp_dir() {
	local owner
	owner=$(id -u)
	((AS_ROOT)) && owner=$(id -u "$PG_OS_USER")
	if [[ -L $TMP_DIR || (-e $TMP_DIR && ! -d $TMP_DIR) ]]; then
		die "$TMP_DIR exists and is not a directory; remove it"
	fi
	if [[ ! -d $TMP_DIR ]]; then
		mkdir -m 700 "$TMP_DIR"
		((AS_ROOT)) && chown "$PG_OS_USER:" "$TMP_DIR"
	fi
	[[ $(stat -c %u "$TMP_DIR") == "$owner" ]] ||
		die "$TMP_DIR belongs to another user (uid $(stat -c %u "$TMP_DIR")); remove it"
	chmod 700 "$TMP_DIR"
}

prepare_dirs() {
	mkdir -p "$RUN_DIR"
	if [[ $PG_HOME == "$TMP_DIR" || $SOCK_DIR == "$TMP_DIR" ]]; then
		make_tmp_dir
	fi
	if [[ $PG_HOME == "$RUN_DIR" ]]; then
		((AS_ROOT)) && chown "$PG_OS_USER:" "$RUN_DIR"
		chmod 700 "$RUN_DIR"
	else
		ln -sfn "$PGDATA" "$RUN_DIR/pgdata"
		ln -sfn "$PG_LOG" "$RUN_DIR/postgres.log"
		log "the postgres user cannot reach $RUN_DIR; the cluster lives in $PG_HOME instead"
	fi
	if [[ -e $PGDATA && ! -L $PGDATA ]]; then
		local want owner
		want=$(id -u)
		((AS_ROOT)) && want=$(id -u "$PG_OS_USER")
		owner=$(stat -c %u "$PGDATA")
		[[ $owner == "$want" ]] ||
			die "$PGDATA belongs to uid $owner, but this run needs it owned by uid $want; run 'make clean' (as its owner) first"
	fi
}

# sq escapes a value for a single-quoted postgresql.conf string.
sq() { printf '%s' "${1//\'/\'\'}"; }

init_cluster() {
	local include="include_if_exists = 'run.conf'"
	if [[ -f $PGDATA/PG_VERSION ]] && grep -qxF "$include" "$PGDATA/postgresql.conf" 2>/dev/null; then
		local have want
		have=$(<"$PGDATA/PG_VERSION")
		want=$("$BINDIR/postgres" -V | awk '{print $3}')
		want=${want%%.*}
		if [[ $have != "$want" ]]; then
			if has_server_bins "/usr/lib/postgresql/$have/bin"; then
				BINDIR=/usr/lib/postgresql/$have/bin
			else
				die "$PGDATA was created by PostgreSQL $have but the binaries in $BINDIR are version $want; run 'make clean' to start over"
			fi
		fi
		return 0
	fi
	# No cluster, or a half-made one (an initdb that was killed): start over.
	[[ -e $PGDATA/postmaster.pid ]] && die "$PGDATA is incomplete but has a postmaster.pid; stop that server, then run 'make clean'"
	rm -rf "$PGDATA"
	log "creating a PostgreSQL cluster in $PGDATA (first run)"
	local pwfile=$PG_HOME/superuser.password
	(umask 077 && head -c 18 /dev/urandom | base64 >"$pwfile")
	((AS_ROOT)) && chown "$PG_OS_USER:" "$pwfile"
	if ! as_pg "$BINDIR/initdb" -D "$PGDATA" -U postgres --pwfile="$pwfile" \
		--auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C \
		>"$PG_HOME/initdb.log" 2>&1 9>&-; then
		cat "$PG_HOME/initdb.log" >&2
		rm -rf "$PGDATA"
		die "initdb failed (output above)"
	fi
	# Settings that depend on the environment go to run.conf, rewritten on
	# every start; this line marks a completed initdb.
	printf '\n# scripts/run.sh: listen address, port and socket directory\n%s\n' "$include" >>"$PGDATA/postgresql.conf"
}

write_run_conf() {
	local conf=$PGDATA/run.conf
	cat >"$conf" <<EOF
# Written by scripts/run.sh on every start: edit the script (or its RUN_*
# variables), not this file.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$(sq "$SOCK_DIR")'
EOF
	((AS_ROOT)) && chown "$PG_OS_USER:" "$conf"
	return 0
}

pg_running() {
	as_pg "$BINDIR/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1
}

start_postgres() {
	write_run_conf
	if pg_running; then
		# Left over from a run that was killed: reuse it if it listens where
		# we want, else restart it with the new settings.
		PG_MANAGED=1
		local port sock
		port=$(sed -n 4p "$PGDATA/postmaster.pid")
		sock=$(sed -n 5p "$PGDATA/postmaster.pid")
		if [[ $port == "$PG_PORT" && $sock == "$SOCK_DIR" ]]; then
			log "PostgreSQL is already running on 127.0.0.1:$PG_PORT; reusing it"
			return 0
		fi
		log "PostgreSQL is running with other settings (port $port); restarting it"
		as_pg "$BINDIR/pg_ctl" -D "$PGDATA" -m fast -w -s stop 9>&-
	fi
	port_open "$PG_PORT" &&
		die "127.0.0.1:$PG_PORT is already in use; pick another PostgreSQL port with RUN_PG_PORT=..."
	log "starting PostgreSQL on 127.0.0.1:$PG_PORT (log: $PG_LOG)"
	PG_MANAGED=1
	if ! as_pg "$BINDIR/pg_ctl" -D "$PGDATA" -l "$PG_LOG" -w -t 60 -s start 9>&-; then
		tail -n 20 "$PG_LOG" >&2 || true
		if tail -n 20 "$PG_LOG" 2>/dev/null | grep -q 'Address already in use'; then
			die "PostgreSQL could not listen on 127.0.0.1:$PG_PORT (in use; see ss -tan | grep $PG_PORT); pick another port with RUN_PG_PORT=..."
		fi
		die "PostgreSQL did not start (log tail above)"
	fi
}

# stop_postgres_at stops the server of a data directory if it runs, with
# pg_ctl when available, else by signalling the postmaster (SIGINT is
# PostgreSQL's "fast" shutdown).
stop_postgres_at() {
	local data=$1 bindir=${2:-} pid i
	[[ -f $data/postmaster.pid ]] || return 0
	if [[ -n $bindir ]] && { ((!AS_ROOT)) || id -u "$PG_OS_USER" >/dev/null 2>&1; }; then
		if as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
			as_pg "$bindir/pg_ctl" -D "$data" -m fast -w -t 60 -s stop 9>&- ||
				log "pg_ctl stop failed; see $PG_LOG"
		fi
		return 0
	fi
	pid=$(head -n 1 "$data/postmaster.pid")
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill -INT "$pid"
	for ((i = 0; i < 600; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	log "PostgreSQL (pid $pid) did not stop within 60s"
}

# lock makes sure only one run.sh uses this checkout's cluster at a time. The
# lock is on fd 9, which every child started below closes (9>&-) so that a
# postgres left behind cannot hold it.
lock() {
	command -v flock >/dev/null || return 0
	exec 9>"$RUN_DIR/run.lock"
	flock -n 9 || die "$1"
}

# ---- stop / clean ----------------------------------------------------------

if [[ ${1:-} == stop || ${1:-} == clean ]]; then
	[[ -d $RUN_DIR || -d $TMP_DIR ]] || exit 0
	[[ -d $RUN_DIR ]] && lock "scripts/run.sh is running in this checkout; stop it with Ctrl-C first"
	BINDIR=$(find_bindir || true)
	PG_LOG=$RUN_DIR/postgres.log
	for d in "$RUN_DIR/pgdata" "$TMP_DIR/pgdata"; do
		if [[ -d $d && ! -L $d ]]; then
			stop_postgres_at "$d" "$BINDIR"
		fi
	done
	if [[ $1 == clean ]]; then
		rm -rf "$RUN_DIR" "$TMP_DIR"
	fi
	exit 0
fi

# ---- run -------------------------------------------------------------------

POOLERD_PID=
PG_MANAGED=0 # set once PostgreSQL is started (or reused): stop it on exit

# Signals only count: the work of stopping happens in the normal flow below
# (or in on_exit), never inside a signal trap. A Ctrl-C reaches the whole
# foreground process group (make, this script, whatever it runs in the
# foreground) and is often pressed twice; bash's handling of a signal that
# arrives while a trap handler runs is too fragile to build on.
SIGNALS=0
trap 'SIGNALS=$((SIGNALS + 1))' INT TERM HUP
# When the terminal goes away (SIGHUP) or the reader of a pipe such as
# `make run | tee log` dies, writing a message must not kill this script
# before it has stopped poolerd and PostgreSQL.
trap '' PIPE
check_signals() {
	((SIGNALS == 0)) || exit 0
}

# stop_poolerd sends poolerd SIGTERM (it stops accepting clients and lets open
# transactions finish, for up to shutdown_timeout, 30s by default) and waits.
# A further signal to this script meanwhile is passed on: poolerd's second
# signal makes it close everything at once.
stop_poolerd() {
	[[ -n $POOLERD_PID ]] || return 0
	if kill -0 "$POOLERD_PID" 2>/dev/null; then
		log "stopping poolerd (SIGTERM: open transactions may finish; Ctrl-C again to stop it at once)"
		kill -TERM "$POOLERD_PID" 2>/dev/null || true
		local seen=$SIGNALS deadline=$((SECONDS + 45))
		while kill -0 "$POOLERD_PID" 2>/dev/null; do
			if ((SIGNALS > seen)); then
				seen=$SIGNALS
				log "signal again: telling poolerd to stop at once"
				kill -TERM "$POOLERD_PID" 2>/dev/null || true
			fi
			if ((SECONDS >= deadline)); then
				log "poolerd did not stop within 45s; killing it"
				kill -KILL "$POOLERD_PID" 2>/dev/null || true
			fi
			sleep 0.1 || true
		done
	fi
	wait "$POOLERD_PID" 2>/dev/null || true
	POOLERD_PID=
}

stop_pg() {
	((PG_MANAGED)) || return 0
	# Ignored signals are inherited: another Ctrl-C must not kill pg_ctl half
	# way and leave PostgreSQL running.
	trap '' INT TERM HUP
	log "stopping PostgreSQL"
	stop_postgres_at "$PGDATA" "$BINDIR"
	PG_MANAGED=0
}

# on_exit runs however the script ends: after a signal (status 0), when
# poolerd exits by itself (its status) or when a step fails. From here on
# further signals are ignored, so the cleanup always completes.
on_exit() {
	local rc=$?
	set +e
	trap '' INT TERM HUP
	stop_poolerd
	stop_pg
	exit "$rc"
}
trap on_exit EXIT

BINDIR=$(find_bindir) || {
	install_postgresql
	BINDIR=$(find_bindir) || die "PostgreSQL was installed but initdb/pg_ctl/postgres are still not found"
}
if ((AS_ROOT)); then
	id -u "$PG_OS_USER" >/dev/null 2>&1 ||
		die "running as root: PostgreSQL must run as the '$PG_OS_USER' OS user, which does not exist (create it: useradd --system --create-home --home-dir /var/lib/postgresql $PG_OS_USER)"
	command -v runuser >/dev/null || die "running as root needs runuser (util-linux) to start PostgreSQL as $PG_OS_USER"
fi
PSQL=$BINDIR/psql
[[ -x $PSQL ]] || PSQL=$(command -v psql) || die "psql not found (it comes with the postgresql-client package)"

if [[ ! -x $POOLERD ]]; then
	log "$POOLERD not found; building it"
	make -C "$ROOT" build
fi

choose_dirs
prepare_dirs
lock "another scripts/run.sh (make run) is already using $RUN_DIR; stop it first (Ctrl-C) or use a second checkout"

# Check poolerd's ports before touching PostgreSQL, so that a clash (another
# make run, a PgBouncer on 6432) leaves everything as it was.
port_open "$LISTEN_PORT" &&
	die "127.0.0.1:$LISTEN_PORT is already in use; pick another client port with RUN_LISTEN_PORT=..."
port_open "$HTTP_PORT" &&
	die "127.0.0.1:$HTTP_PORT is already in use; pick another HTTP port with RUN_HTTP_PORT=..."

check_signals
init_cluster
check_signals
start_postgres
check_signals

# Create (or reset) the app role and database; idempotent, so a run that
# was interrupted after initdb is completed by the next one.
"$PSQL" -X -q -h "$SOCK_DIR" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 9>&- <<'SQL'
SET client_min_messages = warning;
SET password_encryption = 'scram-sha-256';
SELECT 'CREATE ROLE app LOGIN' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app') \gexec
ALTER ROLE app WITH LOGIN PASSWORD 'secret';
SELECT 'CREATE DATABASE app OWNER app' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'app') \gexec
SQL

# poolerd runs in its own session (setsid) so that only this script signals
# it: a Ctrl-C reaches the whole foreground process group (make, this script,
# poolerd), and poolerd treats a second signal as "stop at once". setsid does
# not fork here (a background child is never a process group leader), so $!
# is poolerd's pid.
SETSID=()
command -v setsid >/dev/null && SETSID=(setsid)
"${SETSID[@]}" "$POOLERD" \
	--upstream "postgres://app:secret@127.0.0.1:$PG_PORT/app" \
	--listen "127.0.0.1:$LISTEN_PORT" \
	--http-listen "127.0.0.1:$HTTP_PORT" \
	--pool-mode transaction \
	--pool-size 20 \
	"$@" 9>&- &
POOLERD_PID=$!

for ((i = 0; ; i++)); do
	check_signals
	if ! kill -0 "$POOLERD_PID" 2>/dev/null; then
		rc=0
		wait "$POOLERD_PID" || rc=$?
		POOLERD_PID=
		log "poolerd exited with status $rc before accepting connections (its error is above); stopping PostgreSQL"
		exit $((rc == 0 ? 1 : rc))
	fi
	port_open "$LISTEN_PORT" && break
	((i < 300)) || die "poolerd did not accept connections on 127.0.0.1:$LISTEN_PORT within 30s"
	sleep 0.1 || true
done

cat <<EOF

poolerd $("$POOLERD" --version 2>/dev/null | awk '{print $2}') is running (pid $POOLERD_PID) in front of PostgreSQL $("$BINDIR/postgres" -V | awk '{print $3}') (data: $PGDATA).

  Connect through poolerd:  psql "postgres://app:secret@127.0.0.1:$LISTEN_PORT/app"
  Connect directly:         psql "postgres://app:secret@127.0.0.1:$PG_PORT/app"
  Metrics:                  http://127.0.0.1:$HTTP_PORT/metrics
  Health:                   http://127.0.0.1:$HTTP_PORT/healthz  http://127.0.0.1:$HTTP_PORT/readyz
  PostgreSQL log:           $PG_LOG

Ctrl-C stops poolerd and PostgreSQL.

EOF

# Wait for poolerd to exit or for a signal (which makes wait return early).
while ((SIGNALS == 0)); do
	rc=0
	wait "$POOLERD_PID" || rc=$?
	if ((SIGNALS == 0)) && ! kill -0 "$POOLERD_PID" 2>/dev/null; then
		POOLERD_PID=
		log "poolerd exited with status $rc; stopping PostgreSQL"
		exit "$rc"
	fi
done
printf '\n' >&2
stop_poolerd
stop_pg
exit 0
