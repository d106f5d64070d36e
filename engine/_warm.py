"""Warm workers: Spark tasks that stay up and supervise the processes chunks run in.

Theory of operation.  A Spark job has a fixed cost whatever its size
(submission, scheduling, shipping the function, starting the task in a Python
worker): 20-50 ms on a warm ``local[2]`` session, most of a small batch's
time and so most of its latency under a light load.  Warm workers pay it once:
one long-running job with a task per core, each task a *supervisor*
(``engine._supervisor``) that connects back to the driver and forks a worker
process, which connects too and takes chunks (the same chunks an RDD job's
partitions get) straight from the driver, over a socket of its own, until
the job ends.  A batch is then a round trip over that socket: it still runs
in Spark's Python workers, on the executors, apart from the service's
process.

This module is the Spark *home* of a :class:`~engine._pool.Pool` (what the
driver does with the connections, the queue by priority, the reports of
workers that died or were killed at their limit: ``engine._pool``).  A
generation is one warm job; a worker that dies or hangs costs that worker
(its supervisor forks another in milliseconds), never the warm job.  The job
ends only when a task itself ends (killed from outside, an executor lost):
the chunks it had begun and not answered then run again on the next one.

The tasks hold every core while they are up, and a Spark job needs free
cores: any other job a runner of the context submits (a DataFrame form's
job, a fallback, the workers' warm-up), whether that runner uses warm
workers or not, first *parks* them (:meth:`WarmWorkers.regular`: the chunks
running are finished, the tasks end, the job completes; the queued chunks
wait), and they start again for the queued chunks after it.  They park too
after ``IDLE`` seconds without a chunk.  One set per SparkContext, shared by
every runner of the process (:func:`warm_workers`): two sets would wait for
each other's cores.

The driver listens on a Unix socket for a local master (in a directory only
this user can enter) and on TCP at ``spark.driver.host`` (a port of its own,
``spark.chalk.workers.port`` or any free one) otherwise; every process
proves itself with a secret the job's function carries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine._pool import Generation, Pool, Request, Unavailable
from engine._supervisor import supervise
from engine._wire import ChunkFailed, WorkerLost

__all__ = ["IDLE", "ChunkFailed", "Request", "WarmUnavailable", "WarmWorkers", "WorkerLost",
           "cancel_group", "warm_workers"]

log = logging.getLogger(__name__)

IDLE = 2.0          # seconds without a chunk before the tasks end (the cores go back)
PORT = "spark.chalk.workers.port"   # the driver's port for the warm workers on a cluster

WarmUnavailable = Unavailable


class WarmWorkers(Pool):
    """The warm job of one SparkContext and its processes (module doc).

    Args:
        spark: the SparkSession.
        idle: seconds without a chunk before the tasks end.
    """

    name = "warm workers"

    def __init__(self, spark: Any, *, idle: float = IDLE):
        self.spark = spark
        sc = spark.sparkContext
        local = str(sc.master).startswith("local")
        super().__init__(max(1, int(sc.defaultParallelism)), 1, local=local, idle=idle)

    @contextmanager
    def regular(self) -> Iterator[None]:
        """Around another Spark job: the warm workers park first and stay down meanwhile
        (the chunks running finish; queued ones wait for the warm job after it)."""
        with self.held():
            yield

    def park(self) -> None:
        """End the warm job now (it starts again with the next chunk)."""
        with self.regular():
            pass

    # -- the home ------------------------------------------------------------------------
    def _listen(self) -> tuple[socket.socket, Any, str | None]:
        if self.local:
            return super()._listen()
        conf = self.spark.sparkContext.getConf()
        host = conf.get("spark.driver.host")
        port = int(conf.get(PORT, "0") or 0)
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((conf.get("spark.driver.bindAddress") or host or "0.0.0.0", port))
        return server, (host, server.getsockname()[1]), None

    def _launch(self, gen: Generation, address: Any, secret: bytes) -> Any:
        sc = self.spark.sparkContext
        # A task per core the cluster has now (executors come and go)
        cores = max(1, int(sc.defaultParallelism))
        if cores != self.supervisors:
            with self._cond:
                self.supervisors = gen.expected = cores
                self.slots = cores * self.per_supervisor
        group = f"chalk-warm-{uuid.uuid4().hex[:12]}"
        token, n = gen.token, self.supervisors

        def body(partition: int, items: Iterator[Any]) -> Iterator[Any]:
            return warm_task(address, secret, token, partition, items)

        def job() -> None:
            try:
                sc.setJobGroup(group, "chalk warm workers", interruptOnCancel=True)
                sc.parallelize(range(n), n).mapPartitionsWithIndex(body).collect()
            except BaseException as e:
                gen.handle["error"] = e
            finally:
                if hasattr(sc, "clearJobGroup"):
                    sc.clearJobGroup()
                with self._cond:
                    self._cond.notify_all()

        handle: dict[str, Any] = {"group": group}
        thread = threading.Thread(target=job, name=group, daemon=True)
        handle["thread"] = thread
        gen.handle = handle
        thread.start()
        return handle

    def _launched(self, gen: Generation) -> bool:
        handle = gen.handle
        return handle is not None and handle["thread"].is_alive()

    def _why_not(self, gen: Generation) -> str:
        error = (gen.handle or {}).get("error")
        if error is not None:
            return f"the {self.name} did not start: the warm job failed: {_first_line(error)}"
        return super()._why_not(gen)

    def _halt(self, gen: Generation) -> None:
        if self.local:  # ours, on this host: no need to wait for Spark to end them
            for sup in gen.supervisors.values():
                if not sup.dead:  # a task that returned: its pid may be another's by now
                    with contextlib.suppress(OSError):
                        os.kill(sup.pid, signal.SIGKILL)
        if gen.handle is not None:
            cancel_group(self.spark.sparkContext, gen.handle["group"])


def _first_line(error: BaseException) -> str:
    from engine._jobs import short_reason

    return short_reason(error)


def warm_task(address: Any, secret: bytes, token: int, partition: int,
              items: Iterator[Any]) -> Iterator[Any]:
    """The warm job's ``mapPartitions`` body: supervise a worker until the driver closes the
    connection.  Yields nothing."""
    for _ in items:  # the partition's one element
        pass
    supervise(address, secret, token, partition, 1)
    return iter(())


def cancel_group(sc: Any, group: str) -> None:
    try:
        sc.cancelJobGroup(group)
    except Exception as e:  # the context is stopped: its jobs are gone with it
        log.debug("cancelling %s: %s", group, e)


_all: dict[int, tuple[Any, WarmWorkers]] = {}
_all_lock = threading.Lock()


def warm_workers(spark: Any) -> WarmWorkers:
    """The warm workers of ``spark``'s SparkContext (one set per context, made on first use)."""
    sc = spark.sparkContext
    with _all_lock:
        for key in [k for k, (other, _w) in _all.items() if other._jsc is None]:
            _all.pop(key)[1].close()  # a stopped context's
        found = _all.get(id(sc))
        if found is None or found[0] is not sc:
            found = _all[id(sc)] = (sc, WarmWorkers(spark))
        return found[1]

