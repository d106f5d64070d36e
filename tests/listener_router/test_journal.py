"""The distribution journal on a real RabbitMQ: entries, start points, copies, failures, status.

The chaos test (SIGKILLs and a broker restart) is in test_journal_chaos.py,
the 200 MB attachment in test_journal_attachments.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pika
import pytest
from journal_helpers import (
    Journal,
    applications,
    applied_rows,
    journal_fixture,  # noqa: F401  (the journal fixture)
    read_entries,
    record_apply,
    records,
    wait_until,
)
from listener_router_helpers import Broker

from listener_router import ConfigError, load_settings
from listener_router.journal import (
    JournalOutbox,
    Subscriber,
    journal_status,
    parse_start,
    request_rewind,
    request_skip,
    subscriber_state,
)
from listener_router.store import ServiceStore

# -- publishing ------------------------------------------------------------------------------


def test_each_commit_becomes_one_entry_with_version_operation_origin_and_chosen_attributes(
        journal: Journal) -> None:
    journal.with_journal(attributes=("text", "count"))
    journal.publish(records(5))
    journal.publish(records(2))                               # doc-0, doc-1 again: version 2
    journal.publish([{"id": "doc-4", "attributes": {}}], operation="DELETE")
    found = [(offset, orjson.loads(body)) for offset, body in
             read_entries(journal.settings.broker_url, journal.rule.stream)]
    assert [offset for offset, _ in found] == list(range(8))
    entries = [entry for _, entry in found]
    assert [e["seq"] for e in entries] == list(range(1, 9))
    assert [(e["id"], e["op"], e.get("version")) for e in entries] == [
        ("doc-0", "ADD", 1), ("doc-1", "ADD", 1), ("doc-2", "ADD", 1), ("doc-3", "ADD", 1),
        ("doc-4", "ADD", 1), ("doc-0", "UPDATE", 2), ("doc-1", "UPDATE", 2),
        ("doc-4", "DELETE", None)]
    assert entries[0]["attributes"] == {"text": "text 0", "count": 1}
    assert entries[5]["attributes"] == {"text": "text 0", "count": 2}
    assert {e["origin"] for e in entries} == {journal.settings.node}
    assert {e["workflow"] for e in entries} == {"Counting"}
    assert "attributes" not in entries[7]
    sizes = [len(body) for _, body in read_entries(journal.settings.broker_url,
                                                   journal.rule.stream)]
    assert max(sizes) < 400, sizes   # small entries: record ID, version, two attributes


def test_a_journal_takes_only_the_records_its_condition_and_workflow_select(
        journal: Journal) -> None:
    journal.with_journal(condition="$record/Val[@key='lang'] = 'de'")
    journal.publish([{"id": f"r{i}", "attributes": {"lang": "de" if i % 2 else "en"}}
                     for i in range(6)])
    ids = [orjson.loads(body)["id"] for _, body in
           read_entries(journal.settings.broker_url, journal.rule.stream)]
    assert ids == ["r1", "r3", "r5"]
    journal.with_journal(condition=None, workflow="SomethingElse")
    journal.publish([{"id": "r9", "attributes": {"lang": "de"}}])
    ids = [orjson.loads(body)["id"] for _, body in
           read_entries(journal.settings.broker_url, journal.rule.stream)]
    assert ids == ["r1", "r3", "r5"]


def test_entries_the_relay_published_but_never_marked_sent_go_out_again_with_their_numbers(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay killed between the broker's confirm and deleting the rows: the next relay
    publishes the same entries again, with the same numbers; a subscriber applies each once."""
    from listener_router.journal import JournalOutbox

    real_sent = JournalOutbox.sent
    calls = Counter[str]()

    def lose_the_first(self: JournalOutbox, name: str, up_to: int) -> None:
        calls["sent"] += 1
        if calls["sent"] == 1:
            raise RuntimeError("the relay died here")
        real_sent(self, name, up_to)

    monkeypatch.setattr(JournalOutbox, "sent", lose_the_first)
    journal.publish(records(20))
    stream = read_entries(journal.settings.broker_url, journal.rule.stream)
    seqs = [orjson.loads(body)["seq"] for _, body in stream]
    assert len(seqs) == 40 and sorted(set(seqs)) == list(range(1, 21))   # every entry twice
    rule = journal.subscriber("s")
    stats = journal.run(rule, until=lambda s: s.applied + s.copies >= 40)
    assert (stats.applied, stats.copies) == (20, 20)
    assert applications(rule.store) == Counter({seq: 1 for seq in range(1, 21)})


# -- start points --------------------------------------------------------------------------


def test_subscribers_with_different_start_points_see_exactly_the_entries_they_should(
        journal: Journal) -> None:
    journal.publish(records(10, "a"))                       # offsets 0..9
    late = [journal.subscriber(name, start=start) for name, start in
            (("next", "next"), ("last", "last"))]
    for rule in late:                                     # registered now: their start is fixed
        journal.run(rule, until=lambda s: True)
    time.sleep(1.5)   # the broker's time resolution is a second
    moment = time.time()
    time.sleep(1.1)
    journal.publish(records(5, "b"))                        # offsets 10..14
    everyone = {
        "first": journal.subscriber("first", start="first"),
        "offset": journal.subscriber("offset", start="offset:7"),
        "time": journal.subscriber("time", start=f"time:{moment}"),
        "next": late[0], "last": late[1]}
    expected = {"first": list(range(15)), "offset": list(range(7, 15)),
                "time": list(range(10, 15)), "next": list(range(10, 15)),
                "last": list(range(9, 15))}
    for name, rule in everyone.items():
        want = len(expected[name])
        journal.run(rule, until=lambda s, want=want: s.applied >= want, idle_exit=5)
        assert [row[2] for row in applied_rows(rule.store)] == expected[name], name


# -- failures ------------------------------------------------------------------------------


def _poison(bad: str) -> Any:
    def apply(entries: list[Any], conn: Any) -> None:
        for entry in entries:
            if entry.id == bad:
                raise ValueError(f"cannot apply {entry.id}")
        record_apply(entries, conn)
    return apply


def test_a_poison_entry_goes_to_the_error_queue_after_its_retries_and_the_others_apply(
        journal: Journal, broker: Broker) -> None:
    journal.publish(records(30))
    rule = journal.subscriber("s", max_retries=2, batch_size=10)
    stats = journal.run(rule, until=lambda s: s.applied >= 29 and s.errors >= 1,
                        apply=_poison("doc-13"))
    assert (stats.applied, stats.errors, stats.failures) == (29, 1, 3)
    assert sorted(row[1] for row in applied_rows(rule.store)) == sorted(
        f"doc-{i}" for i in range(30) if i != 13)
    [(props, body)] = broker.drain(journal.rule.error_queue("s"))
    assert json.loads(body)["id"] == "doc-13"
    assert "ValueError: cannot apply doc-13 (after 3 attempts)" in props.headers["x-chalk-error"]
    assert props.headers["x-chalk-offset"] == 13
    state = subscriber_state(Subscriber_engine(rule.store), journal.rule.name, "s")
    assert state is not None and (state.offset, state.errors, state.state) == (29, 1, "running")


def Subscriber_engine(url: str) -> Any:  # noqa: N802 - reads like the class it stands for
    from blackboard import SqlStore
    return SqlStore(url).engine


def _write_config(journal: Journal, path: Path, rule: Any) -> Path:
    path.write_text(f"""
[blackboard]
url = "{journal.db}"
[broker]
url = "{journal.settings.broker_url}"

[[journal]]
name = "{journal.rule.name}"
stream = "{journal.rule.stream}"

[[subscriber]]
id = "{rule.id}"
journal = "{journal.rule.name}"
store = "{rule.store}"
""")
    return path


def _chalk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "listener_router", *args], capture_output=True,
                          text=True, timeout=120)


def test_with_block_the_subscriber_stops_at_the_entry_until_chalk_journal_skip(
        journal: Journal, broker: Broker, tmp_path: Path) -> None:
    events = f"t.{journal.tag}.events"
    journal.publish(records(20))
    rule = journal.subscriber("s", max_retries=1, on_error="block", batch_size=5,
                              events_exchange=events)
    conn = pika.BlockingConnection(pika.URLParameters(journal.settings.broker_url))
    channel = conn.channel()
    channel.exchange_declare(events, exchange_type="topic", durable=True)
    channel.queue_declare(events, durable=True)
    channel.queue_bind(events, events, routing_key="journal.subscriber.#")
    conn.close()
    fixed = {"done": False}

    def apply(entries: list[Any], conn: Any) -> None:
        if not fixed["done"] and any(e.id == "doc-7" for e in entries):
            raise RuntimeError("constraint violated by doc-7")
        record_apply(entries, conn)

    running = journal.start(rule, apply)
    try:
        wait_until(lambda: running.stats.blocked, what="blocked")
        time.sleep(1.0)                                   # later entries stay untouched
        assert [row[1] for row in applied_rows(rule.store)] == [f"doc-{i}" for i in range(7)]
        _head, views = wait_until(lambda: _blocked_view(journal), what="status says blocked")
        [view] = views
        assert view.state == "blocked" and view.offset == 6 and view.lag_entries == 13
        assert "constraint violated by doc-7" in (view.blocked_reason or "")
        [(_props, body)] = broker.drain(events)
        event = json.loads(body)
        assert (event["event"], event["subscriber"], event["offset"]) == \
            ("journal.subscriber.blocked", "s", 7)
        fixed["done"] = True                                # the fix: doc-7 is handled by hand
        config = _write_config(journal, tmp_path / "chalk.toml", rule)
        done = _chalk("journal", "skip", "--config", str(config), "--journal",
                      journal.rule.name, "--subscriber", "s")
        assert done.returncode == 0, done.stderr
        assert "skipped the entry at offset 7" in done.stdout
        listed = _chalk("journal", "errors", "--config", str(config), "--journal",
                        journal.rule.name, "--subscriber", "s", "--json")
        assert listed.returncode == 0, listed.stderr
        (error,) = json.loads(listed.stdout)
        # the skipped entry names its record, and the two attempts it failed
        assert (error["offset"], error["record"], error["attempts"]) == (7, "doc-7", 2)
        assert error["reason"].startswith("skipped by an operator; it had failed: ")
        wait_until(lambda: running.stats.applied >= 19, what="the rest applied")
    finally:
        stats = running.stop()
        broker.delete(events)
    assert not stats.blocked
    assert [row[1] for row in applied_rows(rule.store)] == \
        [f"doc-{i}" for i in range(20) if i != 7]
    [(props, body)] = broker.drain(journal.rule.error_queue("s"))
    assert json.loads(body)["id"] == "doc-7"
    assert "skipped by an operator" in props.headers["x-chalk-error"]
    assert props.headers["x-chalk-attempts"] == 2


def _blocked_view(journal: Journal) -> Any:
    head, views = journal_status(journal.settings, journal.rule.name)
    return (head, views) if views and views[0].state == "blocked" else None


def test_rewind_to_a_time_applies_again_from_there_exactly_once(journal: Journal,
                                                                 tmp_path: Path) -> None:
    journal.publish(records(10, "a"))
    time.sleep(1.5)
    moment = time.time()
    time.sleep(1.1)
    journal.publish(records(10, "b"))
    rule = journal.subscriber("s", batch_size=4)
    journal.run(rule, until=lambda s: s.applied >= 20)
    config = _write_config(journal, tmp_path / "chalk.toml", rule)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(moment)) + f".{int(moment % 1 * 1e6):06d}"
    done = _chalk("journal", "rewind", "--config", str(config), "--journal", journal.rule.name,
                  "--subscriber", "s", "--to", iso)
    assert done.returncode == 0, done.stderr
    stats = journal.run(rule, until=lambda s: s.applied >= 10, idle_exit=5)
    assert stats.applied == 10
    counts = Counter(row[1] for row in applied_rows(rule.store))
    assert counts == Counter({**{f"a-{i}": 1 for i in range(10)},
                              **{f"b-{i}": 2 for i in range(10)}})
    journal.run(rule, until=lambda s: False, idle_exit=2)           # nothing more: once
    assert len(applied_rows(rule.store)) == 30


def test_a_running_subscriber_starts_over_when_rewound(journal: Journal) -> None:
    journal.publish(records(8))
    rule = journal.subscriber("s")
    running = journal.start(rule)
    try:
        wait_until(lambda: running.stats.applied >= 8, what="all applied")
        request_rewind(Subscriber_engine(rule.store), journal.rule.name, "s", "offset:5")
        wait_until(lambda: running.stats.applied >= 11, what="applied again after the rewind")
    finally:
        stats = running.stop()
    assert stats.resyncs == 1
    assert [row[2] for row in applied_rows(rule.store)] == [*range(8), 5, 6, 7]


def test_a_gap_left_by_retention_blocks_the_subscriber_until_accepted(
        broker_url: str, tmp_path: Path) -> None:
    # Retention keeps max_bytes but drops whole segments: under load the broker may write a
    # round's 25 entries (~10 KB) as one chunk, so max_bytes holds several such chunks (with
    # a smaller one, a round could leave the stream empty, and nothing to read its start from).
    journal = Journal(broker_url, tmp_path, max_bytes=40_000, segment_bytes=2000)
    try:
        journal.publish(records(3, "early"))
        rule = journal.subscriber("s", batch_size=1)
        journal.run(rule, until=lambda s: s.applied >= 1)
        # Retention removes whole segments, and a segment rolls over only after a chunk:
        # publishing rounds make segments until the oldest ones go (how the broker cuts
        # chunks depends on its load, so the number of rounds is not fixed).
        total, first = 3, None
        for round_ in range(16):
            journal.publish([{"id": f"late-{round_ * 25 + i}",
                              "attributes": {"text": "t", "filler": "x" * 200}}
                             for i in range(25)])
            total += 25
            if round_ >= 4:
                [first] = wait_until(lambda: _settled_first(broker_url, journal.rule.stream),
                                     what="two reads of the stream's start agree")
                if first is not None and first > 1:
                    break
        assert first is not None and first > 1
        stats = journal.run(rule, until=lambda s: s.blocked, idle_exit=10)
        assert stats.blocked and stats.gaps == 1 and stats.applied == 0
        state = subscriber_state(Subscriber_engine(rule.store), journal.rule.name, "s")
        assert state is not None and state.blocked_kind == "gap"
        assert f"offsets 1..{first - 1}" in (state.blocked_reason or "")
        # Accepted, the subscriber goes on from the stream's start.  The broker may still be
        # dropping a segment behind it (retention is checked as segments roll over, and a
        # reader can land in one being removed): such a later gap blocks it again, and is
        # accepted the same way; a busy broker may trim segment after segment for a while
        # (seen: six more gaps), so each is accepted until the subscriber reaches the end.
        # The relay publishes again numbered entries it holds no confirm for, so the stream can
        # hold more offsets than entries: the end is the last entry's number, not an offset.
        # What was applied is in order, once, and reaches the end.
        for _ in range(40):
            request_skip(Subscriber_engine(rule.store), journal.rule.name, "s")
            stats = journal.run(rule, idle_exit=30, until=lambda s: s.blocked or (
                applied_rows(rule.store)[-1][0] == total))
            if not stats.blocked:
                break
        rows = applied_rows(rule.store)
        numbers, offsets = [row[0] for row in rows], [row[2] for row in rows]
        assert offsets[0] == 0 and offsets[1] >= first
        assert numbers[0] == 1 and numbers[-1] == total
        assert numbers == sorted(set(numbers)) and offsets == sorted(set(offsets))
    finally:
        journal.delete()


def _settled_first(url: str, stream: str) -> list[int | None] | None:
    """``[the stream's first offset]`` once two reads a second apart agree (retention works
    segment by segment, in the background); ``[None]`` when both found the stream empty."""
    first = read_entries(url, stream)
    time.sleep(1.0)
    again = read_entries(url, stream)
    if not first and not again:
        return [None]   # retention left only an empty segment: nothing to read until more comes
    return [again[0][0]] if first and again and first[0][0] == again[0][0] else None


# -- subscribers through a workflow -----------------------------------------------------------


def test_a_workflow_subscriber_commits_its_records_with_the_offset(journal: Journal) -> None:
    from blackboard import Blackboard

    journal.with_journal(attributes=("text",))
    journal.publish(records(6))
    journal.publish([{"id": "doc-5", "attributes": {}}], operation="DELETE")
    rule = journal.subscriber("w", workflow="Counting")
    with Subscriber(journal.settings, rule) as sub:
        stats = sub.run(until=lambda s: s.applied >= 7)
    assert stats.applied == 7
    with Blackboard.connect(rule.store) as bb:
        ids = [f"doc-{i}" for i in range(6)]
        bb.load_many(ids)
        assert [bb.get_attributes(rid) for rid in ids[:5]] == \
            [{"text": f"text {i}", "count": 1} for i in range(5)]
        assert bb.is_new("doc-5")
        bb.invalidate_many(ids)
    state = subscriber_state(Subscriber_engine(rule.store), journal.rule.name, "w")
    assert state is not None and (state.offset, state.seq) == (6, 7)


# -- status -----------------------------------------------------------------------------------


def test_status_shows_lag_and_forgets_a_subscriber_not_seen_lately(journal: Journal) -> None:
    journal.with_journal(forget_after=3.0)
    journal.publish(records(12))
    ahead = journal.subscriber("ahead")
    journal.run(ahead, until=lambda s: s.applied >= 12)
    rule = journal.subscriber("slow", batch_size=1)
    journal.run(rule, until=lambda s: s.applied >= 4)
    _head, views = journal_status(journal.settings, journal.rule.name)
    by_name = {v.subscriber: v for v in views}
    assert by_name["slow"].offset == 3 and by_name["slow"].lag_entries == 8
    # its agent has exited: stopped, not "running … 1 s ago"
    assert by_name["slow"].lag_seconds >= 0.0 and by_name["slow"].state == "stopped"
    assert by_name["ahead"].lag_entries == 0 and by_name["ahead"].lag_seconds == 0.0
    time.sleep(4.0)
    assert journal_status(journal.settings, journal.rule.name)[1] == []


def test_a_configured_subscriber_that_stopped_with_a_backlog_stays_in_the_status(
        journal: Journal) -> None:
    journal.with_journal(forget_after=2.0)
    journal.publish(records(10))
    rule = journal.subscriber("slow", batch_size=1)
    never = journal.subscriber("later")
    settings = journal.settings.with_section("subscriber", (rule, never))
    journal.run(rule, until=lambda s: s.applied >= 4)
    time.sleep(3.0)                         # longer than forget_after: no status message left
    _head, views = journal_status(settings, journal.rule.name)
    assert [(v.subscriber, v.state, v.offset, v.lag_entries, v.last_seen) for v in views] == [
        ("later", "never run", None, 0, None), ("slow", "stopped", 3, 6, None)]
    journal.publish(records(2, "more"))     # the backlog grows while it is stopped
    _head, views = journal_status(settings, journal.rule.name)
    assert (views[1].state, views[1].lag_entries) == ("stopped", 8)
    assert views[1].lag_seconds > 1.0        # its last entry is older than the head by then
    # a running agent that goes quiet for three status intervals is silent, not running
    silent = {"subscriber": "gone", "state": "running", "offset": 0, "every": 0.2,
              "at": time.time() - 0.7}
    conn = pika.BlockingConnection(pika.URLParameters(journal.settings.broker_url))
    conn.channel().basic_publish("", journal.rule.status_stream, orjson.dumps(silent))
    conn.close()
    _head, views = journal_status(settings, journal.rule.name)
    assert {v.subscriber: v.state for v in views}["gone"] == "silent"


def test_the_head_and_the_status_of_a_journal_being_written_are_read_while_it_is_written(
        journal: Journal) -> None:
    """A stream written without pause never falls quiet: the readers stop once they have
    caught up with the moment they began."""
    import threading

    from listener_router.journal import read_head

    journal.publish(records(3))
    rule = journal.subscriber("s")
    journal.run(rule, until=lambda s: s.applied >= 3)
    stop = threading.Event()

    def write() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(journal.settings.broker_url))
        channel = conn.channel()
        seq = 1000
        deadline = time.monotonic() + 90        # a reader waiting for quiet would wait this long
        while not stop.is_set() and time.monotonic() < deadline:
            channel.basic_publish("", journal.rule.stream, orjson.dumps(
                {"seq": seq, "published_at": time.time(), "journal": journal.rule.name}))
            channel.basic_publish("", journal.rule.status_stream, orjson.dumps(
                {"subscriber": "busy", "state": "running", "offset": 0, "at": time.time()}))
            seq += 1
            time.sleep(0.005)
        conn.close()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        time.sleep(2.0)
        head = read_head(journal.settings.broker_url, journal.rule.stream)
        _head, views = journal_status(journal.settings, journal.rule.name)
        still_writing = writer.is_alive() and not stop.is_set()
    finally:
        stop.set()
        writer.join(30)
    assert still_writing
    assert head is not None and head.seq > 1000
    assert {v.subscriber for v in views} == {"s", "busy"}


# -- configuration ----------------------------------------------------------------------------


def test_journal_and_subscriber_tables_are_read_with_clear_errors(tmp_path: Path) -> None:
    config = tmp_path / "chalk.toml"
    config.write_text('[[journal]]\nname = "search"\nmax_age = "7D"\nattributes = ["title"]\n'
                      '[[subscriber]]\nid = "index"\njournal = "search"\nstore = "sqlite:///x.db"\n'
                      'start = "2024-05-01T12:00:00+00:00"\non_error = "block"\n')
    settings = load_settings(config)
    [rule] = settings.journals
    assert (rule.stream, rule.attributes, rule.status_stream) == \
        ("chalk.journal.search", ("title",), "chalk.journal.search.status")
    [sub] = settings.subscribers
    assert (sub.start, sub.on_error) == ("time:1714564800.0", "block")
    for body, message in [
            ('[[journal]]\nname = "a"\nmax_age = "week"\n', "max_age must be"),
            ('[[journal]]\nname = "a"\ncondition = "$record/["\n', "condition"),
            ('[[journal]]\nname = "a"\n[[journal]]\nname = "a"\n', "two journals"),
            ('[[subscriber]]\nid = "x"\njournal = "nope"\n', "journal 'nope' is not"),
            ('[[journal]]\nname = "a"\n[[subscriber]]\nid = "x"\njournal = "a"\n'
             'on_error = "retry"\n', "on_error must be one of"),
            ('[[journal]]\nname = "a"\nretention = 3\n', "unknown key(s) retention")]:
        config.write_text(body)
        with pytest.raises(ConfigError) as caught:
            load_settings(config)
        assert message in str(caught.value) and str(config) in str(caught.value)


def test_start_points_are_parsed_into_their_stored_form() -> None:
    assert parse_start("first") == "first"
    assert parse_start(42) == parse_start("42") == "offset:42"
    assert parse_start("1714564800.5") == "time:1714564800.5"
    assert parse_start("2024-05-01T12:00:00Z") == "time:1714564800.0"
    with pytest.raises(ConfigError) as caught:
        parse_start("yesterday", "--start")
    assert "--start: 'yesterday' is not a start point" in str(caught.value)


def test_the_journal_outbox_lives_with_the_service_tables(sqlite_url: str) -> None:
    store = ServiceStore.connect(sqlite_url)
    try:
        assert store.tables(JournalOutbox).pending() == {}
        assert store.tables(JournalOutbox).take("j", "me", 30.0, 10) == []
        assert store.tables(JournalOutbox).take("j", "other", 30.0, 10) is None   # the lease is mine
    finally:
        store.close()
