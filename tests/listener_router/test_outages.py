"""The database goes away mid-run: batches are held and retried; nothing is lost or doubled."""

from __future__ import annotations

import threading
import time

import pytest
from _services import start_postgres, stop_postgres
from listener_router_helpers import message_ids_by_record, stored_counts, write_test_workflows

from listener_router import push_records

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.postgres, pytest.mark.broker,
              pytest.mark.spark]

RECORDS = 2000


def test_database_outage_holds_batches_until_it_returns(make_settings, run_service, broker,
                                                        pg_url, tmp_path):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, batch_size=100)
    settings = settings.with_overrides(blackboard_url=pg_url)
    queue, out = settings.listeners[0].queue, settings.routers[0].queue
    data = [{"id": f"o{i:05d}", "attributes": {}} for i in range(RECORDS)]
    push_records(settings, queue, data)
    outage: dict[str, float] = {}

    def pull_the_plug(stats_source: list) -> None:
        while not stats_source or stats_source[0]["committed"] < 300:
            time.sleep(0.05)
        outage["down"] = time.monotonic()
        stop_postgres()
        time.sleep(4.0)
        start_postgres()
        outage["up"] = time.monotonic()

    seen: list = []

    def until(stats) -> bool:
        if not seen:
            seen.append(stats)
        return stats["committed"] >= RECORDS

    plug = threading.Thread(target=pull_the_plug, args=(seen,), daemon=True)
    plug.start()
    stats = run_service(settings, until=until, idle_exit=120)
    plug.join(timeout=60)

    assert "up" in outage, "the outage never happened"
    assert stats["committed"] == RECORDS
    assert stats["deferred"] > 0  # batches were held while the database was gone
    assert broker.depth(f"{queue}.dlq") == 0
    routed = message_ids_by_record(broker.drain(out))
    assert set(routed) == {r["id"] for r in data}
    assert all(len(ids) == 1 for ids in routed.values())
    assert stored_counts(pg_url, [r["id"] for r in data]) == {1: RECORDS}
