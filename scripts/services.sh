#!/usr/bin/env bash
# Test services without systemd: the machine's RabbitMQ node and a private
# PostgreSQL cluster. Every command is idempotent and safe to run while the
# service is already up; start/stop are serialised with a lock so two test
# runs never boot two nodes at once.
#
#   scripts/services.sh start-rabbitmq | stop-rabbitmq | restart-rabbitmq
#   scripts/services.sh start-postgres | stop-postgres | restart-postgres
#   scripts/services.sh start | stop | status | broker-url | postgres-url
#
# start-postgres prints the SQLAlchemy URL on stdout; progress goes to stderr.
# Settings (environment): CHALK_PG_DIR (default /var/tmp/chalk-pg),
# CHALK_PG_PORT (55432), CHALK_SERVICES_LOG (/var/tmp/chalk-services),
# CHALK_RMQ_NODE (default rabbit: the machine's node) and CHALK_RMQ_PORT
# (5672). Another node name runs a second, private RabbitMQ node beside the
# machine's (its own port, data and log), so two checkouts can run their
# suites at once without one's broker restarts cutting the other's tests:
#
#   CHALK_RMQ_NODE=chalk2 CHALK_RMQ_PORT=5682 CHALK_PG_PORT=55442 \
#       CHALK_PG_DIR=/var/tmp/chalk-pg2 bash scripts/test.sh
set -euo pipefail

RMQ_SBIN=${CHALK_RABBITMQ_SBIN:-/usr/sbin}
RMQ_NODE=${CHALK_RMQ_NODE:-rabbit}
RMQ_PORT=${CHALK_RMQ_PORT:-5672}
LOG_DIR=${CHALK_SERVICES_LOG:-/var/tmp/chalk-services}
if [ "$RMQ_NODE" != rabbit ] || [ "$RMQ_PORT" != 5672 ]; then
    # rabbitmq-server and rabbitmqctl both read these.
    export RABBITMQ_NODENAME="$RMQ_NODE@$(hostname -s)"
    export RABBITMQ_NODE_PORT=$RMQ_PORT
    export RABBITMQ_DIST_PORT=$((RMQ_PORT + 20000))
    export RABBITMQ_ENABLED_PLUGINS_FILE=$LOG_DIR/$RMQ_NODE.plugins
    mkdir -p "$LOG_DIR"
    [ -s "$RABBITMQ_ENABLED_PLUGINS_FILE" ] || echo '[].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    chmod 644 "$RABBITMQ_ENABLED_PLUGINS_FILE"
fi
RMQ_LOG=rabbitmq-$RMQ_NODE.log
RMQ_PIDFILE=${CHALK_RABBITMQ_PIDFILE:-/var/lib/rabbitmq/mnesia/$RMQ_NODE@$(hostname -s).pid}
if [ "$(id -u)" = 0 ]; then
    PG_DIR=${CHALK_PG_DIR:-/var/tmp/chalk-pg}
else
    PG_DIR=${CHALK_PG_DIR:-/tmp/chalk-pg-$(id -un)}
fi
PG_PORT=${CHALK_PG_PORT:-55432}
PG_DB=chalk_test
PGDATA=$PG_DIR/data
PG_LOG=$PG_DIR/postgres.log

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$LOG_DIR"

SELF=$(readlink -f "${BASH_SOURCE[0]}")

# Serialise start/stop across concurrent callers (one lock per service).
# flock -o keeps the lock in flock itself: the daemons we start must not
# inherit the lock's descriptor, or the lock would live as long as they do.
with_lock() {  # lock-name internal-command
    local name=$1
    [ "$name" = rabbitmq ] && [ "$RMQ_NODE" != rabbit ] && name=rabbitmq-$RMQ_NODE
    flock -o -w 300 "$LOG_DIR/$name.lock" bash "$SELF" "$2"
}

port_open() {  # host port
    timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

poll() {  # seconds command...: true as soon as the command is, tried 4 times a second
    local i n=$(($1 * 4))
    shift
    for ((i = 0; i < n; i++)); do
        "$@" && return 0
        sleep 0.25
    done
    return 1
}

# --- RabbitMQ ---------------------------------------------------------------

rmq_pid() {  # the pid in the pid file, once it holds a whole one
    local pid
    pid=$(cat "$RMQ_PIDFILE" 2>/dev/null || true)
    [[ "$pid" =~ ^[0-9]+$ ]] && echo "$pid"
}

rmq_pid_alive() {
    local pid
    pid=$(rmq_pid) && kill -0 "$pid" 2>/dev/null
}

rmq_port_closed() { ! port_open 127.0.0.1 "$RMQ_PORT"; }

rmq_fail() {  # message: give up, with the end of the node's log
    log "last lines of $LOG_DIR/$RMQ_LOG:"
    tail -n 25 "$LOG_DIR/$RMQ_LOG" >&2 || true
    die "$1; see $LOG_DIR/$RMQ_LOG and /var/log/rabbitmq/"
}

_start_rabbitmq() {
    [ -x "$RMQ_SBIN/rabbitmq-server" ] || die "$RMQ_SBIN/rabbitmq-server missing; run scripts/install.sh"
    if port_open 127.0.0.1 "$RMQ_PORT"; then
        log "rabbitmq: already accepting connections on $RMQ_PORT"
        return 0
    fi
    if rmq_pid_alive; then
        log "rabbitmq: node is booting (pid $(rmq_pid)), waiting"
    else
        # A pid file left by a node that died (kill -9, a machine image taken
        # while it ran) would be read before the new node replaces it.
        rm -f "$RMQ_PIDFILE"
        log "rabbitmq: starting (log $LOG_DIR/$RMQ_LOG)"
        # Detach stdio so no daemon keeps the caller's pipes open.
        "$RMQ_SBIN/rabbitmq-server" -detached </dev/null >>"$LOG_DIR/$RMQ_LOG" 2>&1
    fi
    # `rabbitmqctl wait` fails at once with garbage_in_pid_file when it reads
    # the pid file between its creation and the write of the pid: wait for a
    # whole pid first.
    poll 60 rmq_pid_alive || rmq_fail "no live rabbitmq node in $RMQ_PIDFILE after 60 s"
    "$RMQ_SBIN/rabbitmqctl" wait --timeout 120 "$RMQ_PIDFILE" </dev/null >>"$LOG_DIR/$RMQ_LOG" 2>&1 \
        || rmq_fail "rabbitmq did not start"
    poll 60 port_open 127.0.0.1 "$RMQ_PORT" || rmq_fail "rabbitmq booted but port $RMQ_PORT is closed"
    log "rabbitmq: up on 127.0.0.1:$RMQ_PORT"
}

_stop_rabbitmq() {
    if rmq_pid_alive; then
        log "rabbitmq: stopping"
        # With the pid file, `stop` returns only once the OS process is gone.
        "$RMQ_SBIN/rabbitmqctl" stop "$RMQ_PIDFILE" </dev/null >>"$LOG_DIR/$RMQ_LOG" 2>&1 \
            || die "rabbitmqctl stop failed; see $LOG_DIR/$RMQ_LOG"
    elif port_open 127.0.0.1 "$RMQ_PORT"; then
        log "rabbitmq: stopping (no pid file)"
        "$RMQ_SBIN/rabbitmqctl" stop </dev/null >>"$LOG_DIR/$RMQ_LOG" 2>&1 || true
    else
        log "rabbitmq: not running"
        return 0
    fi
    poll 30 rmq_port_closed || die "rabbitmq still accepts connections after stop"
    log "rabbitmq: stopped"
}

_restart_rabbitmq() { _stop_rabbitmq; _start_rabbitmq; }

# --- PostgreSQL ---------------------------------------------------------------

pg_bin() {
    local initdb
    initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$initdb" ] || die "PostgreSQL server binaries missing; run scripts/install.sh"
    dirname "$initdb"
}

# PostgreSQL refuses to run as root: run its tools as the postgres user.
as_pg() {
    if [ "$(id -u)" = 0 ]; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

pg_url() { echo "postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/$PG_DB"; }

pg_running() { as_pg "$(pg_bin)/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; }

_start_postgres() {
    local bin
    bin=$(pg_bin)
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        log "postgres: initdb $PGDATA"
        mkdir -p "$PG_DIR"
        [ "$(id -u)" = 0 ] && chown postgres:postgres "$PG_DIR"
        chmod 700 "$PG_DIR"
        as_pg "$bin/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --no-locale \
            </dev/null >"$LOG_DIR/initdb.log" 2>&1 || die "initdb failed; see $LOG_DIR/initdb.log"
        # Loopback only, socket in our own dir (/var/run/postgresql may not exist),
        # room for several test processes with connection pools.
        as_pg tee -a "$PGDATA/postgresql.conf" >/dev/null <<EOF

# chalk test cluster (scripts/services.sh)
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PG_DIR'
max_connections = 300
EOF
    fi
    if pg_running; then
        log "postgres: already running"
    elif port_open 127.0.0.1 "$PG_PORT"; then
        die "port $PG_PORT is taken by something other than the cluster in $PGDATA"
    else
        log "postgres: starting on 127.0.0.1:$PG_PORT (log $PG_LOG)"
        as_pg "$bin/pg_ctl" -D "$PGDATA" -l "$PG_LOG" -w -t 60 start </dev/null >/dev/null 2>&1 \
            || die "pg_ctl start failed; see $PG_LOG"
    fi
    if [ "$(as_pg "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc \
        "select 1 from pg_database where datname = '$PG_DB'" </dev/null)" != 1 ]; then
        as_pg "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$PG_DB" </dev/null \
            || die "createdb $PG_DB failed"
        log "postgres: created database $PG_DB"
    fi
    pg_url
}

_stop_postgres() {
    if [ -s "$PGDATA/PG_VERSION" ] && pg_running; then
        log "postgres: stopping"
        as_pg "$(pg_bin)/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop </dev/null >/dev/null 2>&1 \
            || die "pg_ctl stop failed; see $PG_LOG"
        log "postgres: stopped"
    else
        log "postgres: not running"
    fi
}

_restart_postgres() { _stop_postgres; _start_postgres; }

status() {
    local rc=0
    if port_open 127.0.0.1 "$RMQ_PORT"; then echo "rabbitmq: up (amqp://guest:guest@127.0.0.1:$RMQ_PORT/%2F)"
    else echo "rabbitmq: down"; rc=1; fi
    if port_open 127.0.0.1 "$PG_PORT"; then echo "postgres: up ($(pg_url))"
    else echo "postgres: down ($PGDATA)"; rc=1; fi
    return $rc
}

case "${1:-}" in
    start-rabbitmq)   with_lock rabbitmq _start_rabbitmq ;;
    stop-rabbitmq)    with_lock rabbitmq _stop_rabbitmq ;;
    restart-rabbitmq) with_lock rabbitmq _restart_rabbitmq ;;
    start-postgres)   with_lock postgres _start_postgres ;;
    stop-postgres)    with_lock postgres _stop_postgres ;;
    restart-postgres) with_lock postgres _restart_postgres ;;
    start)            with_lock rabbitmq _start_rabbitmq; with_lock postgres _start_postgres ;;
    stop)             with_lock rabbitmq _stop_rabbitmq; with_lock postgres _stop_postgres ;;
    status)           status ;;
    broker-url)       echo "amqp://guest:guest@127.0.0.1:$RMQ_PORT/%2F" ;;
    postgres-url)     pg_url ;;
    _start_rabbitmq | _stop_rabbitmq | _restart_rabbitmq | _start_postgres | _stop_postgres | _restart_postgres)
                      "$1" ;;  # internal: called by with_lock under the lock
    *) echo "usage: $0 start-rabbitmq|stop-rabbitmq|restart-rabbitmq|start-postgres|stop-postgres|restart-postgres|start|stop|status|broker-url|postgres-url" >&2
       exit 2 ;;
esac
