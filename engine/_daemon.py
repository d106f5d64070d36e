"""Spark's Python daemon (``spark.python.daemon.module``), without a traceback when Spark stops.

Spark forks its Python workers from a daemon (``pyspark.daemon``) and reuses
them.  When the JVM stops (the service's end), it closes the connection of
each idle worker; the worker, flushing what it had for a task that will not
come, gets ``BrokenPipeError`` (or ``ConnectionResetError``) and the daemon
prints its traceback to the service's error stream: two of them in every
service log, though nothing went wrong.  This module is that daemon with
one change: a worker whose connection the JVM closed ends quietly (as one
that failed its task does: its connection is closed, the process ends).
Any other error is printed as before.
"""

from __future__ import annotations

from typing import Any

from pyspark import daemon

__all__ = ["worker"]

_worker = daemon.worker


def worker(sock: Any, authenticated: bool) -> int:
    """``pyspark.daemon.worker``; 1 (end this worker) when the JVM closed its connection."""
    try:
        return int(_worker(sock, authenticated))
    except (BrokenPipeError, ConnectionResetError):
        return 1


daemon.worker = worker  # the daemon's manager looks the name up in its module at each fork

if __name__ == "__main__":
    daemon.manager()
