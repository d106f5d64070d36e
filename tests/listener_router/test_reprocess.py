"""``chalk reprocess`` without a service: the walk and its cursor, the run's row, the rate,
the target queue, and what it publishes on a real RabbitMQ (by prefix, source, XPath, an ID
file), stopped and resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from listener_router_helpers import Broker
from reprocess_helpers import dying_before_the_second_save, store_docs, write_reprocess_config

from listener_router import ConfigError, ListenerRule, RecordFileError, Settings, load_settings
from listener_router.cli import main
from listener_router.reprocess import (
    Pacer,
    Reprocess,
    Runs,
    RunSelection,
    RunTakenOver,
    begin,
    message_id,
    read_ids,
    run_views,
    target_rule,
)
from listener_router.schedules import RecordFilter, Selection
from listener_router.store import INBOX, ServiceStore


def _walk_resuming_mid_page(selection: Selection) -> list[str]:
    """Walk the selection, but after each page take up again from the middle of it."""
    out: list[str] = []
    cursor = None
    while True:
        page = selection.read(cursor)
        half = len(page.ids) // 2
        out += page.ids[:half]
        cursor, _read = page.after(half)
        if half == len(page.ids):
            if page.over:
                return out
            continue
        rest = selection.read(cursor)   # the rest of this page comes first
        assert rest.ids[:len(page.ids) - half] == page.ids[half:]
        out += page.ids[half:]
        cursor, _read = page.after(len(page.ids))
        if page.over:
            return out


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_walk_goes_on_after_any_id_of_a_page_as_if_it_had_not_stopped(request, backend):
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    docs = store_docs(url)
    store = ServiceStore.connect(url)
    try:
        for criteria, expected in (
                (RecordFilter(), sorted(docs)),
                (RecordFilter(prefix="img-"), sorted(r for r in docs if r.startswith("img-"))),
                (RecordFilter(xpath="$record/Val[@key='lang'] = 'de'"),
                 sorted(r for r, d in docs.items() if d["lang"] == "de")),
                (RecordFilter(source="web"),
                 sorted(r for r, d in docs.items() if d["source"] == "web")),
                (RecordFilter(ids=("img-004", "nope", "doc-001", "doc-003")),
                 ["img-004", "doc-001", "doc-003"])):
            selection = Selection(criteria, store.sql, page=7, stored_only=True)
            assert _walk_resuming_mid_page(selection) == expected, criteria
    finally:
        store.close()


def test_a_page_counts_what_it_read_and_a_schedule_keeps_its_listed_ids(sqlite_url):
    store_docs(sqlite_url, 20)
    store = ServiceStore.connect(sqlite_url)
    try:
        page = Selection(RecordFilter(prefix="doc-", xpath="$record/Val[@key='lang'] = 'de'"),
                         store.sql, page=50).read(None)
        assert page.ids == ["doc-000", "doc-003", "doc-006", "doc-009"] and page.over
        assert page.read == 10 and page.after(2) == ("doc-003", 4)
        listed = Selection(RecordFilter(ids=("x", "doc-001")), store.sql).read(None)
        assert listed.ids == ["x", "doc-001"]   # a schedule publishes what it lists
    finally:
        store.close()


def test_an_id_file_takes_plain_lines_and_json_lines_each_once(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text('doc-1\n\n  doc-2  \n{"id": "doc-3", "attributes": {"a": 1}}\ndoc-1\n')
    assert read_ids(path) == (("doc-1", "doc-2", "doc-3"), 1)
    path.write_text('doc-1\n{"name": "no id"}\n')
    with pytest.raises(RecordFileError) as caught:
        read_ids(path)
    assert f"{path}:2:" in str(caught.value)
    with pytest.raises(ConfigError) as refused:
        RunSelection.asked(ids_from=str(path), prefix="doc-")
    assert "--ids-from" in str(refused.value)


def test_a_run_with_an_id_file_that_changed_is_refused(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("a\nb\n")
    selection, ids, _repeats = RunSelection.asked(ids_from=str(path))
    assert ids == ("a", "b") and RunSelection.parse(selection.text()) == selection
    assert RunSelection.parse(selection.text()).listed() == ids
    path.write_text("a\nc\n")
    with pytest.raises(ConfigError) as caught:
        selection.listed()
    assert "lists other IDs" in str(caught.value)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_run_moves_only_as_its_table_says_and_by_compare_and_set(request, backend):
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    store = ServiceStore.connect(url)
    runs = store.tables(Runs)
    run = runs.create(workflow="W", queue="q", selection="{}", rate=None, total=3, owner="me:1")
    moved = runs.advance(run, "b", 2, 2, 0, last=False)
    assert (moved.state, moved.cursor, moved.step) == ("running", "b", 1)
    with pytest.raises(RunTakenOver):
        runs.advance(run, "c", 3, 3, 0, last=False)   # read before the move: stale
    stopped = runs.stop(moved, "Ctrl-C")
    with pytest.raises(ValueError):
        runs.advance(stopped, "c", 3, 3, 0, last=False)  # a stopped run does not move
    again = runs.resume(stopped, "you:2", rate=5.0)
    done = runs.advance(again, "c", 3, 3, 0, last=True)
    assert (done.state, done.owner, done.rate, done.note) == ("finished", "you:2", 5.0, None)
    assert runs.read(run.id) == done and done.finished_at is not None
    with pytest.raises(ValueError):
        runs.resume(done, "me:3", None)
    other = runs.create(workflow="W", queue="q", selection="{}", rate=None, total=0, owner="x:1")
    with store.engine.begin() as conn:   # what the service's commits leave in the inbox
        conn.execute(INBOX.insert(), [
            dict(queue=queue, message_id=message_id(rid, f"r{i}"), status="committed",
                 processed_at=0.0)
            for queue, rid, n in (("q", run.id, 3), ("elsewhere", run.id, 2), ("q", other.id, 1))
            for i in range(n)])
    assert runs.committed([done, other]) == {run.id: 3, other.id: 1}
    store.close()


def _settings(url: str, broker_url: str = "amqp://localhost", *rules: ListenerRule) -> Settings:
    return Settings(blackboard_url=url, broker_url=broker_url,
                    listeners=rules or (ListenerRule(name="main", queue="q.in",
                                                     workflow="Counting"),))


def test_a_run_whose_process_is_gone_is_taken_up_and_a_live_one_is_refused(sqlite_url):
    settings = _settings(sqlite_url)
    store = ServiceStore.connect(sqlite_url)
    runs = store.tables(Runs)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import socket
    gone = runs.create(workflow="Counting", queue="q.in", selection=RunSelection().text(),
                       rate=None, total=0, owner=f"{socket.gethostname()}:{dead}")
    assert run_views(store)[0].state == "interrupted"
    taken = begin(settings, store, workflow="Counting")   # the same selection: taken up
    assert taken.resumed and taken.run.id == gone.id and taken.run.owner.endswith(
        f":{os.getpid()}")
    with pytest.raises(ConfigError) as caught:        # now it runs here: refused
        begin(settings, store, resume=gone.id)
    assert "is running in process" in str(caught.value)
    fresh = begin(settings, store, workflow="Counting", new=True)
    assert not fresh.resumed and fresh.run.id != gone.id
    with pytest.raises(ConfigError):
        begin(settings, store, resume="nosuchrun")
    store.close()


def test_the_pacer_spaces_parts_so_that_no_second_holds_more_than_the_rate():
    now = [0.0]
    starts: list[float] = []
    pacer = Pacer(50.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert pacer.part == 10
    for _ in range(20):
        pacer.wait(pacer.part)
        starts.append(now[0])
        now[0] += 0.03          # publishing takes a while
    for t in starts:
        assert sum(1 for s in starts if t <= s < t + 1.0 - 1e-9) * pacer.part <= 50
    assert starts[-1] == pytest.approx(19 * 0.2)
    assert Pacer(None).part == 1000 and Pacer(2.0).part == 1


def test_message_ids_name_the_run_and_the_record_and_fit_an_amqp_short_string():
    assert message_id("3f2a9c1e", "doc-1") == "reprocess:3f2a9c1e:doc-1"
    long = message_id("3f2a9c1e", "x" * 300)
    assert len(long.encode()) <= 255 and long.startswith("reprocess:3f2a9c1e:#")
    assert long == message_id("3f2a9c1e", "x" * 300) != message_id("3f2a9c1e", "x" * 301)
    assert message_id("3f2a9c1e", "a\x01b").startswith("reprocess:3f2a9c1e:#")


def test_the_target_is_a_rule_that_runs_the_workflow_for_reprocess_messages(sqlite_url):
    settings = _settings(
        sqlite_url, "amqp://localhost",
        ListenerRule(name="a", queue="q1", workflow="A"),
        ListenerRule(name="b-dated", queue="q2", workflow="B", condition="$tick"),
        ListenerRule(name="b-reprocess", queue="q2", workflow="B", condition="$reprocess"),
        ListenerRule(name="b", queue="q3", workflow="B"))
    assert target_rule(settings, "B").name == "b-reprocess"   # $tick: no such header
    assert target_rule(settings, "B", "q3").name == "b"
    with pytest.raises(ConfigError) as caught:
        target_rule(settings, "B", "q1")
    assert "would match rule 'a', which runs 'A'" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        target_rule(settings, "C")
    assert "no listener rule" in str(caught.value) and 'workflow = "C"' in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        target_rule(settings, "B", "nowhere")
    assert "reads queue 'nowhere'" in str(caught.value)


# -- on RabbitMQ -----------------------------------------------------------------------------
def _drained(broker: Broker, queue: str) -> dict[str, str]:
    """Message ID -> the record ID it names, of everything in ``queue`` (taken off it)."""
    out = {}
    for props, body in broker.drain(queue):
        (record,) = json.loads(body)["records"]
        assert props.headers["reprocess"] == props.message_id.split(":")[1]
        assert props.headers["operation"] == "ADD"
        out[props.message_id] = record["id"]
    return out


def _run_id(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    line = next(li for li in (out.out + out.err).splitlines() if li.startswith("run "))
    return line.split()[1].rstrip(":")


@pytest.mark.broker
def test_reprocess_publishes_the_records_chosen_by_prefix_source_xpath_and_id_file(
        tmp_path, sqlite_url, broker_url, broker, qname, capsys):
    docs = store_docs(sqlite_url)
    queue = qname("in")
    config = write_reprocess_config(tmp_path / "chalk.toml", db=sqlite_url, broker=broker_url,
                                    queue=queue)
    (tmp_path / "ids.jsonl").write_text('{"id": "img-007"}\n{"id": "gone"}\ndoc-002\n')
    cases = [
        (["--prefix", "img-"], {r for r in docs if r.startswith("img-")}),
        (["--source", "web"], {r for r, d in docs.items() if d["source"] == "web"}),
        (["--xpath", '$record/Val[@key="lang"] = "fr"'],
         {r for r, d in docs.items() if d["lang"] == "fr"}),
        (["--ids-from", str(tmp_path / "ids.jsonl")], {"img-007", "doc-002"}),
    ]
    for options, expected in cases:
        assert main(["reprocess", "--config", str(config), "--workflow", "Counting",
                     *options]) == 0
        run = _run_id(capsys)
        sent = _drained(broker, queue)
        assert sorted(sent.values()) == sorted(expected), options
        assert set(sent) == {message_id(run, rid) for rid in expected}
    assert main(["reprocess", "--config", str(config), "--list", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [v["published"] for v in shown] == [2, 20, 12, 30]
    assert shown[0]["missing"] == 1 and shown[0]["total"] == 3
    assert {v["state"] for v in shown} == {"finished"}
    assert main(["reprocess", "--config", str(config), "--workflow", "Counting",
                 "--queue", "elsewhere"]) == 2
    assert "reads queue 'elsewhere'" in capsys.readouterr().err


@pytest.mark.broker
def test_rate_holds_reprocess_to_that_many_messages_a_second(tmp_path, sqlite_url, broker_url,
                                                               broker, qname):
    docs = store_docs(sqlite_url, 60)
    queue = qname("in")
    config = write_reprocess_config(tmp_path / "chalk.toml", db=sqlite_url, broker=broker_url,
                                    queue=queue)
    started = time.monotonic()
    assert main(["reprocess", "--config", str(config), "--workflow", "Counting",
                 "--rate", "20"]) == 0
    took = time.monotonic() - started
    assert len(_drained(broker, queue)) == len(docs)
    assert 2.7 <= took < 15, took     # parts of 4, 0.2 s apart: the last starts at 2.8 s
    started = time.monotonic()
    assert main(["reprocess", "--config", str(config), "--workflow", "Counting"]) == 0
    assert time.monotonic() - started < took / 2   # no limit
    assert len(_drained(broker, queue)) == len(docs)


@pytest.mark.broker
def test_a_stopped_run_goes_on_from_its_cursor_when_the_command_is_run_again(
        tmp_path, sqlite_url, broker_url, broker, qname, capsys):
    docs = store_docs(sqlite_url, 60)
    queue = qname("in")
    config = write_reprocess_config(tmp_path / "chalk.toml", db=sqlite_url, broker=broker_url,
                                    queue=queue)
    settings = load_settings(config)
    store = ServiceStore.connect(sqlite_url)
    begun = begin(settings, store, workflow="Counting", selection=RunSelection(prefix="doc-"))
    saves = []

    def ctrl_c_after_two_parts(run: Any) -> None:
        saves.append(run.published)
        if len(saves) == 2:
            raise KeyboardInterrupt

    worker = Reprocess(settings, store, begun.run, progress=ctrl_c_after_two_parts, page=8)
    with pytest.raises(KeyboardInterrupt):
        worker.run()
    stopped = store.tables(Runs).read(begun.run.id)
    assert (stopped.state, stopped.published, stopped.cursor) == ("stopped", 16, "doc-015")
    assert "Ctrl-C" in stopped.note
    first = _drained(broker, queue)
    assert len(first) == 16
    assert main(["reprocess", "--config", str(config), "--workflow", "Counting",
                 "--prefix", "doc-"]) == 0
    out = capsys.readouterr()
    assert f"run {begun.run.id}: resuming" in out.err and "16 published" in out.err
    rest = _drained(broker, queue)
    assert not set(first) & set(rest)                       # nothing twice
    assert sorted([*first.values(), *rest.values()]) == sorted(r for r in docs
                                                               if r.startswith("doc-"))
    done = store.tables(Runs).read(begun.run.id)
    assert (done.state, done.published, done.looked) == ("finished", 30, 30)
    assert main(["reprocess", "--config", str(config), "--resume", begun.run.id]) == 2
    assert "finished; nothing to resume" in capsys.readouterr().err
    store.close()


@pytest.mark.broker
def test_a_part_published_but_not_saved_goes_out_again_under_the_same_message_ids(
        tmp_path, sqlite_url, broker_url, broker, qname, monkeypatch, capsys):
    store_docs(sqlite_url, 40)
    queue = qname("in")
    config = write_reprocess_config(tmp_path / "chalk.toml", db=sqlite_url, broker=broker_url,
                                    queue=queue)
    with dying_before_the_second_save(monkeypatch):
        assert main(["reprocess", "--config", str(config), "--workflow", "Counting",
                     "--rate", "50"]) == 130
    run = _run_id(capsys)
    first = _drained(broker, queue)
    assert len(first) == 20                         # two parts of 10 went out
    assert main(["reprocess", "--config", str(config), "--resume", run]) == 0
    again = _drained(broker, queue)
    assert len(again) == 30 and len(set(first) & set(again)) == 10   # the second part again
    assert all(first[m] == again[m] for m in set(first) & set(again))
