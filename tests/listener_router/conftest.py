"""Fixtures for the listener/router: settings on unique queues, queue helpers, a service runner."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from listener_router_helpers import Broker

from listener_router import ListenerRule, RouterRule, Service, Settings
from listener_router.broker import declare_all, dlq_name

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(broker_url: str) -> Broker:
    return Broker(broker_url)


@pytest.fixture
def qname(broker: Broker) -> Iterator[Callable[[str], str]]:
    """Unique queue names; each one (and its .dlq/.retry.N companions) is deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    made: list[str] = []

    def name(suffix: str) -> str:
        made.append(f"t.{tag}.{suffix}")
        return made[-1]

    yield name
    doomed = []
    for queue in made:
        doomed += [queue, dlq_name(queue)] + [f"{queue}.retry.{i}" for i in range(1, 6)]
    try:
        broker.delete(*doomed)
    except pika.exceptions.AMQPError:
        pass


@pytest.fixture
def make_settings(broker_url: str, sqlite_url: str, qname: Callable[[str], str]
                  ) -> Callable[..., Settings]:
    """Settings on unique queues: one listener rule on ``in`` and, by default, one router to ``out``."""

    def make(workflow: str = "Demo", *, workflows_dir: str | Path | None = None,
             routers: tuple[RouterRule, ...] | None = None,
             rules: tuple[ListenerRule, ...] | None = None, **listener: Any) -> Settings:
        if rules is None:
            rules = (ListenerRule(name="test", queue=qname("in"), workflow=workflow,
                                  batch_size=listener.pop("batch_size", 200),
                                  max_wait_ms=listener.pop("max_wait_ms", 100),
                                  backoff_ms=listener.pop("backoff_ms", (100, 200)), **listener),)
        if routers is None:
            routers = (RouterRule(queue=qname("out"), attributes=("text", "words")),)
        return Settings(blackboard_url=sqlite_url, broker_url=broker_url,
                        workflows_dir=str(workflows_dir or REPO / "workflows"),
                        listeners=rules, routers=routers, node=f"test-{uuid.uuid4().hex[:6]}")

    return make


@pytest.fixture
def declare(broker_url: str) -> Callable[[Settings], None]:
    """Declare the queues a service with these settings would declare."""
    def run(settings: Settings) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(broker_url))
        try:
            declare_all(conn, settings)
        finally:
            conn.close()
    return run


@pytest.fixture
def run_service(spark: Any) -> Callable[..., Any]:
    """Run a Service on the session's SparkSession until a condition holds."""
    def run(settings: Settings, *, until: Callable[[Any], bool], idle_exit: float = 30.0,
            **kwargs: Any) -> Any:
        with Service(settings, spark=spark, **kwargs) as service:
            return service.run(until=until, idle_exit=idle_exit)
    return run
