"""The broker connection in a child process: the AmqpLink surface, and the child's life."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from listener_router import BrokerUnavailable
from listener_router.broker import OutMessage, ProcessLink

pytestmark = [pytest.mark.broker]

REPO = Path(__file__).resolve().parents[2]


def _take(link: ProcessLink, n: int, timeout: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += link.deliveries.get_batch(n - len(got), timeout=0.5)
    return got


def _child_pid(link: ProcessLink) -> int:
    assert link._proc is not None
    return link._proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_messages_published_through_the_child_are_consumed_and_acked(broker, qname):
    queue = qname("in")
    broker.declare(queue)
    link = ProcessLink(broker.url, prefetch=500, consume=[queue]).start()
    try:
        sent = [OutMessage(routing_key=queue, body=f'{{"id": "r{i}"}}'.encode(), message_id=f"m{i}",
                           headers={"operation": "ADD", "n": i}) for i in range(250)]
        assert link.publish(sent).result(timeout=30) == 250
        got = _take(link, 250)
        assert sorted(d.message_id for d in got) == sorted(m.message_id for m in sent)
        first = next(d for d in got if d.message_id == "m7")
        assert (first.queue, first.body, first.headers["n"]) == (queue, b'{"id": "r7"}', 7)
        assert first.properties["routing_key"] == queue
        assert {d.generation for d in got} == {link.generation}
        link.ack(got)
        deadline = time.monotonic() + 10
        while broker.depth(queue) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        link.stop()
    assert broker.depth(queue) == 0  # acked: nothing came back when the connection closed


def test_a_child_that_dies_is_replaced_and_its_unacked_messages_come_again(broker, qname):
    queue = qname("in")
    broker.declare(queue)
    for i in range(5):
        broker.publish(queue, b"{}", message_id=f"m{i}")
    link = ProcessLink(broker.url, prefetch=100, consume=[queue]).start()
    try:
        before = _take(link, 5)
        old_generation, old_pid = link.generation, _child_pid(link)
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (link.generation == old_generation or not link.ready.is_set()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert link.ready.is_set() and link.generation > old_generation
        assert _child_pid(link) != old_pid
        link.ack(before)  # too late: those tags belonged to the dead child's connection
        again = _take(link, 5)
        assert sorted(d.message_id for d in again) == [f"m{i}" for i in range(5)]
        assert all(d.redelivered and d.generation == link.generation for d in again)
        link.ack(again)
    finally:
        link.stop()


def test_publishing_while_the_child_is_down_fails_at_once(broker, qname):
    link = ProcessLink(broker.url, consume=()).start()
    try:
        link._stopping = True  # keep it from being started again
        os.kill(_child_pid(link), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while link.ready.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        future = link.publish([OutMessage(routing_key=qname("x"), body=b"{}", message_id="m")])
        with pytest.raises(BrokerUnavailable) as caught:
            future.result(timeout=5)
    finally:
        link.stop()
    assert "not connected" in str(caught.value)


def test_an_unreachable_broker_is_reported_with_the_childs_error_and_log(caplog):
    link = ProcessLink("amqp://guest:guest@127.0.0.1:1/%2F", consume=())
    # (pika's own logger level too: `chalk`'s CLI, run by other tests here, quiets it)
    with caplog.at_level("WARNING"), caplog.at_level("WARNING", logger="pika"), \
            pytest.raises(BrokerUnavailable) as caught:
        link.start(wait=3)
    assert "not reachable" in str(caught.value)
    assert link.last_error  # what the child last saw, passed up
    assert link._proc is None or link._proc.poll() is not None  # stop() ended the child
    # the child's log lines (pika's, here), re-emitted in this process under their logger
    assert any("Connection refused" in r.getMessage() for r in caplog.records
               if r.name.startswith("pika."))


def test_the_child_dies_with_its_parent(broker):
    """SIGKILL of the service leaves no broker connection behind (unacked work is redelivered)."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from listener_router.broker import ProcessLink
        link = ProcessLink({broker.url!r}, consume=()).start()
        print(link._proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        parent.kill()
    assert not _alive(child)


def test_a_large_batch_is_written_joined_and_arrives_whole_and_in_order(broker, qname):
    """The child joins a batch's frames into few writes (``coalesce_output``): every
    message still arrives once, whole, in the order published; bodies larger than a
    frame and than a joined piece too."""
    queue = qname("in")
    broker.declare(queue)
    sizes = [10, 300, 5, 140_000, 1, 700_000, 2_000]
    sent = [OutMessage(routing_key=queue, body=(f"{i:06d}:".encode() + b"x" * sizes[i % len(sizes)]),
                       message_id=f"m{i}") for i in range(3000)]
    link = ProcessLink(broker.url, prefetch=3000, consume=[queue]).start()
    try:
        assert link.publish(sent).result(timeout=60) == len(sent)
        got = _take(link, len(sent), timeout=60)
        link.ack(got)
    finally:
        link.stop()
    assert [d.message_id for d in got] == [m.message_id for m in sent]
    assert all(d.body == m.body for d, m in zip(got, sent, strict=True))
