"""``chalk run``'s summary counts every outcome; ``chalk jobs`` filters exactly (``--state`` shows those steps and no others, ``--limit N``
prints N rows), its help names every step; ``chalk status`` says what its window is;
``chalk delta`` refuses a queue without a delta rule, abandons a crawl, and counts and
words a finish truly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from listener_router_helpers import write_config, write_test_workflows

from listener_router import Service, load_settings, push_records
from listener_router.cli import build_parser, main

pytestmark = [pytest.mark.broker]

CHALK = Path(sys.executable).parent / "chalk"


def _rows(capsys) -> tuple[str, list[str], list[list[str]]]:
    """A piped table: its title, its header's columns, its rows split into those columns."""
    title, header, *lines = capsys.readouterr().out.splitlines()
    starts = [header.index(name) for name in header.split("  ") if name.strip()]
    names = header.split()
    cut = [[line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
           for line in lines]
    return title, names, cut


def _project(tmp_path: Path, broker_url: str, *listeners: dict) -> Path:
    """A chalk.toml in ``tmp_path``: the test workflows, runner local, these rules."""
    workflows = write_test_workflows(tmp_path / "workflows")
    return write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=workflows, engine={"runner": "local"}, listeners=listeners, routers=[])


def _fragile(tmp_path: Path, broker_url: str, queue: str) -> Path:
    return _project(tmp_path, broker_url, {"name": "t", "queue": queue, "workflow": "Fragile",
                                           "max_retries": 1, "backoff_ms": [50],
                                           "max_wait_ms": 50})


def test_state_shows_only_those_steps_and_limit_counts_the_rows_printed(
        tmp_path, capsys, broker_url, qname, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    queue = qname("in")
    config = _fragile(tmp_path, broker_url, queue)
    c = ["--config", str(config)]
    settings = load_settings(config, env={})
    push_records(settings, queue, [{"id": "bad", "attributes": {"fail": True}}]
                 + [{"id": f"good-{i}", "attributes": {}} for i in range(3)])
    with Service(settings) as service:
        service.run(until=lambda s: s["dead"] >= 1 and s["committed"] >= 3, idle_exit=60)
    # bad: received, retrying, received, dead; each good one: received, committed

    assert main(["jobs", "--state", "dead", *c]) == 0
    title, columns, rows = _rows(capsys)
    assert title == "job log: 1 step(s), oldest first" and columns[:2] == ["when", "step"]
    assert [r[1] for r in rows] == ["dead"]
    assert main(["jobs", "--state", "dead,retrying", "--json", *c]) == 0
    assert [s["step"] for s in json.loads(capsys.readouterr().out)] == ["retrying", "dead"]
    assert main(["jobs", "--state", "received", *c]) == 0
    assert [r[1] for r in _rows(capsys)[2]] == ["received"] * 5

    assert main(["jobs", "--limit", "3", *c]) == 0
    title, _columns, rows = _rows(capsys)
    assert title == "job log: 3 step(s), oldest first" and len(rows) == 3
    assert main(["jobs", "--limit", "10", *c]) == 0
    assert len(_rows(capsys)[2]) == 10          # every step there is
    assert main(["jobs", "--state", "committed", "--limit", "2", "--json", *c]) == 0
    assert [s["step"] for s in json.loads(capsys.readouterr().out)] == ["committed"] * 2

    assert main(["jobs", "--state", "cancel", *c]) == 2
    err = capsys.readouterr().err
    assert "--state 'cancel': not a step" in err and "did you mean 'cancelled'?" in err
    helped = build_parser()._subparsers._group_actions[0].choices["jobs"].format_help()
    for step in ("cancelled", "purged", "received", "deleted", "unchanged"):
        assert step in helped, step

    # a purged dead letter is found by --state purged, still as its dead step
    assert main(["dlq", "purge", "--all", "--yes", *c]) == 0
    capsys.readouterr()
    assert main(["jobs", "--state", "purged", *c]) == 0
    (row,) = _rows(capsys)[2]
    assert row[1].startswith("dead (purged 20")


def test_status_says_its_statistics_window_and_the_view_in_words(
        tmp_path, capsys, broker_url, qname):
    config = _fragile(tmp_path, broker_url, qname("in"))
    assert main(["status", "--since", "2h", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "(the window's start: --since) until now: nothing ran" in out
    assert "statistics since" not in out
    assert " of 0 member(s)" not in out and "has 0 member(s)" in out


def test_delta_start_refuses_a_queue_without_a_delta_rule_abandon_ends_a_crawl_and_finish_counts_the_source(
        tmp_path, capsys, broker_url, qname, declare):
    crawl_in, plain = qname("crawl"), qname("plain")
    config = _project(tmp_path, broker_url,
                      {"name": "crawl", "queue": crawl_in, "workflow": "Counting",
                       "delta": "hash"},
                      {"name": "plain", "queue": plain, "workflow": "Counting"})
    c = ["--config", str(config)]
    settings = load_settings(config, env={})
    declare(settings)

    assert main(["delta", "start", "web", "--queue", plain, *c]) == 2
    err = capsys.readouterr().err
    assert f'delta = "hash" reads {plain!r}' in err and crawl_in in err

    # 100 records of web, 200 of another source: the finish looks at web's 100
    push_records(settings, crawl_in, [{"id": f"w{i:03d}", "attributes": {}} for i in range(100)],
                 source="web")
    push_records(settings, crawl_in, [{"id": f"o{i:03d}", "attributes": {}} for i in range(200)],
                 source="other")
    assert main(["delta", "start", "web", *c]) == 0
    assert main(["delta", "abandon", "web", *c]) == 0
    assert "abandoned: nothing more is deleted for it" in capsys.readouterr().out
    assert main(["delta", "abandon", "web", *c]) == 2
    assert "no crawl of source 'web' is running" in capsys.readouterr().err
    assert main(["delta", "status", "web", "--json", *c]) == 0
    assert [r["state"] for r in json.loads(capsys.readouterr().out)] == ["abandoned"]

    assert main(["delta", "start", "web", *c]) == 0
    assert main(["push", "--id", "w000", "--source", "web", "--queue", crawl_in, *c]) == 0
    capsys.readouterr()
    assert main(["delta", "finish", "web", *c]) == 0
    out = capsys.readouterr().out
    assert ("1 record(s) seen in the crawl, 100 stored record(s) of the source looked at, "
            f"99 DELETE message(s) published to {crawl_in}") in out
    assert "the service deletes those records" in out

    assert main(["delta", "start", "web", *c]) == 0
    ids = [f"w{i:03d}" for i in range(100)]
    assert main(["push", *(x for i in ids for x in ("--id", i)), "--source", "web",
                 "--queue", crawl_in, *c]) == 0
    capsys.readouterr()
    assert main(["delta", "finish", "web", *c]) == 0
    out = capsys.readouterr().out
    assert "0 DELETE message(s)" in out and "the service deletes" not in out
    assert "nothing to delete: the crawl saw every stored record of web" in out


def _run_summary(config: Path, tmp_path: Path) -> dict[str, int]:
    """``chalk run --idle-exit`` to its end; its summary line as numbers."""
    done = subprocess.run([str(CHALK), "run", "--config", str(config), "--idle-exit", "3"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    return {k: int(v) for k, v in (part.split("=") for part in line.split(", "))}


@pytest.mark.slow
def test_the_run_summary_counts_every_outcome_and_they_add_up_to_received(
        tmp_path, capsys, broker_url, qname):
    queue = qname("in")
    config = _project(tmp_path, broker_url, {"name": "t", "queue": queue,
                                             "workflow": "Counting", "delta": "hash",
                                             "max_wait_ms": 50})
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "attributes": {"n": i}}) + "\n"
                            for i in range(6)))
    assert main(["push", str(data), "--config", str(config)]) == 0
    first = _run_summary(config, tmp_path)
    assert (first["received"], first["committed"], first["records_committed"]) == (6, 6, 6)

    # the same crawl again: unchanged, and one of its messages cancelled
    capsys.readouterr()
    assert main(["push", str(data), "--ids", "--config", str(config)]) == 0
    cancelled = capsys.readouterr().out.split()[0]
    assert main(["jobs", "cancel", cancelled, "--config", str(config)]) == 0
    second = _run_summary(config, tmp_path)
    outcomes = {k: v for k, v in second.items()
                if k not in ("received", "records_committed", "batches")}
    assert {k: v for k, v in outcomes.items() if v} == {"unchanged": 5, "cancelled": 1}
    assert {"committed", "duplicate", "retrying", "dead", "cancelled", "deferred"} <= set(outcomes)
    assert sum(outcomes.values()) == second["received"] == 6


def test_reprocess_list_shows_a_finished_runs_records_as_all_it_looked_at(
        tmp_path, capsys, broker_url, qname):
    queue = qname("in")
    config = _project(tmp_path, broker_url, {"name": "t", "queue": queue,
                                             "workflow": "Counting"})
    settings = load_settings(config, env={})
    # 10 records of the prefix among 300 stored: the walk ends after the prefix's 10
    push_records(settings, queue, [{"id": f"doc-{i:02d}", "attributes": {}} for i in range(10)]
                 + [{"id": f"zz-{i:03d}", "attributes": {}} for i in range(290)])
    assert main(["reprocess", "--workflow", "Counting", "--prefix", "doc-", "--config",
                 str(config)]) == 0
    capsys.readouterr()
    assert main(["reprocess", "--list", "--config", str(config)]) == 0
    title, header, row = capsys.readouterr().out.splitlines()
    assert title == "reprocess runs, newest first"
    looked = row[header.index("looked at"):header.index("published")].strip()
    assert looked == "10 (all)"
    assert "/ 300" not in row and "100%" not in row
