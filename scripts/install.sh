#!/usr/bin/env bash
# Install everything Chalk and its tests need on Debian 12 (root, no systemd):
# apt packages that are missing (rabbitmq-server, PostgreSQL, Java 17,
# python3-venv, Graphviz for workflow diagrams, Chromium for the dashboard's
# browser test, iproute2, nftables and ping for the lab of hosts), then a virtualenv at .venv with `pip install -e '.[dev]'`.
# Idempotent; a second run takes well under a second. Re-installs the
# Python packages whenever pyproject.toml changes.
#
# Settings (environment): PYTHON (interpreter for a new venv; default python3).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
STAMP=$VENV/.chalk-install-stamp
PYTHON=${PYTHON:-python3}

log() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }

# One installer per checkout at a time (two pips in one venv break it).
exec {lock_fd}>"/tmp/chalk-install-$(printf '%s' "$ROOT" | md5sum | cut -c1-12).lock"
flock -w 900 "$lock_fd" || die "another install.sh is still running in $ROOT"

# --- system packages ---------------------------------------------------------

java_major() {  # prints the major version of `java`, e.g. 17 (1.8 -> 8)
    local v
    v=$(java -version 2>&1 | awk -F'"' '/version/ { print $2; exit }')
    case $v in
        1.*) v=${v#1.}; echo "${v%%.*}" ;;
        *) echo "${v%%[.+-]*}" ;;
    esac
}

pkgs=()
[ -x /usr/sbin/rabbitmq-server ] || pkgs+=(rabbitmq-server)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || pkgs+=(postgresql)
command -v java >/dev/null || pkgs+=(openjdk-17-jre-headless)
command -v dot >/dev/null || pkgs+=(graphviz)
[ -x /usr/bin/chromium ] || pkgs+=(chromium)
# The lab of hosts (scripts/lab.sh): namespaces and links, partitions, ping.
command -v ip >/dev/null || pkgs+=(iproute2)
command -v nft >/dev/null || pkgs+=(nftables)
command -v ping >/dev/null || pkgs+=(iputils-ping)
if [ ! -x "$VENV/bin/python" ] && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    pkgs+=(python3-venv)
fi

if [ ${#pkgs[@]} -gt 0 ]; then
    SUDO=
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${pkgs[*]}"
        SUDO=sudo
    fi
    apt_log=$(mktemp /tmp/chalk-apt.XXXXXX.log)
    log "apt-get install ${pkgs[*]} (log $apt_log)"
    # Slim images lack man dirs, which breaks the openjdk postinst.
    $SUDO mkdir -p /usr/share/man/man1
    if ! { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends "${pkgs[@]}"; } >"$apt_log" 2>&1; then
        tail -n 30 "$apt_log" >&2
        die "apt-get failed; full log in $apt_log"
    fi
fi

[ -x /usr/sbin/rabbitmq-server ] || die "rabbitmq-server still missing after apt-get"
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || die "PostgreSQL server (initdb) still missing after apt-get"
command -v java >/dev/null || die "java not found; Spark needs Java 17+: apt-get install openjdk-17-jre-headless"
jmajor=$(java_major)
if ! [[ $jmajor =~ ^[0-9]+$ ]] || [ "$jmajor" -lt 17 ]; then
    die "Spark 4 needs Java 17 or newer, but \`java -version\` reports '${jmajor:-unknown}' ($(command -v java)). Install openjdk-17-jre-headless and put it first on PATH (or set JAVA_HOME)."
fi
log "system: rabbitmq-server, postgresql $(basename "$(dirname "$(dirname "$(compgen -G '/usr/lib/postgresql/*/bin/initdb' | sort -V | tail -n 1)")")"), java $jmajor ok"

# --- virtualenv ---------------------------------------------------------------

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "$PYTHON is $("$PYTHON" -V 2>&1); Chalk needs Python 3.10+ (set PYTHON=...)"
    log "creating virtualenv $VENV ($("$PYTHON" -V 2>&1))"
    "$PYTHON" -m venv "$VENV"
fi

want=$( { sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1; "$VENV/bin/python" -V; } 2>&1 | tr '\n' ' ')
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    log "python: .venv up to date"
else
    log "python: pip install -e '.[dev]' (2 to 3 minutes on a fresh machine)"
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    pip_log=$VENV/.chalk-pip.log
    if ! { "$VENV/bin/python" -m pip install --upgrade pip \
            && "$VENV/bin/python" -m pip install -e "$ROOT[dev]"; } >"$pip_log" 2>&1; then
        tail -n 30 "$pip_log" >&2
        die "pip install failed; full log in $pip_log"
    fi
    printf '%s' "$want" >"$STAMP"
    log "python: done"
fi
