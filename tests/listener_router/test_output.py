"""One output convention, held for every command that lists or reports (docs/guide.md,
"Output for scripts"): ``--json`` prints one JSON document (an array for a listing, an
object for a report), ``--json-lines`` one object a line; times are ISO 8601 with their
offset, never epoch seconds.  Each output is parsed with the standard library alone:
``json.loads`` of the whole, and of each line.  In a pipe a table is a title line, a header
line and one line a row, with no box drawing."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import write_config, write_test_workflows

from listener_router import Service, load_settings, push_records
from listener_router.cli import main

pytestmark = [pytest.mark.broker]

# key → a time (ISO 8601 with offset) wherever it appears, when not null
TIME_KEYS = {"at", "died", "since", "until", "changed_at", "loaded_at", "resolved_at",
             "started_at", "finishing_at", "finished_at", "updated_at", "published_at"}
CHALK = Path(sys.executable).parent / "chalk"
BOX = set("─│┃━┏┓┗┛┡┩└┘┌┐├┤┬┴┼╭╮╰╯═║")


def _check_times(value: Any, where: str) -> int:
    """Every time is ISO 8601 with its offset; no number looks like epoch seconds.  Returns
    how many times were seen."""
    seen = 0
    if isinstance(value, dict):
        for key, item in value.items():
            if key in TIME_KEYS and isinstance(item, str):
                assert dt.datetime.fromisoformat(item).tzinfo is not None, (where, key, item)
                seen += 1
            elif key not in ("body", "headers"):   # a message's own content is its own
                seen += _check_times(item, f"{where}.{key}")
    elif isinstance(value, list):
        seen += sum(_check_times(item, where) for item in value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        assert not 1e9 < value < 1e11, f"{where}: {value} looks like epoch seconds"
    return seen


def _run(capsys: Any, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, (argv, captured.err)
    return captured.out


def _both(capsys: Any, argv: list[str]) -> tuple[Any, list[Any]]:
    """``argv`` with --json (parsed whole) and with --json-lines (parsed line by line)."""
    whole = json.loads(_run(capsys, [*argv, "--json"]))
    lines = [json.loads(line) for line in _run(capsys, [*argv, "--json-lines"]).splitlines()]
    return whole, lines


def test_every_listing_prints_one_document_with_json_and_a_line_each_with_json_lines(
        tmp_path, capsys, broker_url, qname, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    workflows = write_test_workflows(tmp_path / "workflows")
    queue, out, nightly, stream = qname("in"), qname("out"), qname("nightly"), qname("journal")
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    config = write_config(
        tmp_path / "chalk.toml", db=db, broker=broker_url, workflows=workflows,
        engine={"runner": "local"}, events={"committed": True},
        listeners=[{"name": "t", "queue": queue, "workflow": "Fragile", "max_retries": 0,
                    "max_wait_ms": 50, "delta": "hash"}],
        routers=[{"queue": out, "attributes": ["title"]}])
    with open(config, "a") as f:
        f.write(f'\n[[schedule]]\nname = "nightly"\nevery = "1d"\nqueue = "{nightly}"\n'
                f'ids = ["good-1"]\n[[journal]]\nname = "j"\nstream = "{stream}"\n')
    c = ["--config", str(config)]
    settings = load_settings(config, env={})

    # what there is to list: a committed and a dead message, a crawl, a reprocess run, a
    # cancellation, the message IDs of a push
    assert main(["delta", "start", "web", *c]) == 0
    pushed = json.loads(_run(capsys, ["push", "--id", "good-1", "--id", "bad-1",
                                      "--queue", queue, "--json", *c]))
    assert set(pushed) == {"queue", "records", "messages"} and pushed["records"] == 2
    lines = _run(capsys, ["push", "--id", "good-2", "--json-lines", *c]).splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["queue"] == queue
    push_records(settings, queue, [{"id": "good-1", "attributes": {"title": "a"}},
                                   {"id": "bad-1", "attributes": {"fail": True}}])
    events = subprocess.Popen(
        [str(CHALK), "events", "--follow", "--count", "1", "--json", *c],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert "following" in events.stderr.readline()
        with Service(settings) as service:
            service.run(until=lambda s: s["dead"] >= 1 and s["committed"] >= 1, idle_exit=60)
        followed, err = events.communicate(timeout=120)
    finally:
        events.kill()
    assert events.returncode == 0, err
    found = json.loads(followed)
    assert isinstance(found, list) and len(found) == 1, followed
    assert _check_times(found, "events") == 1
    assert main(["reprocess", "--workflow", "Fragile", "--prefix", "good-", *c]) == 0
    assert main(["jobs", "cancel", "--ahead", "not-yet-published", *c]) == 0

    listings = [["jobs"], ["jobs", "cancellations"], ["dlq", "list"], ["dlq", "show"],
                ["schedules"], ["queue", "list"], ["reprocess", "--list"],
                ["delta", "status"],
                ["journal", "errors", "--journal", "j", "--subscriber", "s", "--store",
                 f"sqlite:///{tmp_path / 'sub.db'}"]]
    for argv in listings:
        whole, lines = _both(capsys, [*argv, *c])
        assert isinstance(whole, list), argv
        assert whole or argv[0] == "journal", argv   # no subscriber has failed anything
        assert whole == lines, argv
        _check_times(whole, " ".join(argv))
    # a listing with nothing in it is an empty array, and no line
    assert _both(capsys, ["jobs", "--state", "crashed", *c]) == ([], [])

    for argv in (["status"], ["journal", "status"]):   # reports: one object, on one line
        text = _run(capsys, [*argv, "--json", *c])
        assert text.count("\n") == 1, argv
        report = json.loads(text)
        assert isinstance(report, dict), argv
        (line,) = [json.loads(x) for x in _run(capsys, [*argv, "--json-lines", *c]).splitlines()]
        assert set(line) == set(report)
        _check_times(report, " ".join(argv))

    # --follow streams: JSON Lines only
    assert main(["jobs", "--follow", "--json", *c]) == 2
    assert "--json-lines" in capsys.readouterr().err

    # piped, every listing is a title line, a header line and a line a row, no box drawing
    for argv in listings:
        text = _run(capsys, [*argv, *c])
        if argv[:2] == ["dlq", "show"]:   # a letter in words, its history a table
            assert "history" in text and not text.lstrip().startswith("{")
            continue
        rows = text.splitlines()
        assert len(rows) >= (2 if argv[0] == "journal" else 3), (argv, text)
        assert not BOX & set(text), (argv, text)
        header = rows[1].split()
        assert header and not any(ch.isdigit() for ch in rows[1]), (argv, rows[1])


def test_jobs_json_is_one_document_that_json_tool_reads(tmp_path, broker_url, qname):
    """The newcomer's own check: ``chalk jobs --json | python -m json.tool`` works."""
    workflows = write_test_workflows(tmp_path / "workflows")
    queue = qname("in")
    config = write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=workflows, engine={"runner": "local"},
        listeners=[{"name": "t", "queue": queue, "workflow": "Counting", "max_wait_ms": 50}],
        routers=[])
    settings = load_settings(config, env={})
    push_records(settings, queue, [{"id": f"r{i}", "attributes": {}} for i in range(3)])
    with Service(settings) as service:
        service.run(until=lambda s: s["committed"] >= 3, idle_exit=60)
    started = time.monotonic()
    done = subprocess.run(
        f"{CHALK} jobs --json --config {config} "
        f"| {sys.executable} -m json.tool", shell=True, capture_output=True, text=True,
        timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)
    assert [s["step"] for s in steps].count("committed") == 3
    assert time.monotonic() - started < 120
