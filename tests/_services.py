"""Test services from Python: probe, start, stop and restart RabbitMQ and
PostgreSQL, and clean up broker queues.

Everything that starts or stops a server goes through ``scripts/services.sh``
so the shell scripts and the tests boot services one way. Chaos tests use
``restart_broker()`` / ``stop_broker()`` / ``start_broker()`` (and the
PostgreSQL equivalents)::

    from _services import restart_broker
    restart_broker()            # full node stop + start, ~11 s
    restart_broker(mode="app")  # rabbitmqctl stop_app/start_app, ~2 s
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES_SH = ROOT / "scripts" / "services.sh"
RABBITMQCTL = "/usr/sbin/rabbitmqctl"
DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", ""}


class ServiceError(RuntimeError):
    """A test service could not be started, stopped or reached."""


def _rmq_port() -> int:
    """The port of the node scripts/services.sh manages ($CHALK_RMQ_PORT, else 5672)."""
    return int(os.environ.get("CHALK_RMQ_PORT") or 5672)


def _ctl_env() -> dict[str, str]:
    """rabbitmqctl's environment: it talks to $CHALK_RMQ_NODE when one is set."""
    env = dict(os.environ)
    node = os.environ.get("CHALK_RMQ_NODE")
    if node and "@" not in node:
        node = f"{node}@{socket.gethostname().split('.')[0]}"
    if node:
        env["RABBITMQ_NODENAME"] = node
    return env


def broker_url() -> str:
    """The broker the tests use: $CHALK_TEST_BROKER_URL or the local default."""
    return os.environ.get("CHALK_TEST_BROKER_URL") or DEFAULT_BROKER_URL


def host_port(url: str, default_port: int) -> tuple[str, int]:
    """Host and port of an AMQP or SQLAlchemy URL."""
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def run_services(command: str, timeout: float = 300) -> str:
    """Run ``scripts/services.sh COMMAND``; return its stdout, raise ServiceError."""
    try:
        done = subprocess.run(
            ["bash", str(SERVICES_SH), command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServiceError(f"scripts/services.sh {command}: {e}") from e
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-10:])
        raise ServiceError(
            f"scripts/services.sh {command} exited {done.returncode}:\n{tail}"
        )
    return done.stdout.strip()


# --- RabbitMQ ---------------------------------------------------------------


def ensure_broker(url: str | None = None) -> str:
    """Make sure the broker at ``url`` accepts connections; start the local
    RabbitMQ node when it does not. Returns the URL."""
    url = url or broker_url()
    host, port = host_port(url, 5672)
    if port_open(host, port):
        return url
    if host not in LOCAL_HOSTS or port != _rmq_port():
        raise ServiceError(f"nothing accepts connections on {host}:{port} ({url})")
    run_services("start-rabbitmq")
    if not port_open(host, port):
        raise ServiceError(f"RabbitMQ started but {host}:{port} is closed")
    return url


def wait_broker(url: str | None = None, timeout: float = 180) -> None:
    """Wait until an AMQP connection to ``url`` opens (handshake, not just TCP)."""
    import pika
    import pika.exceptions

    url = url or broker_url()
    deadline = time.monotonic() + timeout
    while True:
        try:
            pika.BlockingConnection(pika.URLParameters(url)).close()
            return
        except pika.exceptions.AMQPError as e:
            if time.monotonic() > deadline:
                raise ServiceError(f"broker {url} not back after {timeout:.0f} s") from e
            time.sleep(0.5)


def stop_broker() -> None:
    """Stop the local RabbitMQ node (returns when the process is gone)."""
    run_services("stop-rabbitmq")


def start_broker(url: str | None = None) -> None:
    """Start the local RabbitMQ node and wait until it takes AMQP connections."""
    run_services("start-rabbitmq")
    wait_broker(url)


def restart_broker(url: str | None = None, *, mode: str = "full", timeout: float = 180) -> None:
    """Restart the local broker and wait until it accepts AMQP connections.

    ``mode="full"`` stops and starts the node (every connection drops, the
    process is new: what a crash and restart look like); ``mode="app"`` uses
    ``rabbitmqctl stop_app``/``start_app`` (connections drop, faster).
    Durable queues and persistent messages survive both.
    """
    if mode == "full":
        run_services("restart-rabbitmq", timeout=timeout)
    elif mode == "app":
        for action in ("stop_app", "start_app"):
            done = subprocess.run(
                [RABBITMQCTL, action], stdin=subprocess.DEVNULL,
                capture_output=True, text=True, timeout=timeout, env=_ctl_env(),
            )
            if done.returncode != 0:
                raise ServiceError(f"rabbitmqctl {action} failed: {done.stderr.strip()}")
    else:
        raise ValueError(f"mode must be 'full' or 'app', not {mode!r}")
    wait_broker(url, timeout=timeout)


def _delete(url: str, names: Iterable[str], kind: str) -> None:
    """Delete the named queues or exchanges (missing ones are fine)."""
    import pika
    import pika.exceptions

    names = list(names)
    if not names:
        return
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = conn.channel()
        for name in names:
            try:
                if kind == "queues":
                    channel.queue_delete(queue=name)
                else:
                    channel.exchange_delete(exchange=name)
            except pika.exceptions.ChannelClosedByBroker:
                channel = conn.channel()  # older brokers: 404 for a missing one
    finally:
        conn.close()


def delete_queues(url: str, names: Iterable[str]) -> None:
    """Delete the named queues (missing ones are fine)."""
    _delete(url, names, "queues")


def delete_exchanges(url: str, names: Iterable[str]) -> None:
    """Delete the named exchanges (missing ones are fine)."""
    _delete(url, names, "exchanges")


def broker_names(kind: str = "queues") -> list[str]:
    """Names of all queues (or exchanges) on the local node, via rabbitmqctl.

    AMQP cannot list queues; this needs the local node and root (~0.4 s)."""
    done = subprocess.run(
        [RABBITMQCTL, f"list_{kind}", "-q", "--no-table-headers", "name"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        env=_ctl_env(),
    )
    if done.returncode != 0:
        raise ServiceError(f"rabbitmqctl list_{kind} failed: {done.stderr.strip()}")
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def sweep_broker(url: str, prefix: str) -> None:
    """Delete every queue and exchange whose name starts with ``prefix``."""
    if not prefix:
        raise ValueError("refusing to sweep with an empty prefix")
    delete_queues(url, [n for n in broker_names("queues") if n.startswith(prefix)])
    delete_exchanges(url, [n for n in broker_names("exchanges") if n.startswith(prefix)])


# --- PostgreSQL ---------------------------------------------------------------


def ensure_postgres(url: str | None = None) -> str:
    """Return a reachable PostgreSQL URL: ``url`` (or $CHALK_TEST_POSTGRES_URL)
    when it answers, else start the private cluster and return its URL."""
    url = url or os.environ.get("CHALK_TEST_POSTGRES_URL")
    if url:
        host, port = host_port(url, 5432)
        if port_open(host, port):
            return url
        if host not in LOCAL_HOSTS:
            raise ServiceError(f"nothing accepts connections on {host}:{port} ({url})")
    started = run_services("start-postgres").splitlines()[-1]
    url = url or started
    host, port = host_port(url, 5432)
    if not port_open(host, port):
        raise ServiceError(f"started the test cluster ({started}) but {host}:{port} is closed")
    return url


def stop_postgres() -> None:
    """Stop the private PostgreSQL cluster (fast shutdown: sessions are cut)."""
    run_services("stop-postgres")


def start_postgres() -> str:
    """Start the private PostgreSQL cluster; returns the chalk_test URL."""
    return run_services("start-postgres").splitlines()[-1]


def restart_postgres() -> str:
    """Stop and start the private PostgreSQL cluster; returns the chalk_test URL."""
    return run_services("restart-postgres").splitlines()[-1]


def _rabbitmqctl(*args: str, timeout: float = 60) -> str:
    done = subprocess.run([RABBITMQCTL, *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, env=_ctl_env())
    if done.returncode != 0:
        raise ServiceError(f"rabbitmqctl {' '.join(args[:1])} failed: {done.stderr.strip()}")
    return done.stdout


def add_broker_user(name: str, password: str) -> None:
    """A user of the local node with ``password``, allowed everything on the vhost ``/``."""
    _rabbitmqctl("add_user", name, password)
    _rabbitmqctl("set_permissions", "-p", "/", name, ".*", ".*", ".*")


def delete_broker_user(name: str) -> None:
    _rabbitmqctl("delete_user", name)


def stop_broker_app() -> None:
    """``rabbitmqctl stop_app``: the node stays up, the broker refuses every connection."""
    _rabbitmqctl("stop_app", timeout=180)


def start_broker_app(url: str | None = None) -> None:
    """``rabbitmqctl start_app``, then wait until AMQP connections open again."""
    _rabbitmqctl("start_app", timeout=180)
    wait_broker(url)
