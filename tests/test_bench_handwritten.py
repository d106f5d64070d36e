"""The hand-written baseline of bench_listener does all of its work, exactly once.

A baseline that silently did less (dropped a record, skipped the inbox, acked
before the confirms) would make every ratio against it worthless: these run it
against the real broker and count.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pytest
from sqlalchemy import select
from test_bench_web import assert_web_work_done, worked
from test_docs import code_blocks

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
hand = importlib.import_module("bench_handwritten")

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def publish(url: str, queue: str, messages: list[tuple[str, bytes]]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for mid, body in messages:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, message_id=mid))
    conn.close()


def drain(url: str, queue: str) -> list[tuple[str, dict[str, Any]]]:
    """Every message in ``queue``: (message ID, body)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    out = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append((props.message_id, json.loads(body)))
    conn.close()
    return out


def stored(db: Path) -> dict[str, dict[str, Any]]:
    with hand.open_store(db).connect() as conn:
        return {i: json.loads(d) for i, d in conn.execute(select(hand.records.c.id, hand.records.c.data))}


def ids_message(first: int, per: int) -> bytes:
    return json.dumps({"records": [{"id": f"r{i}"} for i in range(first, first + per)]}).encode()


def queues(amqp_queues: Any) -> tuple[str, str]:
    src, dst = amqp_queues("in"), amqp_queues("out")
    hand.declare(amqp_queues.url, "quorum", src, dst)
    return src, dst


def test_every_record_counts_once_and_every_input_routes_once(amqp_queues: Any,
                                                             tmp_path: Path) -> None:
    url, db = amqp_queues.url, tmp_path / "hand.db"
    src, dst = queues(amqp_queues)
    with hand.open_store(db).begin() as conn:  # half the records stored before, at 5
        conn.execute(hand.records.insert(), [{"id": f"r{i}", "data": json.dumps({"n1": 5, "n2": 5, "n3": 5})}
                                             for i in range(0, 900, 2)])
    messages = [(f"m{m}", ids_message(m * 3, 3)) for m in range(300)]
    publish(url, src, messages + messages[:20])  # 20 delivered twice: the inbox drops them
    c = hand.Consumer(url, src, dst, db, batch=64, work="counters", idle_exit=1.0).run()
    assert c.acked == 320
    records = stored(db)
    assert len(records) == 900
    for i in range(900):
        start = 5 if i % 2 == 0 else 0
        assert records[f"r{i}"] == {f"n{k}": start + 1 for k in (1, 2, 3)}, i
    routed = drain(url, dst)
    by_id = Counter(mid for mid, _body in routed)
    assert len(by_id) == 900                        # one outgoing message per record …
    assert {n for n in by_id.values()} <= {1, 2}    # … sent again only for the 20 repeats
    assert sum(by_id.values()) == 900 + 20 * 3
    assert hand.depth(url, src) == 0


def test_the_steps_are_those_of_the_user_pipelets(amqp_queues: Any, tmp_path: Path) -> None:
    url, db = amqp_queues.url, tmp_path / "hand.db"
    src, dst = queues(amqp_queues)
    publish(url, src, [(f"m{m}", hand.body_for(m * 4, sent=12.5, per_message=4)) for m in range(50)])
    hand.Consumer(url, src, dst, db, work="text", messages=50).run()
    records = stored(db)
    assert len(records) == 200
    text = "some text number 17 with words"  # "  Some   TEXT number 17  with words "
    assert records["b0000017"] == {"text": text, "words": 6, "sent": 12.5,
                                   "hash": hashlib.sha256(text.encode()).hexdigest()}
    routed = drain(url, dst)
    assert len(routed) == len({mid for mid, _ in routed}) == 200
    assert ("m4/b0000017", {"records": [{"id": "b0000017", "attributes": {"words": 6, "sent": 12.5}}]}) in routed


def test_a_message_committed_but_not_sent_sends_its_outgoing_ones_when_it_comes_back(
        amqp_queues: Any, tmp_path: Path) -> None:
    """The crash between the commit and the confirms: the inbox holds the message, the
    output queue lacks its outgoing messages; its redelivery sends them, changes nothing."""
    url, db = amqp_queues.url, tmp_path / "hand.db"
    src, dst = queues(amqp_queues)
    messages = [(f"m{m}", ids_message(m * 2, 2)) for m in range(100)]
    publish(url, src, messages)
    hand.Consumer(url, src, dst, db, work="counters", messages=100).run()
    first = sorted(drain(url, dst))                 # the outputs "lost" with the crash
    publish(url, src, messages)                     # the inputs, redelivered
    hand.Consumer(url, src, dst, db, work="counters", messages=100).run()
    assert sorted(drain(url, dst)) == first         # the same IDs and bodies, once more
    assert all(r == {"n1": 1, "n2": 1, "n3": 1} for r in stored(db).values())


@pytest.mark.chaos
def test_exactly_once_in_effect_across_kill_9(amqp_queues: Any, tmp_path: Path) -> None:
    url, db = amqp_queues.url, tmp_path / "hand.db"
    src, dst = queues(amqp_queues)
    n, per = 6000, 2
    publish(url, src, [(f"m{m}", ids_message(m * per, per)) for m in range(n)])
    script = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_handwritten as h; "
              f"h.Consumer({url!r}, {src!r}, {dst!r}, {str(db)!r}, batch=50, work='counters', "
              f"idle_exit=float(sys.argv[1])).run()")
    kills = 0
    for share in (0.2, 0.5):                       # killed twice as it works, then let finish
        child = subprocess.Popen([sys.executable, "-c", script, "60"])
        deadline = time.monotonic() + 120
        while hand.depth(url, dst) < share * n * per and child.poll() is None:
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.01)
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            kills += 1
        child.wait(timeout=30)
    assert kills >= 1
    subprocess.run([sys.executable, "-c", script, "1.5"], check=True, timeout=300)
    records = stored(db)
    assert len(records) == n * per
    assert all(r == {"n1": 1, "n2": 1, "n3": 1} for r in records.values())
    by_id = Counter(mid for mid, _body in drain(url, dst))
    assert len(by_id) == n * per                    # every record routed; repeats keep their ID
    assert set(by_id) == {f"m{i // per}/r{i}" for i in range(n * per)}
    assert hand.depth(url, src) == 0


def test_measure_runs_the_consumer_in_a_process_of_its_own(broker_url: str, tmp_path: Path) -> None:
    one = hand.measure(broker_url, 300, 2, db=tmp_path / "hand.db")
    assert (one["messages"], one["records"]) == (300, 600)
    assert one["rate"] > 0 and one["cpu_us"]["hand-written"] > 0
    assert len(stored(tmp_path / "hand.db")) == 600


# -- the work-bound bench: --work real, --processes N ----------------------------------------

def test_the_real_work_strips_detects_and_fingerprints_each_page(amqp_queues: Any,
                                                                  tmp_path: Path) -> None:
    url, db = amqp_queues.url, tmp_path / "hand.db"
    src, dst = queues(amqp_queues)
    publish(url, src, [(f"m{m}", hand.body_for(m * 2, sent=12.5, per_message=2, work="real"))
                       for m in range(30)])
    hand.Consumer(url, src, dst, db, work="real", messages=30).run()
    records = stored(db)
    assert len(records) == 60
    assert_web_work_done(records, range(60))
    routed = dict(drain(url, dst))
    assert len(routed) == 60
    record = worked(7)
    assert routed["m3/b0000007"] == {"records": [{"id": "b0000007", "attributes": {
        "language": record["language"], "fingerprint": record["fingerprint"], "sent": 12.5}}]}


def shared_consumer(db: Path, **kwargs: Any) -> Any:
    """A consumer that shares ``db`` with others, for its commit alone (it never connects)."""
    return hand.Consumer("amqp://unused", "in", "out", db, work="counters", shared=True, **kwargs)


def test_a_record_another_consumer_wrote_meanwhile_is_worked_again_from_what_it_wrote(
        tmp_path: Path) -> None:
    """The shared commit, interleaved by hand: A reads, B commits, A writes."""
    db = tmp_path / "hand.db"
    a, b = shared_consumer(db), shared_consumer(db)
    outgoing: dict[str, Any] = {}
    fresh, seen = a._read([(1, "ma", ids_message(0, 2))], outgoing)   # r0, r1
    docs, rows = a._apply(fresh, seen, outgoing)                       # the work, no lock
    b._commit([(1, "mb", ids_message(1, 1))])                          # r1, meanwhile
    with a.engine.begin() as conn:
        a._recheck(conn, fresh, seen, docs, rows, outgoing)
    assert stored(db) == {"r0": {"n1": 1, "n2": 1, "n3": 1}, "r1": {"n1": 2, "n2": 2, "n3": 2}}
    assert (a.redone, b.redone) == (1, 0)
    assert outgoing["ma"][1] == {"id": "r1", "attributes": {"n1": 2, "n2": 2, "n3": 2}}


def test_a_message_another_consumer_committed_meanwhile_is_not_applied_again(
        tmp_path: Path) -> None:
    db = tmp_path / "hand.db"
    a, b = shared_consumer(db), shared_consumer(db)
    outgoing: dict[str, Any] = {}
    fresh, seen = a._read([(1, "m", ids_message(0, 2)), (2, "n", ids_message(5, 1))], outgoing)
    docs, rows = a._apply(fresh, seen, outgoing)
    b._commit([(7, "m", ids_message(0, 2))])                           # its redelivery, there
    with a.engine.begin() as conn:
        a._recheck(conn, fresh, seen, docs, rows, outgoing)
    assert stored(db) == {f"r{i}": {"n1": 1, "n2": 1, "n3": 1} for i in (0, 1, 5)}
    assert [r["id"] for r in outgoing["m"]] == ["r0", "r1"]            # B's, from the inbox
    with hand.open_store(db).connect() as conn:
        assert sorted(conn.execute(select(hand.inbox.c.message_id)).scalars()) == ["m", "n"]


def test_two_consumers_on_one_queue_and_database_apply_every_message_once(
        amqp_queues: Any, tmp_path: Path) -> None:
    """Many messages over few records, repeats among them: two processes side by side
    lose no update and apply no message twice."""
    url, db = amqp_queues.url, tmp_path / "hand.db"
    src, dst = queues(amqp_queues)
    hand.open_store(db).dispose()
    messages = [(f"m{m}", ids_message(m % 40, 3)) for m in range(600)]  # r0 … r41
    publish(url, src, messages + messages[::10])       # 60 delivered twice
    config = {"url": url, "queue": src, "out": dst, "db": str(db), "batch": 20,
              "work": "counters", "idle_exit": 1.5, "shared": True}
    results, _ = hand.consume([config, config])       # both consuming before either starts
    acked = [r["acked"] for r in results]
    assert sum(acked) == 660 and min(acked) > 0, acked   # both took their share
    expected = Counter(f"r{m % 40 + k}" for m in range(600) for k in range(3))
    assert stored(db) == {i: {"n1": n, "n2": n, "n3": n} for i, n in expected.items()}
    by_id = Counter(mid for mid, _body in drain(url, dst))
    assert set(by_id) == {f"m{m}/r{m % 40 + k}" for m in range(600) for k in range(3)}
    assert sum(by_id.values()) == 1800 + 60 * 3             # repeats resend theirs, same IDs
    assert hand.depth(url, src) == 0


def test_measure_runs_two_processes_on_one_queue(broker_url: str, tmp_path: Path) -> None:
    one = hand.measure(broker_url, 600, 1, db=tmp_path / "hand.db", work="real", processes=2)
    assert (one["messages"], one["records"], one["processes"]) == (600, 600, 2)
    assert sum(one["acked"]) == 600 and min(one["acked"]) > 0, one["acked"]
    assert one["rate"] > 0
    assert one["cpu_us"]["hand-written 1"] > 0 and one["cpu_us"]["hand-written 2"] > 0
    assert_web_work_done(stored(tmp_path / "hand.db"), range(600))


def test_the_documented_hand_written_command_runs(broker_url: str, tmp_path: Path) -> None:
    """docs/performance.md's command, with fewer messages."""
    (block,) = [b for b in code_blocks(BENCH.parent / "docs" / "performance.md", "")
                if "bench/bench_handwritten.py --work real" in b]
    argv = shlex.split(block)
    assert argv[:2] == [".venv/bin/python", "bench/bench_handwritten.py"]
    figures = tmp_path / "figures.json"
    assert hand.main([*argv[2:], "--messages", "400", "--broker", broker_url,
                      "--json", str(figures)]) == 0
    (run,) = json.loads(figures.read_text())["runs"]
    assert (run["records"], run["processes"]) == (400, 2)
    assert set(run["cpu_us"]) >= {"hand-written 1", "hand-written 2"}
