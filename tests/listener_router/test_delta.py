"""Delta processing on RabbitMQ and Spark: unchanged records are not run again, a full crawl's
unseen records are deleted through the service, each once; the rule's keys; the crawl's rows."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import publish_ids, stored_attributes, write_test_workflows
from sqlalchemy import create_engine

from listener_router import ConfigError, ListenerRule, RouterRule, load_settings, push_records
from listener_router.cli import main
from listener_router.delta import CrawlMoved, crawl_status, finish, seen_on_push, start
from listener_router.jobs import JobLogTables
from listener_router.reprocess import Reprocess, RunSelection, begin
from listener_router.store import ServiceStore
from listener_router.watch._pages import render
from listener_router.watch._record import record_view

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def _doc(i: int, body: str = "B") -> dict[str, Any]:
    return {"title": f"T{i}", "body": f"{body}{i}"}


def _push(settings: Any, records: list[tuple[str, dict[str, Any]]], source: str,
          per_message: int = 1) -> None:
    push_records(settings, settings.listeners[0].queue,
                 [{"id": rid, "attributes": attrs} for rid, attrs in records],
                 per_message=per_message, source=source,
                 hook=seen_on_push(settings.blackboard_url, source))


def _done(expected: int):
    return lambda s: s["committed"] + s["unchanged"] >= expected


def _routed(broker: Any, queue: str) -> Counter[tuple[str, str]]:
    """(record, operation) of each message routed to ``queue``."""
    found: Counter[tuple[str, str]] = Counter()
    for props, body in broker.drain(queue):
        for record in json.loads(body)["records"]:
            found[(record["id"], props.headers["operation"])] += 1
    return found


@pytest.mark.slow
def test_a_full_crawl_runs_changed_records_skips_unchanged_and_deletes_the_unseen_once(
        make_settings, tmp_path, db_url, run_service, broker, capsys):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, batch_size=20,
                             delta="hash", delta_attributes=("title", "body"))
    settings = settings.with_overrides(blackboard_url=db_url)
    out = settings.routers[0].queue
    store = ServiceStore.connect(db_url)
    r = [f"r{i:02d}" for i in range(30)]

    # crawl 1: every record new, run once; another source's records are not the crawl's
    first, _ = start(settings, store, "web")
    _push(settings, [(rid, _doc(i)) for i, rid in enumerate(r)], "web")
    _push(settings, [(f"x{i}", _doc(i)) for i in range(3)], "other")
    assert finish(settings, store, "web").deletions == 0
    run_service(settings, until=_done(33))
    assert sum(_routed(broker, out).values()) == 33

    # crawl 2: r00-r09 pushed as they were, r10-r19 changed, n0-n4 new (two records a
    # message, unchanged and changed ones together); r20-r23 published by ID only, not
    # pushed (seen when the service receives them); r24-r29 gone from the crawl.  finish
    # runs before the service has taken anything.
    second, _ = start(settings, store, "web")
    pushed = [(rid, _doc(i)) for i, rid in enumerate(r[:10])]
    pushed += [(rid, _doc(i + 10, "changed")) for i, rid in enumerate(r[10:20])]
    pushed += [(f"n{i}", _doc(100 + i)) for i in range(5)]
    order = [pushed[k] for pair in zip(range(10), range(10, 20), strict=True) for k in pair]
    order += pushed[20:]
    _push(settings, order, "web", per_message=2)
    publish_ids(settings, r[20:24])
    with pytest.raises(CrawlMoved):           # one crawl of a source at a time
        start(settings, store, "web")
    done = finish(settings, store, "web")
    assert (done.state, done.deletions, done.seen) == ("finished", 10, 25)  # r20-r29
    assert done.looked == 35             # web's records (r00-r29, n0-n4), not the others

    messages = len(order) // 2 + 1 + 4 + 10
    stats = run_service(settings, until=_done(messages))
    # messages: the 10 pairs each hold a changed record, n0-n4 are 2+2+1; r20-r23 and the
    # four DELETEs of theirs are unchanged; the six other DELETEs run (and delete)
    assert (stats["committed"], stats["unchanged"]) == (10 + 3 + 6, 4 + 4)
    counts = stored_attributes(db_url, [*r, *(f"n{i}" for i in range(5)),
                                        *(f"x{i}" for i in range(3))], ["count"])
    assert {rid for rid, a in counts.items() if a is None} == set(r[24:])
    assert {rid: a["count"] for rid, a in counts.items() if a is not None} == {
        **dict.fromkeys(r[:10] + r[20:24], 1), **dict.fromkeys(r[10:20], 2),
        **{f"n{i}": 1 for i in range(5)}, **{f"x{i}": 1 for i in range(3)}}
    assert _routed(broker, out) == Counter(
        {**{(rid, "ADD"): 1 for rid in r[10:20] + [f"n{i}" for i in range(5)]},
         **{(rid, "DELETE"): 1 for rid in r[24:]}})
    # the history says what a deletion was: committed as deleted (crawl N), or kept
    assert main(["jobs", "--record", "r24", "--blackboard", db_url, "--json"]) == 0
    (received, deleted) = json.loads(capsys.readouterr().out)[-2:]
    assert (received["step"], deleted["step"], deleted["crawl"]) == (
        "received", "deleted", second.id)
    assert main(["jobs", "--record", "r24", "--blackboard", db_url]) == 0
    assert f" deleted (crawl {second.id}) " in capsys.readouterr().out
    assert main(["jobs", "--record", "r20", "--state", "unchanged", "--blackboard",
                 db_url]) == 0
    assert f" unchanged (crawl {second.id}) " in capsys.readouterr().out
    page = render("record.html", r=record_view(store, "r24"))
    assert f'<td class="step">deleted (crawl {second.id})</td>' in page
    (row, older) = crawl_status(store, source="web")
    assert (row["crawl"], older["crawl"]) == (second.id, first.id)
    assert {k: row[k] for k in ("state", "deletions", "deleted", "kept", "pending")} == {
        "state": "finished", "deletions": 10, "deleted": 6, "kept": 4, "pending": 0}
    tables = JobLogTables(create_engine(db_url))
    unchanged = tables.entries(states=["unchanged"], limit=100)
    assert len(unchanged) == 8 and {e.records for e in unchanged} == {1}

    # the commands: status as a table and as JSON, a crawl restarted
    capsys.readouterr()
    assert main(["delta", "status", "--blackboard", db_url, "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)
    assert [(x["crawl"], x["state"]) for x in lines] == [(second.id, "finished"),
                                                          (first.id, "finished")]
    third, _ = start(settings, store, "web")
    fourth, abandoned = start(settings, store, "web", restart=True)
    assert abandoned is not None and abandoned.id == third.id and fourth.id > third.id
    assert crawl_status(store, source="web")[1]["state"] == "abandoned"
    store.close()


@pytest.mark.slow
def test_unchanged_records_are_routed_as_stored_when_the_rule_says_route(
        make_settings, tmp_path, run_service, broker):
    """Every attribute is the content (no delta_attributes): the attribute the workflow adds
    (count) does not make a record pushed again unchanged look changed."""
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, delta="hash",
                             delta_unchanged="route")
    out = settings.routers[0].queue
    settings = dataclasses.replace(settings, routers=(RouterRule(queue=out,
                                                                 attributes=("count",)),))
    docs = [(f"d{i}", {"text": f"t{i}", "n": i}) for i in range(10)]
    _push(settings, docs, "web")
    run_service(settings, until=_done(10))
    broker.drain(out)
    docs[3] = ("d3", {"text": "t3", "n": 3.0})     # 3.0 is not 3
    _push(settings, docs, "web", per_message=5)
    stats = run_service(settings, until=_done(2))
    assert (stats["committed"], stats["unchanged"]) == (1, 1)
    routed = [json.loads(body)["records"][0] for _p, body in broker.drain(out)]
    assert sorted((x["id"], x["attributes"]["count"]) for x in routed) == sorted(
        [(f"d{i}", 1) for i in range(10) if i != 3] + [("d3", 2)])


def test_delta_keys_are_read_checked_and_listed_with_the_listener_rule(tmp_path):
    path = tmp_path / "chalk.toml"
    path.write_text('[[listener]]\nqueue = "in"\nworkflow = "W"\ndelta = "hash"\n'
                    'delta_attributes = ["title", "body"]\ndelta_unchanged = "route"\n\n'
                    '[[listener]]\nqueue = "in2"\nworkflow = "W"\n')
    first, second = load_settings(path).listeners
    assert (first.delta, first.delta_attributes, first.delta_unchanged) == (
        "hash", ("title", "body"), "route")
    assert first.extra("delta").content.attributes == {"title", "body"}
    assert not second.extra("delta").on and second.extras == ()
    path.write_text('[[listener]]\nqueue = "in"\nworkflow = "W"\n'
                    'delta_attributes = ["title"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value).startswith(f"{path}:1: [[listener]] #1: delta_attributes")
    path.write_text('[[listener]]\nqueue = "in"\nworkflow = "W"\ndelta = "md5"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert f"{path}:4:" in str(caught.value) and '"hash"' in str(caught.value)
    reference = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "| `delta_unchanged` |" in reference and "the `delta` plug-in's keys" in reference


@pytest.mark.slow
def test_reprocessing_through_a_rule_of_its_own_runs_records_a_delta_rule_finds_unchanged(
        make_settings, tmp_path, qname, run_service):
    """operations.md: a rule with condition = "$reprocess" before the delta rule on the queue
    runs reprocessed records, which the delta rule would settle as unchanged."""
    workflows = write_test_workflows(tmp_path / "workflows")
    queue = qname("in")
    rules = (ListenerRule(name="again", queue=queue, workflow="Counting",
                          condition="$reprocess", max_wait_ms=100),
             ListenerRule(name="crawl", queue=queue, workflow="Counting", max_wait_ms=100,
                          delta="hash"))
    settings = make_settings("Counting", workflows_dir=workflows, rules=rules)
    docs = [(f"d{i}", {"text": f"t{i}"}) for i in range(6)]
    _push(settings, docs, "web")
    run_service(settings, until=_done(6))
    _push(settings, docs, "web")                       # the same content: unchanged
    assert run_service(settings, until=_done(6))["unchanged"] == 6
    store = ServiceStore.connect(settings.blackboard_url)
    begun = begin(settings, store, workflow="Counting", selection=RunSelection(source="web"),
                  queue=queue)
    Reprocess(settings, store, begun.run).run()
    stats = run_service(settings, until=_done(6))
    store.close()
    assert (stats["committed"], stats["unchanged"]) == (6, 0)
    counts = stored_attributes(settings.blackboard_url, [d for d, _a in docs], ["count"])
    assert {a["count"] for a in counts.values()} == {2}
