"""A Spark standalone cluster for tests: one master and one worker, started
with pyspark's own launcher (``bin/spark-class`` in the pyspark package).

    with SparkCluster(tmp_dir) as cluster:
        cluster.master_url        # spark://127.0.0.1:<free port>
        subprocess.run([...], env=cluster.driver_env())

``spark_cluster`` is a session-scoped fixture (``tests/conftest.py`` offers
it): the modules that use it share one master and worker, started when the
first of them needs it (~5 to 50 s on a busy machine) and stopped at the
end of the session; mark such modules ``spark`` and ``slow``.  A test that
counts applications counts those that came after it started.  One SparkContext per Python process, and the test session's
is ``local[2]``: work on the cluster runs in a subprocess (a driver script,
``chalk process`` or the service) with ``[spark] master = cluster.master_url``.

Ports are free ones (a second suite on the machine gets its own cluster), the
daemons bind to 127.0.0.1, logs and the worker's scratch directory go to the
cluster's directory, and ``stop()`` kills both process groups: the executors
and their Python workers are in the worker's group.

Measured on the 2-core test machine (shared, so noisy): both daemons
launched at once, the worker is ALIVE in the master's JSON after ~5 s
(17-28 s while other suites kept the load at 15-20); master and worker
are ~230-250 MB resident each.  An application adds an executor JVM (~290 MB
at peak for the engine tests) and its Python daemon and workers (~650 MB
together at peak with 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# Settings both daemons read (--properties-file).  The master's REST submission
# server would take the fixed port 6066: off, so two clusters do not meet there.
DAEMON_PROPERTIES = {
    "spark.master.rest.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


class ClusterError(RuntimeError):
    """The standalone master or worker did not start (the message has their log tails)."""


def spark_home() -> Path:
    """The pyspark package directory: it has ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    """A TCP port nobody listens on now (the daemon binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover  (a member we may not signal: still there)
        return True
    return True


class SparkCluster:
    """One standalone master and one worker on 127.0.0.1, for tests.

    Args:
        directory: where logs (``master.log``, ``worker.log``), the worker's
            scratch directory (``work/``) and the daemons' configuration go.
        cores, memory: what the worker offers applications (``--cores``,
            ``--memory``).
        timeout: seconds to wait for the worker to register.
    """

    def __init__(self, directory: str | os.PathLike[str], *, cores: int = 2, memory: str = "2g",
                 timeout: float = 90.0) -> None:
        self.directory = Path(directory)
        self.cores = cores
        self.memory = memory
        self.timeout = timeout
        self.master_port = free_port()
        self.master_ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.master_port}"
        self.master: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        #: seconds from launching both daemons until the worker was ALIVE at the master
        self.start_seconds: float | None = None

    # -- what tests use -------------------------------------------------------------

    @property
    def master_ui(self) -> str:
        return f"http://127.0.0.1:{self.master_ui_port}"

    def status(self) -> dict[str, Any]:
        """The master's JSON status (``workers``, ``aliveworkers``, ``cores``, ``activeapps``, …)."""
        with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as response:
            return json.loads(response.read().decode("utf-8"))

    def driver_env(self, **extra: str) -> dict[str, str]:
        """Environment for a driver process of this cluster: the project's
        interpreter for executors and the loopback address for Spark."""
        env = dict(os.environ)
        env.update({
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        })
        env.update(extra)
        return env

    def memory_rss(self) -> dict[str, int | None]:
        """Resident bytes of the master and the worker JVM (not the executors)."""
        return {
            "master": _rss_bytes(self.master.pid) if self.master else None,
            "worker": _rss_bytes(self.worker.pid) if self.worker else None,
        }

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for name in ("master.log", "worker.log"):
            path = self.directory / name
            if path.exists():
                tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
                out.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out)

    # -- life cycle ---------------------------------------------------------------------

    def __enter__(self) -> SparkCluster:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in [k for k in env if k.startswith(("SPARK_", "PYSPARK_"))]:
            del env[key]  # a caller's SPARK_CONF_DIR, SPARK_MASTER_* … must not leak in
        env.update({
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self.directory / "conf"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.directory),
            # what a worker host needs; drivers also send theirs with every task
            "PYSPARK_PYTHON": sys.executable,
        })
        return env

    def _launch(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115  (the daemon owns it)
        try:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.directory, env=self._env(), start_new_session=True,
            )
        finally:
            log.close()

    def start(self) -> None:
        """Start the master and the worker; return once the worker is ALIVE at the master."""
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "conf"
        conf.mkdir(exist_ok=True)
        properties = conf / "spark-defaults.conf"
        properties.write_text("".join(f"{k} {v}\n" for k, v in DAEMON_PROPERTIES.items()))
        started = time.monotonic()
        self.master = self._launch("master", [
            MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.master_port),
            "--webui-port", str(self.master_ui_port), "--properties-file", str(properties),
        ])
        # The worker retries until the master listens: both JVMs start at once.
        self.worker = self._launch("worker", [
            WORKER_CLASS, self.master_url, "--host", "127.0.0.1", "--port", str(free_port()),
            "--webui-port", str(free_port()), "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(self.directory / "work"), "--properties-file", str(properties),
        ])
        try:
            self._wait_alive(started)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def _wait_alive(self, started: float) -> None:
        deadline = started + self.timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for name, proc in (("master", self.master), ("worker", self.worker)):
                if proc is not None and proc.poll() is not None:
                    raise ClusterError(f"the standalone {name} exited with {proc.returncode}\n"
                                       + self.log_tail())
            self._check_master_port()
            try:
                status = self.status()
            except (OSError, ValueError) as e:  # not listening yet, or the UI not serving JSON yet
                last = e
            else:
                alive = [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]
                if status.get("status") == "ALIVE" and alive:
                    return
            time.sleep(0.2)
        raise ClusterError(f"no worker ALIVE at {self.master_url} after {self.timeout:g}s "
                           f"(last error: {last})\n" + self.log_tail())

    def _check_master_port(self) -> None:
        """Fail fast when the master took another port (ours was taken meanwhile)."""
        path = self.directory / "master.log"
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        m = re.search(r"Starting Spark master at (spark://\S+)", text)
        if m and m.group(1) != self.master_url:
            raise ClusterError(f"the master started at {m.group(1)}, not {self.master_url} "
                               "(port taken meanwhile)\n" + self.log_tail())

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the worker (and with it the executors), then the master; SIGKILL what stays."""
        for proc in (self.worker, self.master):
            if proc is None:
                continue
            pgid = proc.pid  # start_new_session: the daemon leads its own group
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and (proc.poll() is None or _group_alive(pgid)):
                time.sleep(0.1)
            if proc.poll() is None or _group_alive(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        self.worker = self.master = None


def java_missing() -> str | None:
    """Why a standalone cluster cannot start here, or None."""
    if not (spark_home() / "bin" / "spark-class").exists():
        return f"no bin/spark-class in {spark_home()}"
    try:
        subprocess.run(["java", "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        return f"java does not run: {e}"
    return None


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master with one worker (2 cores, 2 GB) for the test session.

    Fails (under scripts/test.sh, which promises Java) or skips (plain
    pytest) when it cannot start; stopped at the end of the session.
    """
    why = java_missing()
    if why is None:
        cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
        try:
            cluster.start()
        except ClusterError as e:
            why = str(e)
    if why is not None:
        message = f"Spark standalone cluster unavailable: {why}"
        if os.environ.get("CHALK_TEST_REQUIRE_SERVICES") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    print(f"\nSpark standalone {cluster.master_url}: worker ALIVE after {cluster.start_seconds:.1f}s, "
          f"resident {cluster.memory_rss()}", file=sys.stderr)
    try:
        yield cluster
    finally:
        cluster.stop()
