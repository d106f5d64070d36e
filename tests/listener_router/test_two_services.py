"""Two service processes on one PostgreSQL and one queue: one leader, each record once."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from listener_router_helpers import (
    kill_group,
    message_ids_by_record,
    start_service,
    stored_counts,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from listener_router import ListenerRule, RouterRule, push_records

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.postgres]

RECORDS = 3000


def wait_until_committed(url: str, queue: str, n: int, explain: Any) -> None:
    """Wait until ``n`` messages of ``queue`` are committed (have their inbox rows)."""
    engine = create_engine(url, poolclass=NullPool)

    def committed() -> bool:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM chalk_inbox WHERE queue = :q"),
                                {"q": queue}).scalar() == n

    try:
        wait_until(committed, 60, "every message committed", explain=explain)
    finally:
        engine.dispose()


def test_two_services_share_the_work_and_the_survivor_of_the_leader_takes_over(
        tmp_path, broker_url, pg_url, qname, broker, make_settings):
    queue, out = qname("in"), qname("out")
    workflows = write_test_workflows(tmp_path / "workflows")
    configs, logs = {}, {}
    for name in ("svc-a", "svc-b"):
        configs[name] = write_config(
            tmp_path / f"{name}.toml", db=pg_url, broker=broker_url, workflows=workflows,
            blackboard={"lease_seconds": 6}, engine={"runner": "local"}, node={"name": name},
            listeners=[{"name": "count", "queue": queue, "workflow": "Counting",
                        "batch_size": 100, "max_wait_ms": 50, "prefetch": 300}],
            routers=[{"queue": out}])
        logs[name] = tmp_path / f"{name}.log"
    settings = make_settings("Counting", rules=(ListenerRule(name="count", queue=queue,
                                                             workflow="Counting"),),
                             routers=(RouterRule(queue=out),)).with_overrides(blackboard_url=pg_url)
    data = [{"id": f"t{i:05d}", "attributes": {}} for i in range(RECORDS)]

    first = start_service(configs["svc-a"], logs["svc-a"])
    wait_for_log(logs["svc-a"], " up: queues ")
    second = start_service(configs["svc-b"], logs["svc-b"])
    try:
        wait_for_log(logs["svc-b"], " up: queues ")
        wait_for_log(logs["svc-b"], "2 member(s) svc-a, svc-b, leader svc-a")
        push_records(settings, queue, data)
        wait_for_log(logs["svc-a"], "batch of ", 3)
        wait_for_log(logs["svc-b"], "batch of ", 3)  # both take work from the queue
        kill_group(first)  # the leader dies mid-run, its broker process with it
        # its heartbeat ages out (30 s): the survivor leads, and the failover frees the
        # records the leader held, which the survivor then commits: every message once
        wait_for_log(logs["svc-b"], "1 member(s) svc-b, leader svc-b", timeout=90)
        wait_until_committed(pg_url, queue, RECORDS,
                             explain=lambda: logs["svc-b"].read_text()[-3000:])
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0, logs["svc-b"].read_text()[-3000:]
    finally:
        kill_group(first)
        kill_group(second)

    assert broker.depth(queue) == 0  # everything acked, nothing left for a redelivery
    routed = message_ids_by_record(broker.drain(out))
    assert set(routed) == {r["id"] for r in data}
    assert all(len(ids) == 1 for ids in routed.values())  # copies only under one message ID
    assert stored_counts(pg_url, [r["id"] for r in data]) == {1: RECORDS}
