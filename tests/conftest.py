"""Session-wide test fixtures: one SparkSession, one RabbitMQ, one PostgreSQL
server per test session; fresh queues, databases and SQLite files per test.

``scripts/test.sh`` starts the services and exports CHALK_TEST_BROKER_URL and
CHALK_TEST_POSTGRES_URL; plain ``pytest`` starts them on demand (and skips the
tests that need them when that fails). Helpers for chaos tests (restart the
broker or the database) live in ``tests/_services.py``.

Tests that use ``broker_url``/``amqp_queues``, ``postgres_url``/``pg_url`` or
``spark`` get the ``broker``, ``postgres`` and ``spark`` markers automatically,
so ``-m "not spark"`` works without decorating anything.
"""

from __future__ import annotations

import itertools
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import _services
import pytest
from _services import (  # noqa: F401  (re-exported for tests)
    ServiceError,
    restart_broker,
    restart_postgres,
    start_broker,
    start_postgres,
    stop_broker,
    stop_postgres,
)
from _spark_cluster import spark_cluster  # noqa: F401  (one standalone cluster per session)

try:  # Spark and CI machines are slow; a per-example deadline only makes noise.
    from hypothesis import settings

    settings.register_profile("chalk", deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "chalk"))
except ImportError:  # pragma: no cover
    pass

# Unique per test session: every queue a test names starts with it, so one
# session never sees (or deletes) another's queues.
SESSION_PREFIX = f"ct.{uuid.uuid4().hex[:8]}."
_queue_counter = itertools.count(1)

_MARKERS = {
    "broker": {"broker_url", "amqp_queues"},
    "postgres": {"postgres_url", "pg_url"},
    "spark": {"spark", "spark_cluster"},
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in _MARKERS.items():
            if used & fixtures:
                item.add_marker(marker)


def _unavailable(what: str, error: Exception) -> None:
    """Skip (plain pytest) or fail (scripts/test.sh, which promised the services)."""
    message = f"{what} unavailable: {error}"
    print(message, file=sys.stderr)
    if os.environ.get("CHALK_TEST_REQUIRE_SERVICES") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


# --- Spark ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    """The one SparkSession of the test session (local[2], Arrow on, no UI)."""
    # Workers must run this interpreter, or they miss pyarrow and the project.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    scratch = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("chalk-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.local.dir", str(scratch / "local"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# --- RabbitMQ --------------------------------------------------------------------


@pytest.fixture(scope="session")
def broker_url() -> Iterator[str]:
    """AMQP URL of the test broker; starts the local RabbitMQ when needed.
    At session end, queues and exchanges named with this session's prefix go."""
    url = _services.broker_url()
    try:
        _services.ensure_broker(url)
    except ServiceError as e:
        _unavailable("RabbitMQ", e)
    yield url
    try:
        _services.sweep_broker(url, SESSION_PREFIX)
    except Exception as e:  # cleanup only: a remote broker or no rabbitmqctl
        print(f"could not sweep test queues {SESSION_PREFIX}*: {e}", file=sys.stderr)


class AmqpQueues:
    """Unique queue names for one test; the ones handed out are deleted after it.

    ``amqp_queues.prefix`` is unique to the test (derived names such as
    ``prefix + "in.dlq"`` are swept at session end); ``amqp_queues("in")``
    returns ``prefix + "in"`` and deletes it after the test;
    ``amqp_queues.connection()`` opens a pika BlockingConnection closed after it.
    """

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.names: list[str] = []
        self._connections: list = []

    def __call__(self, suffix: str = "q") -> str:
        return self.name(suffix)

    def name(self, suffix: str = "q") -> str:
        name = self.prefix + suffix
        if name not in self.names:
            self.names.append(name)
        return name

    def connection(self):
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        self._connections.append(conn)
        return conn

    def sweep(self) -> None:
        """Delete every queue/exchange with this test's prefix now (uses rabbitmqctl)."""
        _services.sweep_broker(self.url, self.prefix)

    def close(self) -> None:
        for conn in self._connections:
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass
        _services.delete_queues(self.url, self.names)


@pytest.fixture
def amqp_queues(broker_url: str) -> Iterator[AmqpQueues]:
    """A unique queue-name prefix for this test; its queues are deleted afterwards."""
    try:  # a chaos test before this one may have left the broker down
        _services.ensure_broker(broker_url)
    except ServiceError as e:
        _unavailable("RabbitMQ", e)
    queues = AmqpQueues(broker_url, f"{SESSION_PREFIX}{next(_queue_counter)}.")
    yield queues
    try:
        _services.ensure_broker(broker_url)
        queues.close()
    except Exception as e:
        print(f"could not delete test queues {queues.prefix}*: {e}", file=sys.stderr)


# --- PostgreSQL -------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """SQLAlchemy URL of the shared test database ``chalk_test``; starts the
    private cluster (scripts/services.sh start-postgres) when needed."""
    try:
        return _services.ensure_postgres()
    except ServiceError as e:
        _unavailable("PostgreSQL", e)
        raise  # unreachable: _unavailable skips or fails


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    """SQLAlchemy URL of a fresh, empty database for this test (dropped afterwards)."""
    from sqlalchemy import create_engine, make_url, text
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.pool import NullPool

    try:
        _services.ensure_postgres(postgres_url)
    except ServiceError as e:
        _unavailable("PostgreSQL", e)
    base = make_url(postgres_url)
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = create_engine(
        base.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    try:
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        except OperationalError as e:
            _unavailable("PostgreSQL", e)
        yield base.set(database=name).render_as_string(hide_password=False)
        try:
            _services.ensure_postgres(postgres_url)  # a chaos test may have stopped it
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        except Exception as e:
            print(f"could not drop test database {name}: {e}", file=sys.stderr)
    finally:
        admin.dispose()


# --- SQLite -----------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """SQLAlchemy URL of a fresh SQLite file in this test's tmp_path."""
    return f"sqlite:///{tmp_path / 'chalk.db'}"
