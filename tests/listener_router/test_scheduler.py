"""The scheduler against a real database: compare-and-set ticks, pages, catch-up, selections.

Two :class:`Scheduler` objects on one database stand for two processes that
both think they lead (or a stale leader and its successor); ``publish``
collects the outbox batches each hands on.  ``step(rule, now=…)`` drives the
clock, so these tests do not wait for real ticks.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import orjson
import pytest
from sqlalchemy import select

from blackboard import Blackboard
from listener_router.cluster import Membership
from listener_router.events import Events, EventSettings
from listener_router.schedules import Scheduler, ScheduleRule, Schedules, Selection
from listener_router.store import ServiceStore
from listener_router.store._outbox import outbox

T0 = 1_700_000_000.0   # a multiple of 10 s


class Collect:
    """Outbox batches handed to the publisher, by batch ID."""

    def __init__(self):
        self.batches: dict[str, list] = {}
        self.lock = threading.Lock()

    def __call__(self, batches):
        with self.lock:
            self.batches.update(batches)

    def ids(self) -> list[str]:
        return [m.message_id for b in self.batches.values() for m in b]


def scheduler(url: str, rule: ScheduleRule, name: str, *, page: int = 2000,
              started: float = T0 - 3600, events: Events | None = None
              ) -> tuple[Scheduler, Collect, ServiceStore]:
    store = ServiceStore.connect(url)
    membership = Membership(store, name)
    membership.started_at = started
    collect = Collect()
    selections = {rule.name: Selection(rule, store.sql, page=page)}
    return (Scheduler(store, [rule], membership, collect, member=name, selections=selections,
                      events=events), collect, store)


def outbox_message_ids(store: ServiceStore) -> Counter:
    """How often each message ID was written to the outbox (exactly once is the point)."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(outbox.c.messages)).scalars().all()
    return Counter(m[0] for text in rows for m in orjson.loads(text))


def run_until_idle(s: Scheduler, rule: ScheduleRule, now: float) -> None:
    while s.step(rule, now=now) is not None:
        pass


def test_a_new_schedule_starts_from_now_and_runs_each_tick_once(sqlite_url):
    rule = ScheduleRule(name="s", every=10.0, queue="q", ids=("a", "b", "c"), batch_size=2)
    s, sent, store = scheduler(sqlite_url, rule, "a")
    run_until_idle(s, rule, T0 + 5)
    assert sent.batches == {}                      # created at T0; nothing due yet
    for now in (T0 + 10, T0 + 10.5, T0 + 12, T0 + 25):
        run_until_idle(s, rule, now)
    ids = sent.ids()
    assert ids == [f"schedule:s:{t}:{n}" for t in ("2023-11-14T22:13:30Z", "2023-11-14T22:13:40Z")
                   for n in (0, 1)]
    state = store.tables(Schedules).read("s")
    assert (state.tick, state.done, state.messages, state.records) == (T0 + 20, True, 2, 3)


@pytest.mark.parametrize("on", [True, False])
def test_a_finished_tick_carries_its_job_finished_event_when_events_say_so(sqlite_url, on):
    rule = ScheduleRule(name="ev", every=10.0, queue="q", ids=("a", "b", "c"), batch_size=2)
    events = Events(EventSettings(job_finished=on), "a")
    s, sent, store = scheduler(sqlite_url, rule, "a", page=2, events=events)
    run_until_idle(s, rule, T0 + 5)
    run_until_idle(s, rule, T0 + 12)
    pages = [b for b in sent.batches.values()]
    found = [(m.exchange, m.routing_key, orjson.loads(m.body)) for b in pages for m in b
             if m.routing_key.startswith("job.finished")]
    # the event is not one of the tick's messages: the row (chalk schedules, the log) and
    # the event count the same two messages and three records
    state = store.tables(Schedules).read("ev")
    assert (state.done, state.messages, state.records) == (True, 2, 3)
    if not on:
        assert found == []
        return
    ((exchange, key, body),) = found
    assert (exchange, key) == ("chalk.events", "job.finished.ev")
    assert {k: body[k] for k in ("schedule", "tick", "messages", "records", "member")} == {
        "schedule": "ev", "tick": "2023-11-14T22:13:30Z", "messages": 2, "records": 3,
        "member": "a"}
    last = [b for b in pages if any(m.routing_key == "job.finished.ev" for m in b)][0]
    assert [m.message_id for m in last if m.routing_key == "q"] == [
        "schedule:ev:2023-11-14T22:13:30Z:1"]     # with the tick's last page
    store.close()


def test_two_processes_that_both_lead_write_each_page_once(sqlite_url):
    """Steps interleaved one by one: whoever writes a page, no page is written twice."""
    rule = ScheduleRule(name="s", every=10.0, queue="q", ids=tuple(f"r{i}" for i in range(25)))
    a, sent_a, store = scheduler(sqlite_url, rule, "a", page=4)
    b, sent_b, _ = scheduler(sqlite_url, rule, "b", page=4)
    a.step(rule, now=T0)
    for k in range(1, 6):
        now = T0 + 10 * k
        for _ in range(12):
            seen = store.tables(Schedules).read("s")
            # both read the same row, then both try to write: one of them is stale
            results = [a.step(rule, now=now), b.step(rule, now=now)]
            if results == [None, None] and seen.done:
                break
    written = outbox_message_ids(store)
    assert set(written.values()) == {1}
    assert len(written) == 5 * 25
    assert sorted(sent_a.ids() + sent_b.ids()) == sorted(written)
    assert sent_a.batches and sent_b.batches        # both did some of the work


def test_a_stale_leader_changes_nothing_and_its_successor_finishes_the_tick(sqlite_url):
    rule = ScheduleRule(name="s", every=10.0, queue="q", ids=tuple(f"r{i}" for i in range(10)))
    old, sent_old, store = scheduler(sqlite_url, rule, "old", page=3)
    new, sent_new, _ = scheduler(sqlite_url, rule, "new", page=3)
    old.step(rule, now=T0)
    assert old.step(rule, now=T0 + 10) == 0           # claimed the tick
    assert old.step(rule, now=T0 + 10) == 3           # page 1 written
    old_state = store.tables(Schedules).read("s")
    # the old leader stalls here; the new one takes over mid-tick from the cursor
    run_until_idle(new, rule, T0 + 11)
    assert store.tables(Schedules).read("s").done
    # the old one wakes up with the row it read before: its page is refused
    assert old._page(rule, old_state) == 0
    assert [i.rsplit(":", 1)[1] for i in sent_old.ids()] == ["0", "1", "2"]
    assert sorted(int(i.rsplit(":", 1)[1]) for i in sent_new.ids()) == list(range(3, 10))
    assert set(outbox_message_ids(store).values()) == {1}


def test_catch_up_one_runs_the_latest_missed_tick_and_none_skips_them(sqlite_url):
    for catch_up, expected in (("one", ["2023-11-14T22:14:30Z"]), ("none", [])):
        rule = ScheduleRule(name=f"s-{catch_up}", every=10.0, queue="q", ids=("a",),
                            catch_up=catch_up)
        s, sent, store = scheduler(sqlite_url, rule, "a", started=T0 - 100)
        run_until_idle(s, rule, T0)
        run_until_idle(s, rule, T0 + 10)               # tick T0+10 runs
        sent.batches.clear()
        # every member stops; one starts again at T0+75: ticks 20..70 were missed
        s.membership.started_at = T0 + 75
        run_until_idle(s, rule, T0 + 75)
        assert [m.headers["tick"] for b in sent.batches.values() for m in b] == expected
        state = store.tables(Schedules).read(rule.name)
        assert state.tick == T0 + 70
        assert state.skipped == (5 if catch_up == "one" else 6)
        sent.batches.clear()
        run_until_idle(s, rule, T0 + 81)               # back on time: T0+80 runs
        assert [m.headers["tick"] for b in sent.batches.values() for m in b] == [
            "2023-11-14T22:14:40Z"]


def test_ticks_missed_while_a_member_lived_are_all_run_in_order(sqlite_url):
    """Leadership moved (the old leader died), but this member lived all along: owed."""
    rule = ScheduleRule(name="s", every=10.0, queue="q", ids=("a",), catch_up="none")
    s, sent, _ = scheduler(sqlite_url, rule, "b", started=T0 - 100)
    run_until_idle(s, rule, T0)
    run_until_idle(s, rule, T0 + 45)
    assert [m.headers["tick"] for b in sent.batches.values() for m in b] == [
        "2023-11-14T22:13:30Z", "2023-11-14T22:13:40Z", "2023-11-14T22:13:50Z",
        "2023-11-14T22:14:00Z"]


def _store_records(url: str, docs: dict[str, dict]) -> None:
    with Blackboard.connect(url) as bb:
        for rid, attrs in docs.items():
            bb.create(rid)
            for name, value in attrs.items():
                if name == "source":
                    continue
                bb.set_literal(rid, name, value)
        bb.commit_many(list(docs))


def _walk(selection: Selection) -> list[str]:
    out, cursor, pages = [], None, 0
    while True:
        ids, cursor, over = selection.page(cursor)
        out += ids
        pages += 1
        if over:
            return out


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_selections_stream_the_records_page_by_page(request, backend):
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    docs = {f"{p}-{i:03d}": {"lang": "de" if i % 3 == 0 else "en"}
            for p in ("doc", "img", "doc2") for i in range(40)}
    _store_records(url, docs)
    store = ServiceStore.connect(url)
    try:
        everything = Selection(ScheduleRule(name="a", every=60.0), store.sql, page=7)
        assert _walk(everything) == sorted(docs)
        prefixed = Selection(ScheduleRule(name="p", every=60.0, prefix="doc-"), store.sql, page=7)
        assert _walk(prefixed) == sorted(r for r in docs if r.startswith("doc-"))
        german = Selection(ScheduleRule(name="x", every=60.0, prefix="img",
                                        xpath="$record/Val[@key='lang'] = 'de'"), store.sql,
                           page=7)
        assert _walk(german) == sorted(r for r in docs if r.startswith("img")
                                       and docs[r]["lang"] == "de")
        listed = Selection(ScheduleRule(name="l", every=60.0, ids=("z", "y", "x")), store.sql,
                           page=2)
        assert _walk(listed) == ["z", "y", "x"]
    finally:
        store.close()


def test_a_selection_by_source_reads_the_records_source(sqlite_url):
    with Blackboard.connect(sqlite_url) as bb:
        for i in range(6):
            bb.create(f"r{i}")
            bb.set_literal(f"r{i}", "n", i)
        bb.commit_many([f"r{i}" for i in range(6)])
    store = ServiceStore.connect(sqlite_url)
    with store.engine.begin() as conn:   # the source is set by whoever stored the record
        for i in (1, 4):
            doc = orjson.loads(conn.exec_driver_sql(
                "SELECT doc FROM chalk_records WHERE id = ?", (f"r{i}",)).scalar_one())
            doc["source"] = "web"
            conn.exec_driver_sql("UPDATE chalk_records SET doc = ? WHERE id = ?",
                                 (orjson.dumps(doc).decode(), f"r{i}"))
    selection = Selection(ScheduleRule(name="w", every=60.0, source="web"), store.sql, page=2)
    assert _walk(selection) == ["r1", "r4"]
    store.close()


@pytest.mark.postgres
def test_on_postgres_two_racing_schedulers_claim_each_tick_once(pg_url):
    """Two threads step the same schedule as fast as they can over 30 ticks."""
    rule = ScheduleRule(name="race", every=10.0, queue="q", ids=tuple(f"r{i}" for i in range(7)))
    pair = [scheduler(pg_url, rule, name, page=3) for name in ("a", "b")]
    pair[0][0].step(rule, now=T0)
    errors: list[BaseException] = []

    def drive(s: Scheduler) -> None:
        try:
            for k in range(1, 31):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    state = s.store.tables(Schedules).read("race")
                    if state.tick >= T0 + 10 * k and state.done:
                        break
                    s.step(rule, now=T0 + 10 * k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(s,)) for s, _sent, _store in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    written = outbox_message_ids(pair[0][2])
    assert len(written) == 30 * 7 and set(written.values()) == {1}
    for _s, _sent, store in pair:
        store.close()
