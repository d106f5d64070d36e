"""Scheduled jobs run by a real service: catch-up after a stop, a schedule feeding a
workflow, ``chalk schedules``, and the leader killed mid-run on PostgreSQL.

"Exactly once per tick" is checked where it is decided: every scheduled
message ID must have been written to the outbox exactly once (a tick run
twice would write its IDs twice), and every tick from the first to the last
must be there.  The queue is drained too, to see that what was written was
published.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest
from listener_router_helpers import (
    kill_group,
    start_service,
    stored_counts,
    wait_for_log,
    write_test_workflows,
)
from sqlalchemy import select

from blackboard import Blackboard
from listener_router import Service, load_settings
from listener_router.cli import main
from listener_router.jobs import JobLogTables
from listener_router.schedules import ScheduleRule, Schedules, Ticks, tick_label
from listener_router.store import ServiceStore
from listener_router.store._outbox import outbox

pytestmark = [pytest.mark.broker]


def scheduled_in_outbox(url: str, name: str) -> Counter:
    """How many times each of the schedule's message IDs was written to the outbox."""
    store = ServiceStore.connect(url)
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(select(outbox.c.messages)).scalars().all()
    finally:
        store.close()
    prefix = f"schedule:{name}:"
    return Counter(m[0] for text in rows for m in orjson.loads(text) if m[0].startswith(prefix))


def ticks_of(ids) -> dict[str, set[str]]:
    by_tick: dict[str, set[str]] = defaultdict(set)
    for mid in ids:
        _schedule, _name, rest = mid.split(":", 2)
        tick, number = rest.rsplit(":", 1)
        by_tick[tick].add(number)
    return by_tick


def seconds(first: str, last: str) -> list[str]:
    ticks = Ticks(ScheduleRule(name="x", every=1.0))
    start = time.mktime(time.strptime(first, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    end = time.mktime(time.strptime(last, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    out, t = [], start
    while t <= end:
        out.append(tick_label(t))
        t = ticks.after(t)
    return out


def _state(url: str, name: str):
    store = ServiceStore.connect(url)
    try:
        return store.tables(Schedules).read(name)
    finally:
        store.close()


def claimed_tick(url: str, name: str) -> float:
    """The last tick the schedule claimed (done or not)."""
    state = _state(url, name)
    return 0.0 if state is None else state.tick


def done_ticks(url: str, name: str) -> float:
    """The last finished tick of the schedule (0 before any)."""
    state = _state(url, name)
    if state is None or state.started_at is None:
        return 0.0
    return state.tick if state.done else state.tick - 1


@pytest.mark.slow
@pytest.mark.parametrize("catch_up", ["one", "none"])
def test_ticks_missed_while_no_member_lived_are_caught_up_as_configured(
        catch_up, make_settings, qname, broker):
    target = qname("sched")
    rule = ScheduleRule(name=f"every-second-{catch_up}", every=1.0, queue=target,
                        ids=("a", "b"), catch_up=catch_up)
    settings = make_settings("Demo").with_overrides(runner="local", schedules=(rule,))
    url = settings.blackboard_url

    with Service(settings) as service:
        started = service.membership.started_at
        service.run(until=lambda _s: done_ticks(url, rule.name) >= started + 3, idle_exit=60)
    stopped = claimed_tick(url, rule.name)   # a tick claimed but not done is finished later
    # no member lives for a while: ticks are missed
    while time.time() < stopped + 4.5:
        time.sleep(0.2)
    with Service(settings) as service:
        restarted = service.membership.started_at
        service.run(until=lambda _s: done_ticks(url, rule.name) >= restarted + 2, idle_exit=60)

    written = scheduled_in_outbox(url, rule.name)
    assert set(written.values()) == {1}
    by_tick = ticks_of(written)
    assert all(numbers == {"0", "1"} for numbers in by_tick.values())
    ticks = Ticks(rule)
    gap = [tick_label(t) for t in _range(ticks, stopped, restarted)]
    assert len(gap) >= 3
    run_in_gap = [t for t in gap if t in by_tick]
    assert run_in_gap == ([tick_label(ticks.before(restarted))] if catch_up == "one" else [])
    before = sorted(t for t in by_tick if t <= tick_label(stopped))
    after = sorted(t for t in by_tick if t > tick_label(ticks.before(restarted)))
    assert before == seconds(before[0], before[-1]) and len(before) >= 3
    assert after == seconds(after[0], after[-1]) and len(after) >= 2
    arrived = {p.message_id for p, _body in broker.drain(target)}
    assert arrived <= set(written) and len(arrived) >= len(written) - 2   # the last may be in flight


def _range(ticks: Ticks, start: float, end: float) -> list[float]:
    out, t = [], ticks.after(start)
    while t < end:
        out.append(t)
        t = ticks.after(t)
    return out


@pytest.mark.slow
def test_a_schedule_feeds_its_workflow_and_chalk_schedules_shows_it(tmp_path, broker_url, qname,
                                                                    capsys, monkeypatch):
    workflows = write_test_workflows(tmp_path / "workflows")
    queue, target, out = qname("in"), qname("sched"), qname("out")
    db = tmp_path / "chalk.db"
    config = tmp_path / "chalk.toml"
    config.write_text(f"""
[blackboard]
url = "sqlite:///{db}"
[broker]
url = "{broker_url}"
[workflows]
dir = "{workflows}"
[engine]
runner = "local"
[[listener]]
name = "main"
queue = "{queue}"
workflow = "Counting"
[[router]]
queue = "{out}"
[[schedule]]
name = "count-them"
every = "1s"
queue = "{target}"
workflow = "Counting"
ids = ["c1", "c2", "c3"]
batch_size = 2
""")
    settings = load_settings(config)
    url = settings.blackboard_url
    assert [(r.queue, r.workflow) for r in settings.listeners] == [(queue, "Counting"),
                                                                   (target, "Counting")]
    with Blackboard.connect(url) as bb:   # the listed records are stored ones
        for rid in ("c1", "c2", "c3"):
            bb.load(rid)
            bb.set_literal(rid, "title", rid)
            bb.commit(rid)
    with Service(settings) as service:
        started = service.membership.started_at
        service.run(until=lambda s: done_ticks(url, "count-them") >= started + 3
                    and s["committed"] >= 8, idle_exit=60)
    store = ServiceStore.connect(url)
    committed = [e.message_id for e in store.tables(JobLogTables).entries(states=("committed",),
                                                            queues=(target,), limit=10_000)]
    store.close()
    ticks = ticks_of(committed)
    complete = [t for t, numbers in ticks.items() if numbers == {"0", "1"}]
    assert len(complete) >= 3
    counts = stored_counts(url, ["c1", "c2", "c3"])
    assert sum(counts.values()) == 3 and min(counts) >= len(complete) and max(counts) == len(ticks)
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["schedules", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    assert "count-them" in shown and "every 1 s" in shown and "3 listed record(s)" in shown
    assert "2 message(s), 3 record(s)" in shown and "Counting" in shown


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.postgres
def test_a_per_second_schedule_runs_each_tick_once_when_the_leader_is_killed(
        tmp_path, broker_url, pg_url, qname, broker):
    workflows = write_test_workflows(tmp_path / "workflows")
    queue, target = qname("in"), qname("sched")
    configs, logs = {}, {}
    for name in ("sa", "sb"):
        configs[name] = tmp_path / f"{name}.toml"
        configs[name].write_text(f"""
[blackboard]
url = "{pg_url}"
[broker]
url = "{broker_url}"
[workflows]
dir = "{workflows}"
[engine]
runner = "local"
[node]
name = "{name}"
[[listener]]
name = "main"
queue = "{queue}"
workflow = "Counting"
[[router]]
queue = "{qname('out')}"
[[schedule]]
name = "tick"
every = "1s"
queue = "{target}"
ids = ["x1", "x2", "x3"]
""")
        logs[name] = tmp_path / f"{name}.log"
    first = start_service(configs["sa"], logs["sa"])
    second = None
    try:
        wait_for_log(logs["sa"], " up: queues ")
        second = start_service(configs["sb"], logs["sb"])
        wait_for_log(logs["sb"], "2 member(s) sa, sb, leader sa")
        deadline = time.monotonic() + 120
        while done_ticks(pg_url, "tick") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        begun = done_ticks(pg_url, "tick")
        assert begun, logs["sa"].read_text()[-3000:]
        while done_ticks(pg_url, "tick") < begun + 15 and time.monotonic() < deadline:
            time.sleep(0.1)
        kill_group(first)   # the leader dies mid-run (maybe mid-tick)
        wait_for_log(logs["sb"], "1 member(s) sb, leader sb", timeout=120)
        deadline = time.monotonic() + 120
        while done_ticks(pg_url, "tick") < begun + 40 and time.monotonic() < deadline:
            time.sleep(0.2)
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0, logs["sb"].read_text()[-3000:]
    finally:
        kill_group(first)
        if second is not None:
            kill_group(second)

    written = scheduled_in_outbox(pg_url, "tick")
    assert set(written.values()) == {1}, "a scheduled message was written twice"
    by_tick = ticks_of(written)
    ordered = sorted(by_tick)
    assert ordered == seconds(ordered[0], ordered[-1]), "a tick is missing"
    assert len(ordered) >= 40
    assert all(numbers == {"0", "1", "2"} for numbers in by_tick.values())
    arrived = Counter(p.message_id for p, _body in broker.drain(target))
    assert set(arrived) == set(written)   # all published (copies only under the same ID)
    assert "sb" in Path(logs["sb"]).read_text()
