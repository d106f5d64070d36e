"""Flow control an operator can trust: pause and resume, priorities, rate limits, order per
key, cancellation — kept in the store, obeyed by every member, across restarts."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from listener_router_helpers import (
    kill_group,
    start_service,
    stored_attributes,
    stored_counts,
    wait_until,
    write_config,
    write_test_workflows,
)

from blackboard import RecordLockedError
from listener_router import (
    BatchObserver,
    ConfigError,
    ListenerRule,
    RouterRule,
    Service,
    Settings,
    push_records,
)
from listener_router.broker import AmqpLink, OutMessage
from listener_router.cli import main
from listener_router.pipeline import OUTRANKED_BATCH, Cancelled, InFlight, TokenBucket
from listener_router.store import Cancellation

# -- the pieces ---------------------------------------------------------------------------


def test_rules_on_one_queue_agree_on_its_lane_keys():
    settings = Settings(listeners=(ListenerRule(name="a", queue="q", priority=2),
                                   ListenerRule(name="b", queue="q", priority=1)))
    assert "rules on queue 'q' give priority 1 and 2" in (settings.problem() or "")


def test_a_token_bucket_keeps_the_rate_whatever_the_batch_sizes():
    bucket = TokenBucket(100.0)
    assert bucket.wait() == 0
    bucket.take(250)                  # a batch larger than a second's worth
    assert 1.4 < bucket.wait() < 1.6  # it pays for it before the next one
    bucket.set_rate(50.0)
    assert bucket.wait() > 2.9


def test_a_cancellation_matches_by_message_by_tick_and_by_record_until_it_ends():
    from listener_router import parse_message

    def message(mid: str, *ids: str):
        body = json.dumps({"records": [{"id": i} for i in ids]}).encode()
        return parse_message(body, queue="q", message_id=mid, headers={})

    cancelled = Cancelled()
    now = time.time()
    cancelled.update([Cancellation(1, "message", "m1", now, None, "ops"),
                      Cancellation(2, "prefix", "schedule:nightly:2026-11-27T02:00:00Z:", now,
                                   None, None),
                      Cancellation(3, "record", "r9", now, now + 60, None),
                      Cancellation(4, "record", "r8", now - 120, now - 60, None)])
    assert "by ops" in (cancelled.reason(message("m1", "r1")) or "")
    assert cancelled.reason(message("schedule:nightly:2026-11-27T02:00:00Z:3", "r1"))
    assert cancelled.reason(message("schedule:nightly:2026-11-28T02:00:00Z:3", "r1")) is None
    assert cancelled.reason(message("m2", "r1", "r9"))
    assert cancelled.reason(message("m3", "r8")) is None      # that one ended


def test_an_ordered_key_is_taken_in_order_and_a_retry_takes_its_own_hold_over():
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    woken: list[str] = []
    retry = ("hold", "m1")
    inflight.reserve([("order", "q", "k")], retry)                 # m1 waits for its retry
    assert not inflight.take_or_park([("order", "q", "k")], "b1", "m2", woken.extend,
                                     mine=("hold", "m2"))
    assert inflight.take_or_park([("order", "q", "k")], "b2", "m1", woken.extend,
                                 mine=retry)                        # its retry copy goes first
    inflight.release([("order", "q", "k")])
    assert woken == ["m2"]
    # A free key with a message waiting for it is not free for a newcomer.
    assert not inflight.take_or_park([("order", "q", "k")], "b4", "m5", woken.extend)
    assert inflight.take_or_park([("other", "j")], "b4", "m6", woken.extend)


# -- with a service -----------------------------------------------------------------------


class Lanes(BatchObserver):
    def __init__(self) -> None:
        self.seen: list[tuple[str, float, int]] = []
        self.sizes: list[tuple[str, float, float, int]] = []  # lane, opened, finished, messages
        self.changed = threading.Condition()

    def batch_finished(self, report):
        with self.changed:
            self.seen.append((report.lane, time.monotonic(), report.states()["committed"]))
            self.sizes.append((report.lane, report.opened, time.time(), report.messages))
            self.changed.notify_all()

    def committed(self, lane: str) -> int:
        return sum(n for q, _at, n in self.seen if q == lane)


@pytest.mark.broker
@pytest.mark.slow
def test_a_high_lane_is_served_first_and_a_low_lane_still_progresses(
        tmp_path, make_settings, qname, declare, spark):
    workflows = write_test_workflows(tmp_path / "workflows")
    low, high = qname("low"), qname("high")
    settings = make_settings(workflows_dir=workflows, rules=(
        ListenerRule(name="low", queue=low, workflow="Counting", max_wait_ms=20),
        ListenerRule(name="high", queue=high, workflow="Counting", priority=5, max_wait_ms=5)),
        routers=(RouterRule(queue=qname("out")),))
    declare(settings)
    tag = uuid.uuid4().hex[:6]
    backlog = [{"id": f"l{tag}-{i}", "attributes": {"n": i}} for i in range(20_000)]
    push_records(settings, low, backlog)
    lanes = Lanes()
    latencies: list[float] = []

    def offer(service: Service) -> None:
        for i in range(40):
            rid = f"h{tag}-{i}"
            started = time.monotonic()
            push_records(settings, high, [{"id": rid, "attributes": {"n": i}}])
            with lanes.changed:  # committed (and acked) when its batch is finished
                assert lanes.changed.wait_for(lambda i=i: lanes.committed(high) > i, 60)
            latencies.append(time.monotonic() - started)

    with Service(settings, spark=spark, observers=[lanes]) as service:
        producer = threading.Thread(target=offer, args=(service,))
        producer.start()
        service.run(until=lambda s: not producer.is_alive(), idle_exit=120)
        producer.join()
    latencies.sort()
    low_done = lanes.committed(low)
    assert len(latencies) == 40
    # The high lane's messages do not wait behind the low lane's backlog: each is
    # committed within about a batch of its own, not after 20,000 others.
    assert latencies[int(len(latencies) * 0.99) - 1] < 5.0, latencies
    assert low_done > 0                       # and the low lane was not starved meanwhile
    # Outranked, the low lane gathers small batches (their commit and publish end soon).
    first_high = min(done for lane, _o, done, _m in lanes.sizes if lane == high)
    later = [m for lane, opened, _d, m in lanes.sizes if lane == low and opened > first_high]
    assert later and max(later) <= OUTRANKED_BATCH, later


@pytest.mark.broker
@pytest.mark.slow
def test_pause_holds_a_backlog_across_a_kill_and_resume_commits_it_once(
        tmp_path, broker_url, qname, broker, make_settings, capsys):
    queue, out = qname("in"), qname("out")
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    log = tmp_path / "service.log"
    config = write_config(tmp_path / "chalk.toml", db=db, broker=broker_url,
                          workflows=write_test_workflows(tmp_path / "workflows"),
                          engine={"runner": "local"},
                          listeners=[{"name": "in", "queue": queue, "workflow": "Counting",
                                      "batch_size": 50}],
                          routers=[{"queue": out}])
    settings = make_settings("Counting", rules=(ListenerRule(name="in", queue=queue,
                                                             workflow="Counting"),),
                             routers=(RouterRule(queue=out),)).with_overrides(blackboard_url=db)
    ids = [f"p{i:04d}" for i in range(400)]
    assert main(["queue", "pause", queue, "--reason", "maintenance", "--config",
                 str(config)]) == 0
    push_records(settings, queue, [{"id": rid, "attributes": {}} for rid in ids])

    proc = start_service(config, log)
    wait_for_log_text(log, "consuming")
    time.sleep(3)
    assert stored_counts(db, ids) == {None: 400}          # paused: nothing taken
    assert broker.depth(queue) == 400                     # the messages wait in RabbitMQ
    kill_group(proc)

    proc = start_service(config, log)                     # started again: still paused
    wait_for_log_text(log, "consuming", count=2)
    time.sleep(2)
    assert stored_counts(db, ids) == {None: 400}
    capsys.readouterr()
    assert main(["queue", "list", "--json", "--config", str(config)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["paused"] and row["reason"] == "maintenance"

    assert main(["queue", "resume", queue, "--config", str(config)]) == 0
    wait_until(lambda: _counts(db, ids) == {1: 400}, 120, "everything committed")
    kill_group(proc, 15)
    assert proc.wait(timeout=60) == 0
    assert len(broker.drain(out)) == 400                  # each routed once


def _counts(db: str, ids: list[str]):
    try:
        return stored_counts(db, ids)
    except RecordLockedError:  # the service is at work on some of them
        return None


def wait_for_log_text(log: Path, text: str, count: int = 1, timeout: float = 120) -> None:
    wait_until(lambda: log.exists() and log.read_text(errors="replace").count(text) >= count,
               timeout, f"{text!r} in the service's log",
               explain=lambda: log.read_text(errors="replace")[-3000:] if log.exists() else "")


def _publish(settings: Settings, queue: str, messages: list[tuple[str, dict]]) -> None:
    """Publish (message ID, body) pairs to ``queue`` with confirms, in order."""
    link = AmqpLink(settings.broker_url, consume=()).start()
    try:
        link.publish([OutMessage(routing_key=queue, message_id=mid,
                                 body=json.dumps(body).encode())
                      for mid, body in messages]).result(timeout=60)
    finally:
        link.stop()


@pytest.mark.broker
@pytest.mark.slow
def test_cancelled_messages_are_acked_without_running_before_and_after_a_restart(
        tmp_path, make_settings, declare, spark, capsys):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, max_wait_ms=20)
    declare(settings)
    queue = settings.listeners[0].queue
    tag = uuid.uuid4().hex[:6]
    config = tmp_path / "chalk.toml"
    config.write_text(f'[blackboard]\nurl = "{settings.blackboard_url}"\n')
    ids = [f"c{tag}-{i}" for i in range(6)]
    push_records(settings, queue, [{"id": rid, "attributes": {}} for rid in ids], store=True)
    # Cancel two by message ID and one by record before anything runs.
    with Service(settings, spark=spark) as service:
        pass  # the tables exist
    mids = {}
    for rid in ids:  # the message IDs chalk push made are in the queue; publish our own too
        mids[rid] = f"m{tag}-{rid}"
    _publish(settings, queue, [(mids[rid], {"records": [{"id": rid, "attributes": {"x": 1}}]})
                               for rid in ids])
    # published by another program: Chalk does not know them, so --ahead says they exist
    assert main(["jobs", "cancel", mids[ids[0]], mids[ids[1]], "--config", str(config)]) == 2
    assert "--ahead" in capsys.readouterr().err
    assert main(["jobs", "cancel", mids[ids[0]], mids[ids[1]], "--ahead", "--config",
                 str(config)]) == 0
    assert main(["jobs", "cancel", "--record", ids[2], "--config", str(config)]) == 0
    with Service(settings, spark=spark) as service:
        service.run(until=lambda s: s["committed"] + s["cancelled"] >= 12, idle_exit=60)
    counts = stored_attributes(settings.blackboard_url, ids, ["count"])
    # ids[0] and ids[1]: their pushed message committed, ours was cancelled; ids[2]: both
    # messages name the cancelled record; the others: both committed.
    assert [counts[rid].get("count") for rid in ids] == [1, 1, None, 2, 2, 2]
    assert service.stats["cancelled"] == 4
    assert main(["jobs", "--state", "cancelled", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    assert shown.count("cancelled") >= 4
    # A redelivery of a cancelled message (after a restart) is dropped again.
    _publish(settings, queue, [(mids[ids[0]], {"records": [{"id": ids[0]}]})])
    with Service(settings, spark=spark) as service:
        service.run(until=lambda s: s["cancelled"] >= 1, idle_exit=60)
    assert stored_attributes(settings.blackboard_url, [ids[0]], ["count"])[ids[0]] == \
        {"count": 1}
    with pytest.raises(ConfigError):
        from listener_router.cli._flow import cancel
        cancel(settings)


GATED = """<?xml version="1.0"?>
<process name="Gated" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="gate">
      <proc:pipelet class="gated_pipelets.Gate"/>
      <proc:configuration><proc:param name="dir">{dir}</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="mark">
      <proc:pipelet class="gated_pipelets.Mark"/>
      <proc:configuration><proc:param name="dir">{dir}</proc:param></proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""
GATED_PIPELETS = '''
import os
import time

from pipelets import Pipelet


class Gate(Pipelet):
    """Says it started, then waits (at most a minute) until the test opens the gate."""

    parameters = frozenset({"dir"})

    def process(self, blackboard, ids):
        folder = self.config["dir"]
        open(os.path.join(folder, "started"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(folder, "open")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return ids


class Mark(Pipelet):
    """Leaves a file per record outside the blackboard: what a cancelled message must not do."""

    parameters = frozenset({"dir"})

    def process(self, blackboard, ids):
        for rid in ids:
            open(os.path.join(self.config["dir"], "ran-" + rid), "w").close()
            blackboard.set_literal(rid, "marked", True)
        return ids
'''


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.parametrize("runner", ["spark", "local"])
def test_a_message_cancelled_while_it_runs_ends_before_its_next_pipelet(
        tmp_path, make_settings, declare, spark, caplog, runner):
    """In flight: the pipelet running finishes, the next one never gets the cancelled
    message's records, nothing of it is committed; its neighbour in the batch goes on."""
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    gate = tmp_path / "gate"
    gate.mkdir()
    (workflows / "gated.xml").write_text(GATED.format(dir=gate))
    (workflows / "gated_pipelets.py").write_text(GATED_PIPELETS)
    settings = make_settings("Gated", workflows_dir=workflows, max_wait_ms=500,
                             routers=()).with_overrides(runner=runner, local_below=0)
    declare(settings)
    queue = settings.listeners[0].queue
    config = tmp_path / "chalk.toml"
    config.write_text(f'[blackboard]\nurl = "{settings.blackboard_url}"\n')
    tag = uuid.uuid4().hex[:6]
    stop, go = f"g{tag}-stop", f"g{tag}-go"
    caplog.set_level("INFO", logger="listener_router.pipeline._execute")
    with Service(settings, spark=spark) as service:
        ran = threading.Thread(target=service.run, kwargs={
            "until": lambda s: s["committed"] + s["cancelled"] >= 2, "idle_exit": 90})
        ran.start()
        try:
            _publish(settings, queue, [(f"m-{rid}", {"records": [{"id": rid, "attributes": {"x": 1}}]})
                                       for rid in (stop, go)])
            wait_until(lambda: (gate / "started").exists(), 120, "the gate pipelet running")
            assert main(["jobs", "cancel", f"m-{stop}", "--ahead", "--config",
                         str(config)]) == 0
            wait_until(lambda: "cancelled while they run" in caplog.text, 30,
                       "the runner told of the cancellation")
        finally:
            (gate / "open").touch()
            ran.join(120)
    assert not ran.is_alive()
    assert (service.stats["committed"], service.stats["cancelled"]) == (1, 1)
    assert (gate / f"ran-{go}").exists()
    assert not (gate / f"ran-{stop}").exists()   # the pipelet after the cancel never ran it
    stored = stored_attributes(settings.blackboard_url, [stop, go], ["marked"])
    assert stored == {stop: None, go: {"marked": True}}  # nothing of the cancelled one kept
