"""The default batch policy end to end: listener rules with no batch keys.

Batches then take what is waiting (large under a backlog, small under a
trickle), small ones run on the service's own workers where the workflow's
pipelets declare ``runs_in_service``, and the rest on Spark.  Whatever
the sizes and places turn out to be, every message is processed exactly
once and a record's messages take effect in the order they were published.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from listener_router_helpers import stored_attributes

from listener_router import BatchObserver, ListenerRule, RouterRule, Settings
from listener_router.broker import AmqpLink, OutMessage

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

PIPELETS = '''
from pipelets import Pipelet


class AppendSeq(Pipelet):
    """Appends the record's "seq" (written from its message) to its "history" list."""

    runs_in_service = True

    def process_record(self, blackboard, rid):
        blackboard.add_literal(rid, "history", blackboard.get_literal(rid, "seq").value)


class AppendSeqOnSpark(AppendSeq):
    """The same, not declared for the service's workers: its batches run on Spark."""

    runs_in_service = False
'''

WORKFLOW = """<?xml version="1.0"?>
<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="append">
      <proc:pipelet class="adaptive_pipelets.{cls}"/>
    </proc:invokePipelet>
  </sequence>
</process>
"""


class Sizes(BatchObserver):
    """Every finished batch's size and where its workflows ran."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.runs: Counter[tuple[str, bool]] = Counter()

    def batch_finished(self, report: Any) -> None:
        self.sizes.append(report.messages)
        self.runs.update((run.workflow, run.local) for run in report.runs)


@pytest.fixture
def two_rules(tmp_path, qname, sqlite_url, broker_url, declare) -> Settings:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "adaptive_pipelets.py").write_text(PIPELETS)
    (folder / "here.xml").write_text(WORKFLOW.format(name="SeqHere", cls="AppendSeq"))
    (folder / "spark.xml").write_text(WORKFLOW.format(name="SeqSpark", cls="AppendSeqOnSpark"))
    settings = Settings(
        blackboard_url=sqlite_url, broker_url=broker_url, workflows_dir=str(folder),
        listeners=(ListenerRule(name="here", queue=qname("here"), workflow="SeqHere",
                                backoff_ms=(100, 200)),
                   ListenerRule(name="spark", queue=qname("spark"), workflow="SeqSpark",
                                backoff_ms=(100, 200))),
        routers=(RouterRule(queue=qname("out"), attributes=("seq",)),),
        node=f"test-{uuid.uuid4().hex[:6]}")
    assert all(rule.batch_size is None and rule.prefetch is None for rule in settings.listeners)
    declare(settings)
    return settings


def _message(queue: str, rid: str, seq: int) -> OutMessage:
    return OutMessage(routing_key=queue, message_id=f"{rid}-{seq}-{uuid.uuid4().hex[:6]}",
                      body=json.dumps({"records": [{"id": rid, "attributes": {"seq": seq}}]}).encode())


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def _publish(settings: Settings, messages: list[OutMessage]) -> None:
    link = AmqpLink(settings.broker_url, consume=()).start()
    try:
        for start in range(0, len(messages), 500):
            link.publish(messages[start:start + 500]).result(timeout=60)
    finally:
        link.stop()


def test_every_message_once_and_in_order_whatever_the_batches(two_rules, run_service, broker,
                                                              spark):
    from engine._warm import warm_workers

    warm = warm_workers(spark)
    starts = warm.starts
    here, spark = (rule.queue for rule in two_rules.listeners)
    expected: dict[str, list[int]] = {}
    burst: list[OutMessage] = []
    # A backlog: each record gets several messages in a row, so batches meet a record
    # again and must defer the later message to a later batch, in order.
    for seq in range(4):
        for k in range(150):
            for queue, prefix in ((here, "h"), (spark, "s")):
                rid = f"{prefix}{k}"
                burst.append(_message(queue, rid, seq))
                expected.setdefault(rid, []).append(seq)
    # Then a trickle: a few messages at a time while the service runs.
    trickle: list[list[OutMessage]] = []
    for step in range(40):
        group = []
        for j in range(3):
            queue, prefix = (here, "t") if j else (spark, "u")
            rid = f"{prefix}{step % 10}"
            seq = len(expected.setdefault(rid, []))
            group.append(_message(queue, rid, seq))
            expected[rid].append(seq)
        trickle.append(group)
    total = len(burst) + sum(len(g) for g in trickle)

    def offer() -> None:
        for group in trickle:
            _publish(two_rules, group)
            time.sleep(0.05)

    _publish(two_rules, burst)
    producer = threading.Thread(target=offer)
    sizes = Sizes()
    producer.start()
    try:
        stats = run_service(two_rules, until=lambda s: s["committed"] >= total, idle_exit=60,
                            observers=[sizes])
    finally:
        producer.join(timeout=120)

    assert stats["committed"] == total
    assert stats["dead"] == 0 and stats["retrying"] == 0
    # Every input message was routed once, under one output message.
    routed = broker.drain(two_rules.routers[0].queue)
    sources = Counter(props.headers["x-chalk-source"] for props, _body in routed)
    assert len(sources) == total and set(sources.values()) == {1}
    # Each record saw its messages once each, in the order they were published.
    stored = stored_attributes(two_rules.blackboard_url, sorted(expected), ["history"])
    wrong = {rid: history for rid, history in
             ((rid, _as_list((attrs or {}).get("history"))) for rid, attrs in stored.items())
             if history != expected[rid]}
    assert not wrong, dict(list(wrong.items())[:5])
    # Both places ran: the declared workflow's small batches here, the other's on Spark.
    assert sizes.runs[("SeqSpark", True)] == 0
    assert sizes.runs[("SeqSpark", False)] >= 1
    assert sizes.runs[("SeqHere", True)] >= 1
    # The Spark batches went to warm workers: fewer warm jobs than batches run.
    assert warm.starts - starts < sizes.runs[("SeqSpark", False)], (warm.starts - starts, sizes.runs)
    assert sum(sizes.sizes) >= total
    # And the batches changed size on the way: large under the backlog, a few messages
    # each under the trickle.
    assert max(sizes.sizes) >= 50 and min(sizes.sizes) <= 10, sizes.sizes


def test_a_redelivered_message_runs_on_the_service_workers_too(two_rules, run_service, broker):
    """Delivered again (its first delivery may have crashed a worker), a small batch still
    runs on the service's workers: a crash there costs a worker, never the service."""
    import pika

    from listener_router.broker import connection_parameters

    here = two_rules.listeners[0].queue
    _publish(two_rules, [_message(here, "rd", 0)])
    conn = pika.BlockingConnection(connection_parameters(two_rules.broker_url))
    method, _props, _body = conn.channel().basic_get(here, auto_ack=False)
    assert method is not None
    conn.close()  # unacked: delivered again, marked redelivered

    sizes = Sizes()
    stats = run_service(two_rules, until=lambda s: s["committed"] >= 1, observers=[sizes])
    assert stats["committed"] == 1
    assert sizes.runs == Counter({("SeqHere", True): 1})
    assert stored_attributes(two_rules.blackboard_url, ["rd"], ["history"]) == \
        {"rd": {"history": 0}}
