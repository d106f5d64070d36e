"""What the benchmarks share: CPU seconds of processes, finding them, the machine, medians,
and cleaning up the queues a run declared.

Figures on a shared machine move with whatever else runs: the benchmarks
print the load average next to them and compare ratios measured in one
sitting.
"""

from __future__ import annotations

import os
import platform
import statistics
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

__all__ = ["broker_pid", "cpu_seconds", "delete_lanes", "descendants", "machine", "median",
           "named", "new_database", "percentile", "postgres_pids", "tree_cpu"]

RETRY_STEPS = 8  # retry queues a lane may have declared (``Q.retry.1`` …)


def cpu_seconds(pid: int | None, children: bool = False) -> float:
    """User + system CPU of a process so far (0 when it is gone); ``children``: plus the
    children it has waited for."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        return out
    return out + [d for c in out for d in descendants(c)]


def tree_cpu(pid: int) -> float:
    """CPU of ``pid``, its reaped children and every live process below it."""
    return cpu_seconds(pid, children=True) + sum(cpu_seconds(p) for p in descendants(pid))


def rss_mb(pid: int) -> float:
    """A process's resident memory, MB (0 when it is gone); pages it shares with the process
    it was forked from count in both."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def named(pids: Sequence[int], comm: str) -> int | None:
    """The first of ``pids`` whose command name is ``comm``."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    return pid
        except OSError:
            continue
    return None


def _listening(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.readlines()[1:]:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except OSError:
            continue
    return inodes


def _owner(inodes: set[str], comm: str) -> int | None:
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != comm:
                    continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").rstrip("]") in inodes:
                    return pid
        except OSError:
            continue
    return None


def broker_pid(url: str) -> int | None:
    """The RabbitMQ node (``beam.smp``) listening on the AMQP URL's port, if it runs here."""
    return _owner(_listening(urlsplit(url).port or 5672), "beam.smp")


def postgres_pids(url: str) -> list[int]:
    """The PostgreSQL server listening on the URL's port and its processes (backends,
    writers), if it runs here."""
    main = _owner(_listening(urlsplit(url).port or 5432), "postgres")
    return [] if main is None else [main, *descendants(main)]


@contextmanager
def new_database(base: Any, prefix: str) -> Iterator[str]:
    """A new PostgreSQL database beside the one ``base`` (a SQLAlchemy URL) names, for the
    block: its URL, password included; dropped when the block ends."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    url = make_url(base)
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def machine() -> str:
    """CPU model, cores, memory and the load average: for the head of a bench's output."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            memory = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        memory = "? GiB"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, {memory}, load {load}"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(sorted_values: Sequence[float], share: float) -> float:
    """The value below which ``share`` of ``sorted_values`` lie (nearest rank)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * share))]


def delete_lanes(url: str, queues: Sequence[str]) -> None:
    """Delete each queue with the dead-letter and retry queues the service declared beside
    it (``Q.dlq``, ``Q.retry.N``); missing ones are fine.  A long-lived broker collects the
    quorum queues of every run otherwise, and a node with hundreds of them starts slowly."""
    import pika

    from listener_router.broker import connection_parameters, dlq_name, retry_name

    names = [n for q in queues
             for n in (q, dlq_name(q), *(retry_name(q, k) for k in range(1, RETRY_STEPS + 1)))]
    try:
        conn = pika.BlockingConnection(connection_parameters(url))
    except Exception:  # nothing to clean up without a broker
        return
    try:
        channel = conn.channel()
        for name in names:
            try:
                channel.queue_delete(name)
            except Exception:  # a refusal closes the channel: take a new one
                channel = conn.channel()
    finally:
        if conn.is_open:
            conn.close()
