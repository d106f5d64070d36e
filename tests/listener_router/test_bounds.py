"""Bounded by bytes, on a real ``chalk run`` and RabbitMQ: a flood of 900 KB messages keeps the
service's memory within what it holds idle plus its listener rule's ``max_inflight_bytes``
and a margin, and nothing is lost; a full dead-letter queue refuses more
(``x-max-length-bytes`` with ``reject-publish``) and the service holds what it could not
dead-letter until there is room."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace

import pika
import pytest
from listener_router_helpers import (
    start_service,
    stop_service,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)

from blackboard import SqlStore
from listener_router import load_settings
from listener_router.broker import declare_all, dlq_name
from listener_router.broker._bytes import ByteBudget
from listener_router.dead_letters import dead_letters

MESSAGES = 400
BODY = 900 * 1024
CAP = 64 << 20
MARGIN = 100 << 20   # above the idle service and the cap: a batch's bodies being let go, buffers


def _memory(root: int) -> tuple[int, int]:
    """``(pss, rss)``: the proportional set size of process ``root`` and every process under
    it (its broker I/O process, its workers' supervisor and workers: pages they share
    counted once), and the resident size of ``root`` with its broker I/O process (where
    message bodies are held)."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    commands[int(entry)] = f.read().decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue   # gone meanwhile
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [child for child, parent in parents.items() if parent == pid]

    def field(pid: int, name: str, source: str) -> int:
        try:
            with open(f"/proc/{pid}/{source}") as f:
                return next((int(line.split()[1]) * 1024 for line in f
                             if line.startswith(name)), 0)
        except OSError:
            return 0

    pss = sum(field(pid, "Pss:", "smaps_rollup") for pid in tree)
    bodies = [pid for pid in tree if pid == root or "broker._child" in commands.get(pid, "")]
    return pss, sum(field(pid, "VmRSS:", "status") for pid in bodies)


def _idle(config: os.PathLike[str], log: os.PathLike[str]) -> tuple[int, int]:
    """:func:`_memory` of a service with ``config`` that is up and has nothing to do (the
    most of a few samples over a second)."""
    service = start_service(config, log)
    try:
        wait_for_log(log, " up: queues ")
        samples = []
        for _ in range(5):
            time.sleep(0.2)
            samples.append(_memory(service.pid))
    finally:
        stop_service(service)
    return max(pss for pss, _ in samples), max(rss for _, rss in samples)


def _flood(url: str, queue: str) -> None:
    """``MESSAGES`` bodies of 900 KB, each one small record and padding, confirmed."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for i in range(MESSAGES):
            body = json.dumps({"records": [{"id": f"flood-{i:04d}", "attributes": {}}],
                               "padding": "x" * BODY})[:BODY - 2] + '"}'
            channel.basic_publish("", queue, body.encode(), pika.BasicProperties(
                delivery_mode=2, message_id=f"flood-{i}"))
    finally:
        conn.close()


@pytest.mark.slow
def test_a_flood_of_900_kb_messages_stays_within_max_inflight_bytes(tmp_path, broker,
                                                                    broker_url, qname):
    folder = write_test_workflows(tmp_path / "workflows")
    queue, out = qname("in"), qname("out")
    db = tmp_path / "chalk.db"
    config = write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{db}", broker=broker_url, workflows=folder,
        engine={"runner": "local"},
        listeners=[{"name": "f", "queue": queue, "workflow": "Counting", "prefetch": 5000,
                    "max_inflight_bytes": CAP, "create_missing": True}],
        routers=[{"queue": out}])
    # the flood waits in the queue before the service starts: a backlog the broker would
    # hand over at once, up to the prefetch (5000 x 900 KB)
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        declare_all(connection, load_settings(config, env={}))
    finally:
        connection.close()
    idle = _idle(config, tmp_path / "idle.log")   # the service up, its queue still empty
    _flood(broker_url, queue)
    log = tmp_path / "service.log"
    service = start_service(config, log)
    peak_pss = peak_rss = 0
    try:
        def done() -> bool:
            nonlocal peak_pss, peak_rss
            pss, rss = _memory(service.pid)
            peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
            return broker.depth(out) >= MESSAGES

        wait_until(done, 300, f"{MESSAGES} messages routed", every=0.1,
                   explain=lambda: log.read_text()[-3000:])
    finally:
        stop_service(service)
    print(f"flood of {MESSAGES} x 900 KB: the service's processes peaked at {peak_pss / 1e6:.0f} "
          f"MB (PSS, workers too; {idle[0] / 1e6:.0f} idle), its process and broker process at "
          f"{peak_rss / 1e6:.0f} MB (RSS; {idle[1] / 1e6:.0f} idle); bound: idle + "
          f"{(CAP + MARGIN) / 1e6:.0f} MB")
    assert peak_pss <= idle[0] + CAP + MARGIN and peak_rss <= idle[1] + CAP + MARGIN, \
        (peak_pss, peak_rss, idle)
    # nothing lost: every record committed once, no dead letter, the input empty
    assert broker.depth(queue) == 0 and broker.depth(dlq_name(queue)) == 0
    store = SqlStore(f"sqlite:///{db}")
    try:
        assert store.record_count() == MESSAGES
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_full_dead_letter_queue_refuses_and_the_service_holds_until_there_is_room(
        make_settings, run_service, broker, broker_url, declare, tmp_path, caplog):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = replace(make_settings("Fragile", workflows_dir=workflows, max_retries=0,
                                     batch_size=5),
                       runner="local", max_dead_letter_bytes=3000)
    # the leader does not empty Q.dlq on its own here: the test makes room when it is time
    settings = settings.with_section("dead_letters", replace(
        settings.section("dead_letters"), move_every=0))
    queue = settings.listeners[0].queue
    declare(settings)
    # the broker holds Q.dlq to its bound: past it, a publish is refused (a nack)
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", dlq_name(queue), b'{"id": "early"}' + b" " * 4000,
                              pika.BasicProperties(message_id="early", delivery_mode=2))
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", dlq_name(queue), b'{"id": "refused"}',
                                  pika.BasicProperties(message_id="refused", delivery_mode=2))
    finally:
        connection.close()
    for i in range(20):
        broker.publish(queue, json.dumps({"id": f"bad-{i}", "attributes": {
            "fail": True, "note": "n" * 1000}}), message_id=f"bad-{i}")
    caplog.set_level(logging.WARNING)
    ids: set[str] = set()

    def until(_stats: object) -> bool:
        # once refused, chalk dlq moves Q.dlq into the store: room again
        if "the broker refused a message (nack)" in caplog.text:
            ids.update(d.message_id for d in dead_letters(settings, [queue]))
        return len(ids) >= 21

    started = time.monotonic()
    run_service(settings, until=until, idle_exit=120)
    assert time.monotonic() - started < 120
    # the service's dead letters were refused too, and held until there was room: none lost
    assert "the broker refused a message (nack)" in caplog.text
    assert ids == {"early"} | {f"bad-{i}" for i in range(20)}
    assert broker.depth(queue) == 0


def test_a_consumer_is_made_with_the_prefetch_that_fits_its_bound():
    budget = ByteBudget({"q": 64 << 20}, assumed=1 << 20)
    assert budget.prefetch("q", 5000) == 64            # nothing seen yet: bodies of 1 MiB
    assert budget.prefetch("other", 5000) == 5000      # no bound
    for tag in range(1, 11):
        assert not budget.delivered(tag, "q", 200)
    # small bodies: once all are settled, a consumer twice as wide fits
    assert budget.settled(range(1, 10), 5000) == []
    assert budget.settled([10], 5000) == ["q"]
    assert budget.prefetch("q", 5000) == 5000


def test_a_queue_past_its_bound_or_sent_a_larger_body_stops_until_half_is_settled():
    budget = ByteBudget(10_000, assumed=1000)
    assert budget.prefetch("q", 100) == 10
    assert [budget.delivered(t, "q", 1000) for t in range(1, 11)] == [False] * 10
    assert budget.delivered(11, "q", 1000) is True       # 11,000 bytes: over the bound
    assert budget.settled(range(1, 6), 100) == []        # 6,000 held: not yet half
    assert budget.settled([6], 100) == ["q"]             # 5,000: consumed again
    assert budget.prefetch("q", 100) == 5                # what fits the room left
    assert budget.delivered(12, "q", 4000) is True       # larger than it was sized for
    assert budget.held("q") == 9000
    budget.reset()
    assert budget.held("q") == 0 and not budget.stopped
