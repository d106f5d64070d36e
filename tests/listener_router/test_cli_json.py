"""The operator commands in a pipe and with ``--json``: whole rows at any width, the JSON
shapes docs/guide.md documents, one numbering of attempts, and status counting the dead
letters that wait (in ``Q.dlq`` or moved into the store)."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pytest
from listener_router_helpers import bind_subscriber, write_test_workflows

from listener_router import Service, push_records
from listener_router.broker import dlq_name
from listener_router.cli import main
from listener_router.cli._show import Out, plain_rows
from listener_router.events import EventSettings

pytestmark = [pytest.mark.broker]


def _iso(value: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(value)
    assert when.tzinfo is not None, value      # with its offset
    return when


def _lines(capsys) -> list[dict]:
    """A listing printed with --json: one array."""
    return json.loads(capsys.readouterr().out)


def _config(path: Path, settings, extra: str = "") -> Path:
    rule = settings.listeners[0]
    path.write_text(f'[blackboard]\nurl = "{settings.blackboard_url}"\n'
                    f'[broker]\nurl = "{settings.broker_url}"\n'
                    f'[workflows]\ndir = "{settings.workflows_dir}"\n'
                    f'[[listener]]\nname = "t"\nqueue = "{rule.queue}"\n'
                    f'workflow = "{rule.workflow}"\n{extra}')
    return path


def test_a_table_in_a_pipe_keeps_every_row_whole_on_one_line():
    long = "x" * 300
    lines = plain_rows(["queue", "workflow", "committed"], [["q.in", long, 3], ["q2", "W", 12]],
                       right=("committed",))
    assert lines == ["queue  " + "workflow".ljust(300) + "  committed",
                     f"q.in   {long}          3",
                     "q2     " + "W".ljust(300) + "         12"]
    out = io.StringIO()           # not a terminal: no box drawing, no cut, no wrap
    Out(file=out).table("statistics", ["queue", "workflow p50/p99"], [["q", "1 ms / 2 ms"]])
    assert out.getvalue() == "statistics\nqueue  workflow p50/p99\nq      1 ms / 2 ms\n"
    out = io.StringIO()
    for form in ("json", "json-lines"):
        Out(form, file=out).table("ignored", ["a"], [["b"]])
        Out(form, file=out).text("prose is not data")
    assert out.getvalue() == ""


def test_attempts_count_from_one_in_the_log_the_dead_letter_and_the_events(
        tmp_path, capsys, make_settings, broker, qname):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Fragile", workflows_dir=workflows, max_retries=1,
                             backoff_ms=(50,)).with_overrides(runner="local").with_section(
        "events", EventSettings(invalidated=True, dead_lettered=True))
    queue = settings.listeners[0].queue
    events = qname("events")
    bind_subscriber(broker.url, events)
    push_records(settings, queue, [{"id": "bad", "attributes": {"fail": True}},
                                   {"id": "good", "attributes": {}}])
    with Service(settings) as service:
        service.run(until=lambda s: s["dead"] >= 1 and s["committed"] >= 1, idle_exit=60)
    config = _config(tmp_path / "chalk.toml", settings)

    # the broker's view: two attempts made, and the reason says so
    ((props, body),) = broker.drain(dlq_name(queue))
    assert props.headers["x-chalk-attempts"] == 2
    assert props.headers["x-chalk-error"].endswith("(after 2 attempt(s))")
    broker.publish(dlq_name(queue), body, message_id=props.message_id, headers=props.headers)

    assert main(["jobs", "--record", "bad", "--json", "--config", str(config)]) == 0
    steps = _lines(capsys)
    assert [(s["step"], s["attempt"]) for s in steps] == [
        ("received", 1), ("retrying", 1), ("received", 2), ("dead", 2)]
    assert set(steps[-1]) == {"at", "step", "message_id", "queue", "attempt", "replay",
                              "workflow", "member", "record", "record_count", "outgoing", "batch",
                              "seconds", "reason", "resolved", "resolved_at", "crawl"}
    assert steps[-1]["record"] == "bad" and steps[-1]["record_count"] == 1
    assert "asked to fail" in steps[-1]["reason"] and _iso(steps[-1]["at"])
    assert main(["jobs", "--record", "bad", "--config", str(config)]) == 0
    title, header, *rows = capsys.readouterr().out.splitlines()
    at = header.index("attempt")
    assert title == "job log: 4 step(s), oldest first"
    assert [row[at:].split()[0] for row in rows] == ["1", "1", "2", "2"]

    assert main(["dlq", "list", "--json", "--config", str(config)]) == 0
    (letter,) = _lines(capsys)
    assert set(letter) == {"queue", "message_id", "attempts", "workflow", "died", "records",
                           "error"}
    assert (letter["queue"], letter["attempts"], letter["workflow"], letter["records"]) == (
        queue, 2, "Fragile", ["bad"])
    _iso(letter["died"])
    short = letter["message_id"].split(":")[-1][:8]
    assert main(["dlq", "show", short, "--json", "--config", str(config)]) == 0
    (shown,) = _lines(capsys)
    assert set(shown) == {"queue", "message_id", "error", "attempts", "workflow", "records",
                          "history", "headers", "body"}
    assert [(h["state"], h["attempt"]) for h in shown["history"]] == [("retrying", 1),
                                                                     ("dead", 2)]
    assert all(_iso(h["at"]) for h in shown["history"])
    assert shown["attempts"] == shown["headers"]["x-chalk-attempts"] == 2
    assert shown["body"] == {"records": [{"id": "bad"}]}

    found = {}
    for _props, body in broker.drain(events):
        content = json.loads(body)
        found.setdefault(content["event"], []).append(content["attempt"])
    assert found == {"record.invalidated": [1, 2], "message.dead_lettered": [2]}


def test_status_counts_dead_letters_moved_into_the_store_and_prints_json(
        tmp_path, capsys, make_settings, broker, declare):
    settings = make_settings()
    queue = settings.listeners[0].queue
    declare(settings)
    for n in range(3):
        broker.publish(dlq_name(queue), b'{"id": "x"}', message_id=f"dead-{n}",
                       headers={"x-chalk-error": "it broke", "x-chalk-attempts": 1})
    config = _config(tmp_path / "chalk.toml", settings,
                     '[[schedule]]\nname = "nightly"\nevery = "1d"\nqueue = "q.nightly"\n'
                     'ids = ["a"]\n')

    def dlq_row() -> dict:
        assert main(["status", "--json", "--config", str(config)]) == 0
        report = json.loads(capsys.readouterr().out)
        assert set(report) == {"queues", "broker_error", "lanes", "store", "cluster",
                               "workflows", "statistics"}
        return next(q for q in report["queues"] if q["queue"] == dlq_name(queue))

    assert dlq_row() == {"queue": dlq_name(queue), "role": "dead letters", "messages": 3,
                         "queued": 3, "kept": 0, "committed_per_second": None}
    assert main(["dlq", "list", "--config", str(config)]) == 0     # moves them into the store
    capsys.readouterr()
    assert broker.depth(dlq_name(queue)) == 0
    assert dlq_row()["messages"] == 3 and dlq_row()["kept"] == 3
    assert main(["status", "--config", str(config)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith(dlq_name(queue)))
    assert row.split()[1:] == ["3", "(3", "kept", "in", "the", "store)"]

    assert main(["status", "--json", "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["store"]) == {"url", "records", "processed_messages",
                                    "unsent_outbox_messages", "leases"}
    assert set(report["cluster"]) == {"id", "leader", "epoch", "view", "view_members",
                                      "members"}
    assert set(report["statistics"]) == {"since", "rows"} and _iso(report["statistics"]["since"])

    assert main(["schedules", "--json", "--config", str(config)]) == 0
    (schedule,) = _lines(capsys)
    assert set(schedule) == {"schedule", "when", "publishes", "queue", "workflow", "last",
                             "skipped", "next", "due", "running", "catch_up"}
    assert (schedule["schedule"], schedule["queue"], schedule["last"]) == (
        "nightly", "q.nightly", None)
    assert main(["schedules", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2].startswith("nightly ")   # title, header, one row


def test_a_short_message_id_finds_its_dead_letter_unless_it_starts_several(
        tmp_path, capsys, make_settings, broker, declare):
    settings = make_settings()
    queue = settings.listeners[0].queue
    declare(settings)
    for mid in ("push:7bdb77b1c2d3", "push:7bdb77f0a1b2", "other-1"):
        broker.publish(dlq_name(queue), b'{"id": "x"}', message_id=mid,
                       headers={"x-chalk-error": f"{mid} broke"})
    config = _config(tmp_path / "chalk.toml", settings)
    assert main(["dlq", "show", "7bdb77b1", "--json", "--config", str(config)]) == 0
    assert [d["message_id"] for d in _lines(capsys)] == ["push:7bdb77b1c2d3"]
    assert main(["dlq", "show", "push:7bdb77f", "--json", "--config", str(config)]) == 0
    assert [d["message_id"] for d in _lines(capsys)] == ["push:7bdb77f0a1b2"]
    assert main(["dlq", "show", "7bdb77", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "'7bdb77' starts 2 dead letters' message IDs" in err
    assert "push:7bdb77b1c2d3" in err and "push:7bdb77f0a1b2" in err
    assert main(["dlq", "show", "7bdb77_", "--config", str(config)]) == 1   # _ is no wildcard
    capsys.readouterr()
    assert main(["dlq", "replay", "7bdb77b1", "--config", str(config)]) == 0
    assert "replayed 1 dead letter(s)" in capsys.readouterr().out
    ((props, _body),) = broker.drain(queue)
    assert props.message_id == "push:7bdb77b1c2d3"
