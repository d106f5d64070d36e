"""Fixtures for the listener/router: settings on unique queues, queue helpers, a service runner."""

from __future__ import annotations

import os
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


CHROMIUM = "/usr/bin/chromium"
# What works on this machine as root: without the background-networking flags the
# browser's own connections are refused many at a time.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def _browser_unavailable(message: str) -> None:
    if os.environ.get("CHALK_TEST_REQUIRE_SERVICES") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Headless chromium through playwright (a new empty profile; never a downloaded browser)."""
    if not os.access(CHROMIUM, os.X_OK):
        _browser_unavailable(f"{CHROMIUM} is missing (scripts/install.sh installs Debian's "
                             "chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        _browser_unavailable(f"playwright is not installed (pip install -e '.[dev]'): {e}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
