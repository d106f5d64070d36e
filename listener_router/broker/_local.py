"""Start Debian's RabbitMQ on this machine when none is reachable (demo and run)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from urllib.parse import urlparse

from listener_router.broker._connection import broker_urls, where

__all__ = ["broker_reachable", "ensure_local_broker"]

log = logging.getLogger(__name__)

_SERVER = "/usr/sbin/rabbitmq-server"
_CTL = "/usr/sbin/rabbitmqctl"


def _host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "localhost", parsed.port or 5672


def broker_reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether a node of ``url`` (any of several) takes TCP connections."""
    for node in broker_urls(url):
        try:
            with socket.create_connection(_host_port(node), timeout=timeout):
                return True
        except OSError:
            continue
    return False


def ensure_local_broker(url: str, *, wait: float = 120.0) -> None:
    """Make sure a broker answers at ``url``; start a local one if it is on this host.

    Raises RuntimeError with what to do when that is not possible.
    """
    if broker_reachable(url):
        return
    nodes = broker_urls(url)
    host, port = _host_port(nodes[0])
    if len(nodes) > 1 or host not in ("localhost", "127.0.0.1", "::1"):
        raise RuntimeError(f"no RabbitMQ answers at {where(url)} (connection refused or timed "
                           "out); start it or set CHALK_BROKER_URL")
    if not os.path.exists(_SERVER) or shutil.which("erl") is None and not os.path.exists(_CTL):
        raise RuntimeError("no RabbitMQ answers on localhost and Debian's rabbitmq-server is not "
                           "installed: run `bash scripts/install.sh` (or apt-get install "
                           "rabbitmq-server)")
    log.info("starting the local RabbitMQ server")
    subprocess.run([_SERVER, "-detached"], check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    pid_file = f"/var/lib/rabbitmq/mnesia/rabbit@{socket.gethostname().split('.')[0]}.pid"
    subprocess.run([_CTL, "wait", "--timeout", str(int(wait)), pid_file], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if broker_reachable(url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"started rabbitmq-server but nothing answers at {host}:{port} after {wait:.0f} s; "
                       "see /var/log/rabbitmq/")
