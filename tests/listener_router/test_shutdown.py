"""SIGTERM finishes the batch in hand and exits 0; a second signal exits at once; nothing is lost or doubled,
and Spark's workers stop without a traceback."""

from __future__ import annotations

import signal
import time

import pytest
from listener_router_helpers import (
    message_ids_by_record,
    start_service,
    stored_counts,
    wait_for_log,
    write_config,
    write_test_workflows,
)

from listener_router import ListenerRule, RouterRule, push_records

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

RECORDS = 3000


def test_sigterm_under_load_loses_and_doubles_nothing(tmp_path, broker_url, qname, broker,
                                                     make_settings):
    queue, out = qname("in"), qname("out")
    workflows = write_test_workflows(tmp_path / "workflows")
    db = f"sqlite:///{tmp_path / 'shutdown.db'}"
    config = write_config(tmp_path / "chalk.toml", db=db, broker=broker_url, workflows=workflows,
                          listeners=[{"name": "count", "queue": queue, "workflow": "Counting",
                                      "batch_size": 200, "max_wait_ms": 100}],
                          routers=[{"queue": out}], spark={"master": "local[2]"})
    settings = make_settings("Counting", rules=(ListenerRule(name="count", queue=queue,
                                                             workflow="Counting"),),
                             routers=(RouterRule(queue=out),))
    settings = settings.with_overrides(blackboard_url=db)
    data = [{"id": f"s{i:05d}", "attributes": {}} for i in range(RECORDS)]
    push_records(settings, queue, data)
    log = tmp_path / "service.log"

    proc = start_service(config, log)
    wait_for_log(log, "batch of ", 2)
    proc.send_signal(signal.SIGTERM)  # to the service, as a supervisor does (not its JVM)
    started = time.monotonic()
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    print(f"\ngraceful stop took {time.monotonic() - started:.1f} s")
    after_first = broker.depth(out)

    proc = start_service(config, log)
    wait_for_log(log, " up: queues ", 2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    proc.wait(timeout=30)
    assert time.monotonic() - started < 10

    proc = start_service(config, log, "--idle-exit", "6")
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]

    routed = message_ids_by_record(broker.drain(out))
    assert 0 < after_first < RECORDS  # the first stop really came mid-run
    assert set(routed) == {r["id"] for r in data}
    # the hard second exit may publish a batch twice, but only under the same message IDs
    assert all(len(ids) == 1 for ids in routed.values())
    assert stored_counts(db, [r["id"] for r in data]) == {1: RECORDS}
    # three stops of Spark, one of them hard: no traceback of an idle worker's closed pipe
    assert "BrokenPipeError" not in log.read_text(errors="replace")
