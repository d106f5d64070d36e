"""Fixtures for the listener/router: settings on unique queues, queue helpers, a service runner."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from lr_helpers import Broker

from listener_router import ListenerRule, RouterRule, Service, Settings
from listener_router._topology import dlq_name

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(broker_url: str) -> Broker:
    return Broker(broker_url)


@pytest.fixture
def make_settings(broker_url: str, sqlite_url: str, broker: Broker
                  ) -> Iterator[Callable[..., Settings]]:
    """Settings with unique queue names; every queue they name is deleted afterwards."""
    made: list[Settings] = []

    def make(workflow: str = "Demo", *, workflows_dir: str | Path | None = None,
             out: bool = True, **listener: Any) -> Settings:
        tag = uuid.uuid4().hex[:8]
        rule = ListenerRule(name="test", queue=f"t.{tag}.in", workflow=workflow,
                            batch_size=listener.pop("batch_size", 200),
                            max_wait_ms=listener.pop("max_wait_ms", 100),
                            backoff_ms=listener.pop("backoff_ms", (100, 200)), **listener)
        settings = Settings(
            blackboard_url=sqlite_url, broker_url=broker_url,
            workflows_dir=str(workflows_dir or REPO / "workflows"),
            listeners=(rule,),
            routers=(RouterRule(queue=f"t.{tag}.out", attributes=("text", "words")),) if out else (),
            node=f"test-{tag}")
        made.append(settings)
        return settings

    yield make
    for settings in made:
        names = []
        for rule in settings.listeners:
            names += [rule.queue, dlq_name(rule.queue)]
            names += [f"{rule.queue}.retry.{i + 1}" for i in range(len(rule.backoff_ms))]
        names += [r.queue for r in settings.routers if r.queue]
        try:
            broker.delete(*names)
        except pika.exceptions.AMQPError:
            pass


@pytest.fixture
def run_service(spark: Any) -> Callable[..., Any]:
    """Run a Service on the session's SparkSession until a condition holds."""
    def run(settings: Settings, *, until: Callable[[Any], bool], idle_exit: float = 30.0,
            **kwargs: Any) -> Any:
        with Service(settings, spark=spark, **kwargs) as service:
            return service.run(until=until, idle_exit=idle_exit)
    return run
