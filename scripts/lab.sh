#!/usr/bin/env bash
# The lab: ten hosts on this machine, each a Linux network namespace with an
# address of its own from 198.18.0.0/24 (the benchmarking range), joined by a
# bridge, for tests that cut networks between machines.  Run as root.
#
#   mq1 mq2 mq3   198.18.0.11-13  a RabbitMQ cluster (quorum queues on all three)
#   db            198.18.0.20     PostgreSQL 5432, database chalk
#   spark         198.18.0.30     the standalone Spark master 7077 (UI 8080)
#   w1 w2         198.18.0.31-32  Spark workers
#   c1 c2 c3      198.18.0.41-43  Chalk members (the tests start them)
#   (the bridge)  198.18.0.1      this machine's own side, where the tests run
#
#   scripts/lab.sh up [--owner PID] [--max-seconds N]   build it (under 2 minutes)
#   scripts/lab.sh down                  stop every process in it, remove every namespace,
#                                        the bridge and every rule
#   scripts/lab.sh status                what runs where
#   scripts/lab.sh cut A B...            partition host A from hosts B... (both directions)
#   scripts/lab.sh delay A B... --ms N [--loss P]
#                                        A's traffic to B... waits N ms, P % of its packets lost
#   scripts/lab.sh heal [A]              lift every cut, delay and loss (of A only, when given)
#   scripts/lab.sh exec HOST CMD...      run CMD on HOST (its network, its hostname)
#   scripts/lab.sh kill HOST             kill -9 every process on HOST
#   scripts/lab.sh start HOST            start HOST's service again (mq*, db, spark, w*)
#
# Group names stand for several hosts: mq (mq1-3), members (c1-3), workers (w1-2).
# Cuts and loss are nftables rules inside A's namespace (drop, as a dead link does);
# the kernel here may lack tc's netem, so a delay is a small relay on A
# (scripts/lab_delay.py) that A's connections to B go through once `delay` names
# them (nftables redirects them to it; connections made before keep their path).
#
# `up --owner PID` stops the lab by itself when process PID ends (a test run);
# --max-seconds (default 7200) stops it after that long whatever happens.
# Settings (environment): CHALK_LAB_DIR (default /var/tmp/chalk-lab): data and logs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SELF=$ROOT/scripts/lab.sh
LAB=${CHALK_LAB_DIR:-/var/tmp/chalk-lab}
BRIDGE=chalklab0
NET=198.18.0
HOSTS=(mq1 mq2 mq3 db spark w1 w2 c1 c2 c3)
declare -A ADDR=([mq1]=11 [mq2]=12 [mq3]=13 [db]=20 [spark]=30 [w1]=31 [w2]=32
                 [c1]=41 [c2]=42 [c3]=43)
PY=$ROOT/.venv/bin/python
MARK=0x4c4142      # the delay relay's own connections carry it: never redirected again
DELAY_PORT=15999   # the relay listens here on each host that has one

log() { printf '[lab] %s\n' "$*" >&2; }
die() { printf '[lab] error: %s\n' "$*" >&2; exit 1; }

addr() { echo "$NET.${ADDR[$1]}"; }

expand() {  # host or group names -> host names
    local h
    for h in "$@"; do
        case $h in
            mq) echo mq1 mq2 mq3 ;;
            members) echo c1 c2 c3 ;;
            workers) echo w1 w2 ;;
            *) [ -n "${ADDR[$h]:-}" ] || die "no host named '$h' (hosts: ${HOSTS[*]}; groups: mq members workers)"
               echo "$h" ;;
        esac
    done
}

need_root() { [ "$(id -u)" = 0 ] || die "the lab needs root (network namespaces)"; }

have_ns() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }

ns_empty() { [ -z "$(ip netns pids "$1" 2>/dev/null)" ]; }   # no process left on host $1

# Run on a host: its namespace, its /etc/hosts (ip netns exec binds /etc/netns/HOST/*),
# its hostname (a UTS namespace of its own).
on() {
    local host=$1
    shift
    # CHALK_LAB_HOST marks every process of the lab (tests look for any left behind).
    ip netns exec "$host" unshare --uts -- env CHALK_LAB_HOST="$host" \
        sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

port_open() {  # host port
    ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$(addr "$1")/$2" 2>/dev/null
}

poll() {  # seconds command...
    local i n=$(($1 * 5))
    shift
    for ((i = 0; i < n; i++)); do
        "$@" && return 0
        sleep 0.2
    done
    return 1
}

# --- the network ----------------------------------------------------------------

net_up() {
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local h
    mkdir -p /etc/netns
    for h in "${HOSTS[@]}"; do
        ip netns add "$h"
        ip link add "lab-$h" type veth peer name eth0 netns "$h"
        ip link set "lab-$h" master "$BRIDGE" up
        ip -n "$h" addr add "$(addr "$h")/24" dev eth0
        ip -n "$h" link set eth0 up
        ip -n "$h" link set lo up
        mkdir -p "/etc/netns/$h"
        {
            echo "127.0.0.1 localhost"
            echo "$(addr "$h") $h"
            local o
            for o in "${HOSTS[@]}"; do [ "$o" = "$h" ] || echo "$(addr "$o") $o"; done
        } >"/etc/netns/$h/hosts"
    done
}

# --- PostgreSQL on db -------------------------------------------------------------

pg_bin() { dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)"; }

db_start() {
    local dir=$LAB/db bin
    bin=$(pg_bin)
    if [ ! -s "$dir/data/PG_VERSION" ]; then
        mkdir -p "$dir"
        chown postgres:postgres "$dir"
        chmod 700 "$dir"
        (cd / && runuser -u postgres -- "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 \
            --no-locale) >"$LAB/logs/initdb.log" 2>&1 || die "initdb failed: see $LAB/logs/initdb.log"
        # Keepalives: a member cut off mid-transaction holds its row locks until the
        # server notices it is gone (without them: hours).
        runuser -u postgres -- tee -a "$dir/data/postgresql.conf" >/dev/null <<EOF
listen_addresses = '$(addr db)'
port = 5432
unix_socket_directories = '$dir'
max_connections = 200
tcp_keepalives_idle = 5
tcp_keepalives_interval = 2
tcp_keepalives_count = 3
fsync = off
EOF
        echo "host all all $NET.0/24 trust" | runuser -u postgres -- tee -a "$dir/data/pg_hba.conf" >/dev/null
    fi
    touch "$LAB/logs/db.log"
    chown postgres:postgres "$LAB/logs/db.log"
    (cd / && on db runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -l "$LAB/logs/db.log" -w -t 60 \
        start) </dev/null >/dev/null 2>&1 || die "PostgreSQL did not start: see $LAB/logs/db.log"
    if [ "$(runuser -u postgres -- "$bin/psql" -h "$dir" -U postgres -d postgres -tAc \
            "select 1 from pg_database where datname = 'chalk'" </dev/null)" != 1 ]; then
        runuser -u postgres -- "$bin/createdb" -h "$dir" -U postgres chalk </dev/null
    fi
}

# --- RabbitMQ on mq1..mq3 ---------------------------------------------------------

mq_env() {  # host: the variables rabbitmq-server and rabbitmqctl read for its node
    local dir=$LAB/$1
    echo RABBITMQ_NODENAME="rabbit@$1" RABBITMQ_USE_LONGNAME=false \
        RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$LAB/logs/$1" \
        RABBITMQ_PID_FILE="$dir/rabbit.pid" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
        RABBITMQ_CONFIG_FILE="$dir/rabbitmq" RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
        RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
}

ctl() {  # host rabbitmqctl-args...
    local host=$1
    shift
    # shellcheck disable=SC2046
    on "$host" env $(mq_env "$host") /usr/sbin/rabbitmqctl "$@" </dev/null
}

mq_start() {
    local host=$1 dir=$LAB/$1
    mkdir -p "$dir/mnesia" "$LAB/logs/$host"
    [ -s "$dir/enabled_plugins" ] || echo '[].' >"$dir/enabled_plugins"
    : >"$dir/rabbitmq-env.conf"
    [ -f "$dir/advanced.config" ] || echo '[].' >"$dir/advanced.config"
    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 5672
loopback_users = none
log.console = false
log.file.level = warning
vm_memory_high_watermark.absolute = 512MiB
disk_free_limit.absolute = 50MB
EOF
    chown -R rabbitmq:rabbitmq "$dir" "$LAB/logs/$host"
    rm -f "$dir/rabbit.pid"
    # shellcheck disable=SC2046
    on "$host" env $(mq_env "$host") /usr/sbin/rabbitmq-server -detached \
        </dev/null >>"$LAB/logs/$host/server.out" 2>&1
}

mq_wait() {
    local host=$1
    poll 60 test -s "$LAB/$host/rabbit.pid" || die "rabbit@$host wrote no pid file: see $LAB/logs/$host"
    ctl "$host" wait --timeout 120 "$LAB/$host/rabbit.pid" >>"$LAB/logs/$host/ctl.log" 2>&1 \
        || die "rabbit@$host did not start: see $LAB/logs/$host"
    poll 60 port_open "$host" 5672 || die "rabbit@$host runs but port 5672 is closed"
}

mq_join() {  # host: join mq1's cluster (first boot only; a restarted node rejoins by itself)
    local host=$1
    if ctl "$host" cluster_status 2>/dev/null | grep -q "rabbit@mq1"; then
        return 0
    fi
    { ctl "$host" stop_app && ctl "$host" join_cluster rabbit@mq1 && ctl "$host" start_app; } \
        >>"$LAB/logs/$host/ctl.log" 2>&1 || die "rabbit@$host could not join rabbit@mq1: see $LAB/logs/$host/ctl.log"
}

mq_up() {
    mq_start mq1 && mq_start mq2 && mq_start mq3
    mq_wait mq1
    mq_wait mq2 && mq_join mq2 &
    local p2=$!
    mq_wait mq3 && mq_join mq3 &
    local p3=$!
    wait "$p2" || die "mq2 did not join"
    wait "$p3" || die "mq3 did not join"
}

# --- Spark on spark, w1, w2 ---------------------------------------------------------

spark_home() { "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'; }

spark_launch() {  # host class args...
    local host=$1
    shift
    mkdir -p "$LAB/$host/conf"
    printf 'spark.master.rest.enabled false\nspark.ui.showConsoleProgress false\n' \
        >"$LAB/$host/conf/spark-defaults.conf"
    # A subshell that execs: nothing of this script's (its output pipe) stays with the daemon.
    (cd "$LAB/$host" && exec ip netns exec "$host" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' \
        "$host" env CHALK_LAB_HOST="$host" SPARK_HOME="$SPARK_HOME" SPARK_CONF_DIR="$LAB/$host/conf" \
        SPARK_LOCAL_IP="$(addr "$host")" SPARK_LOG_DIR="$LAB/logs/$host" PYSPARK_PYTHON="$PY" \
        setsid "$SPARK_HOME/bin/spark-class" "$@" --properties-file "$LAB/$host/conf/spark-defaults.conf" \
        ) </dev/null >>"$LAB/logs/$host.log" 2>&1 &
}

spark_start() {
    local host=$1
    SPARK_HOME=${SPARK_HOME:-$(spark_home)}
    case $host in
        spark) spark_launch spark org.apache.spark.deploy.master.Master --host "$(addr spark)" \
                   --port 7077 --webui-port 8080 ;;
        w*) spark_launch "$host" org.apache.spark.deploy.worker.Worker "spark://$(addr spark):7077" \
                --host "$(addr "$host")" --port 7078 --webui-port 8081 --cores 3 --memory 3g \
                --work-dir "$LAB/$host/work" ;;
    esac
}

workers_alive() {
    local json
    json=$(ip netns exec spark timeout 3 "$PY" -c "
import json, urllib.request
print(sum(w['state'] == 'ALIVE' for w in json.load(urllib.request.urlopen('http://$(addr spark):8080/json/', timeout=2))['workers']))" 2>/dev/null) || return 1
    [ "$json" -ge "${1:-2}" ]
}

# --- the watchdog: the lab ends with its owner --------------------------------------

watchdog() {  # owner-pid max-seconds
    local owner=$1 until=$(($(date +%s) + $2))
    while [ "$(date +%s)" -lt "$until" ]; do
        if [ "$owner" != 0 ] && ! kill -0 "$owner" 2>/dev/null; then
            break
        fi
        sleep 2
    done
    log "watchdog: owner $owner gone or time up: taking the lab down"
    bash "$SELF" down
}

# --- commands -------------------------------------------------------------------------

cmd_up() {
    need_root
    local owner=0 max=7200
    while [ $# -gt 0 ]; do
        case $1 in
            --owner) owner=$2; shift 2 ;;
            --max-seconds) max=$2; shift 2 ;;
            *) die "up: unknown option $1" ;;
        esac
    done
    for tool in ip nft unshare runuser /usr/sbin/rabbitmq-server java; do
        command -v "$tool" >/dev/null || die "$tool missing: run scripts/install.sh"
    done
    [ -x "$PY" ] || die "$PY missing: run scripts/install.sh"
    local started=$SECONDS
    cmd_down quiet
    mkdir -p "$LAB/logs"
    net_up
    log "network: ${#HOSTS[@]} hosts on $BRIDGE ($NET.0/24)"
    SPARK_HOME=$(spark_home)
    export SPARK_HOME
    spark_start spark
    spark_start w1
    spark_start w2
    db_start &
    local db_pid=$!
    mq_up
    wait "$db_pid" || die "PostgreSQL did not start"
    poll 90 workers_alive 2 || die "Spark workers not ALIVE at the master: see $LAB/logs/spark.log, w1.log"
    CHALK_LAB_HOST=watchdog setsid bash "$SELF" _watchdog "$owner" "$max" </dev/null >>"$LAB/logs/watchdog.log" 2>&1 &
    echo $! >"$LAB/watchdog.pid"
    cat >"$LAB/env" <<EOF
CHALK_LAB_BROKER_URLS=$(for h in mq1 mq2 mq3; do printf 'amqp://guest:guest@%s:5672/%%2F ' "$(addr "$h")"; done)
CHALK_LAB_POSTGRES_URL=postgresql+psycopg://postgres@$(addr db):5432/chalk
CHALK_LAB_SPARK_MASTER=spark://$(addr spark):7077
EOF
    log "up in $((SECONDS - started)) s (RabbitMQ cluster of 3, PostgreSQL, Spark master and 2 workers)"
}

cmd_down() {
    local quiet=${1:-}
    local pid h
    if [ -f "$LAB/watchdog.pid" ]; then
        pid=$(cat "$LAB/watchdog.pid")
        rm -f "$LAB/watchdog.pid"
        # Its group (setsid: it leads one), so that its sleep goes with it.
        [ "$pid" != "$$" ] && [ "$pid" != "$PPID" ] && kill -- "-$pid" 2>/dev/null || true
    fi
    for h in "${HOSTS[@]}"; do
        have_ns "$h" || continue
        for pid in $(ip netns pids "$h" 2>/dev/null); do
            kill -9 "$pid" 2>/dev/null || true
        done
    done
    for h in "${HOSTS[@]}"; do
        if have_ns "$h"; then
            # processes that were leaving at the kill
            poll 10 ns_empty "$h" || log "down: processes left on $h"
            ip netns del "$h"
        fi
        rm -rf "/etc/netns/$h"
        ip link del "lab-$h" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$LAB/mq1" "$LAB/mq2" "$LAB/mq3" "$LAB/db" "$LAB/spark" "$LAB/w1" "$LAB/w2" "$LAB/env" \
        "$LAB/delay"
    [ -n "$quiet" ] || log "down: no namespace, process or rule of the lab left"
}

cmd_status() {
    local h line
    if ! have_ns mq1; then
        echo "lab: down"
        return 1
    fi
    for h in "${HOSTS[@]}"; do
        line="$h $(addr "$h"):"
        case $h in
            mq*) port_open "$h" 5672 && line+=" rabbitmq up" || line+=" rabbitmq down" ;;
            db) port_open db 5432 && line+=" postgresql up" || line+=" postgresql down" ;;
            spark) port_open spark 7077 && line+=" master up" || line+=" master down" ;;
            w*) port_open "$h" 7078 && line+=" worker up" || line+=" worker down" ;;
        esac
        line+=" ($(ip netns pids "$h" | wc -w) processes)"
        local rules
        rules=$(ip netns exec "$h" nft list tables 2>/dev/null | tr '\n' ' ')
        [ -n "$rules" ] && line+=" rules: $rules"
        echo "$line"
    done
}

table_for() { echo "lab_$1"; }

cmd_cut() {
    [ $# -ge 2 ] || die "usage: cut A B..."
    local a=$1 b addrs=()
    shift
    for b in $(expand "$@"); do addrs+=("$(addr "$b")"); done
    local set side
    set=$(IFS=,; echo "${addrs[*]}")
    # Both directions, from A's side: its connections to B stall as on a dead link.
    for side in $(expand "$a"); do
        if ! ip netns exec "$side" nft list table inet lab_cut >/dev/null 2>&1; then
            ip netns exec "$side" nft -f - <<EOF
table inet lab_cut {
    set peers { type ipv4_addr; }
    chain input { type filter hook input priority -10; policy accept; ip saddr @peers drop; }
    chain output { type filter hook output priority -10; policy accept; ip daddr @peers drop; }
}
EOF
        fi
        ip netns exec "$side" nft add element inet lab_cut peers "{ $set }"
    done
    log "cut $a from $*"
}

cmd_delay() {
    local a=$1 ms=0 loss=0 peers=()
    shift
    while [ $# -gt 0 ]; do
        case $1 in
            --ms) ms=$2; shift 2 ;;
            --loss) loss=$2; shift 2 ;;
            *) peers+=("$1"); shift ;;
        esac
    done
    [ ${#peers[@]} -gt 0 ] || die "usage: delay A B... --ms N [--loss P]"
    local addrs=() b host
    for b in $(expand "${peers[@]}"); do addrs+=("$(addr "$b")"); done
    local set
    set=$(IFS=,; echo "${addrs[*]}")
    mkdir -p "$LAB/delay"
    for host in $(expand "$a"); do
        echo "$ms" >"$LAB/delay/$host.ms"
        if [ ! -f "$LAB/delay/$host.pid" ] || ! kill -0 "$(cat "$LAB/delay/$host.pid")" 2>/dev/null; then
            ip netns exec "$host" env CHALK_LAB_HOST="$host" setsid python3 "$ROOT/scripts/lab_delay.py" --port "$DELAY_PORT" \
                --mark "$MARK" --ms-file "$LAB/delay/$host.ms" </dev/null >>"$LAB/logs/delay-$host.log" 2>&1 &
            echo $! >"$LAB/delay/$host.pid"
            poll 10 ip netns exec "$host" bash -c "exec 3<>/dev/tcp/127.0.0.1/$DELAY_PORT" 2>/dev/null \
                || die "the delay relay on $host did not start: see $LAB/logs/delay-$host.log"
        fi
        ip netns exec "$host" nft -f - <<EOF
table ip lab_delay
delete table ip lab_delay
table ip lab_delay {
    set peers { type ipv4_addr; }
    chain to_relay { type nat hook output priority -100; policy accept;
        meta mark != $MARK ip daddr @peers meta l4proto tcp redirect to :$DELAY_PORT; }
    chain lossy { type filter hook output priority 0; policy accept;
        meta mark $MARK ip daddr @peers numgen random mod 1000 < $(awk -v p="$loss" 'BEGIN { printf "%d", p * 10 }') drop; }
}
EOF
        ip netns exec "$host" nft add element ip lab_delay peers "{ $set }"
    done
    log "delay $a -> ${peers[*]}: ${ms} ms, ${loss} % loss"
}

cmd_heal() {
    local hosts=("${HOSTS[@]}") h
    [ $# -gt 0 ] && mapfile -t hosts < <(expand "$@" | tr ' ' '\n')
    for h in "${hosts[@]}"; do
        have_ns "$h" || continue
        ip netns exec "$h" nft delete table inet lab_cut 2>/dev/null || true
        if [ -f "$LAB/delay/$h.ms" ]; then
            # The relay stays (connections through it live on) with no delay, and no loss.
            echo 0 >"$LAB/delay/$h.ms"
            ip netns exec "$h" nft flush chain ip lab_delay lossy 2>/dev/null || true
        fi
    done
    log "healed ${*:-every host}"
}

cmd_kill() {
    local h pid
    for h in $(expand "$@"); do
        for pid in $(ip netns pids "$h"); do
            kill -9 "$pid" 2>/dev/null || true
        done
        poll 30 ns_empty "$h" || die "processes survive kill -9 on $h: $(ip netns pids "$h" | tr "\n" " ")"
        log "killed every process on $h"
    done
}

cmd_start() {
    local h
    SPARK_HOME=$(spark_home)
    export SPARK_HOME
    for h in $(expand "$@"); do
        case $h in
            mq*) mq_start "$h"; mq_wait "$h" ;;
            db) db_start ;;
            spark) spark_start spark ;;
            w*) spark_start "$h" ;;
            *) die "no service of the lab runs on $h (the tests start the members)" ;;
        esac
        log "started $h"
    done
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) need_root; cmd_down ;;
    status) cmd_status ;;
    cut) shift; need_root; cmd_cut "$@" ;;
    delay) shift; need_root; cmd_delay "$@" ;;
    heal) shift; need_root; cmd_heal "$@" ;;
    exec) shift; h=$1; shift; expand "$h" >/dev/null; on "$h" "$@" ;;
    kill) shift; need_root; cmd_kill "$@" ;;
    start) shift; need_root; cmd_start "$@" ;;
    _watchdog) shift; watchdog "$@" ;;
    *) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
