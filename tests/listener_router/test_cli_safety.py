"""Commands that cannot strand or destroy work by accident: ``chalk push`` publishes where a
listener reads, ``chalk dlq replay|purge`` act on all only when told twice, ``chalk jobs
cancel`` refuses an ID Chalk does not know, lists what is in force, and a record's
cancellation ends with the messages queued when it was made."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from listener_router_helpers import stored_counts, write_config, write_test_workflows

from listener_router import Service, load_settings, push_records
from listener_router.broker import dlq_name
from listener_router.cli import main

pytestmark = [pytest.mark.broker]

CHALK = Path(sys.executable).parent / "chalk"


def _records(path: Path, ids: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": rid, "attributes": {}}) + "\n" for rid in ids))
    return path


def _on_a_terminal(argv: list[str], typed: str) -> str:
    """``chalk ARGV`` with a terminal for its stdin and stdout, ``typed`` at its prompt;
    what it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([str(CHALK), *argv], stdin=follower, stdout=follower,
                            stderr=follower, close_fds=True)
    os.close(follower)
    seen = b""
    try:
        while b"[y/N]" not in seen and proc.poll() is None:
            if select.select([leader], [], [], 60)[0]:
                seen += os.read(leader, 4096)
        os.write(leader, typed.encode())
        proc.wait(timeout=120)
        while select.select([leader], [], [], 0.2)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:   # the other end is closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        proc.kill()
        os.close(leader)
    return seen.decode(errors="replace")


def _config(tmp_path: Path, broker_url: str, queues: list[str], **sections) -> Path:
    workflows = write_test_workflows(tmp_path / "workflows")
    return write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=workflows, engine={"runner": "local"},
        listeners=[{"name": f"l{i}", "queue": q, "workflow": "Counting", "max_wait_ms": 50}
                   for i, q in enumerate(queues)], routers=[], **sections)


def test_push_goes_to_the_only_listened_queue_asks_among_several_and_refuses_a_stray_one(
        tmp_path, capsys, broker, broker_url, qname):
    crawl, other, stray = qname("crawl"), qname("other"), qname("stray")
    data = _records(tmp_path / "records.jsonl", ["a", "b"])
    one = _config(tmp_path, broker_url, [crawl])
    assert main(["push", str(data), "--config", str(one)]) == 0
    assert f"pushed 2 record(s) in 2 message(s) to {crawl}" in capsys.readouterr().out
    assert broker.depth(crawl) == 2

    assert main(["push", str(data), "--queue", stray, "--config", str(one)]) == 2
    err = capsys.readouterr().err
    assert f"no listener rule of {one} reads {stray!r}" in err and "--force" in err
    assert main(["push", str(data), "--queue", stray, "--force", "--config", str(one)]) == 0
    capsys.readouterr()
    assert broker.depth(stray) == 2

    two = _config(tmp_path / "two", broker_url, [crawl, other])
    assert main(["push", str(data), "--config", str(two)]) == 2
    err = capsys.readouterr().err
    assert f"listens on 2 queues ({crawl}, {other}): say which with --queue" in err
    assert main(["push", str(data), "--queue", other, "--config", str(two)]) == 0
    assert broker.depth(other) == 2


def test_push_prints_the_message_ids_that_cancel_takes_and_cancel_refuses_one_it_never_saw(
        tmp_path, capsys, broker, broker_url, qname):
    queue = qname("in")
    config = str(_config(tmp_path, broker_url, [queue]))
    data = _records(tmp_path / "records.jsonl", ["a", "b", "c"])
    assert main(["push", str(data), "--ids", "--config", config]) == 0
    printed = capsys.readouterr()
    ids = printed.out.split()
    assert len(ids) == 3 and all(i.startswith("push:") for i in ids)
    assert "pushed 3 record(s)" in printed.err            # the summary, off the ID list
    assert [props.message_id for props, _body in broker.drain(queue)] == ids
    assert main(["push", str(data), "--ids", "--json", "--config", config]) == 2
    capsys.readouterr()

    assert main(["jobs", "cancel", "push:doesnotexist", "--config", config]) == 2
    err = capsys.readouterr().err
    assert "no message push:doesnotexist is known" in err and "--ahead" in err
    assert main(["jobs", "cancel", ids[0], "push:doesnotexist", "--config", config]) == 2
    capsys.readouterr()
    assert main(["jobs", "cancel", ids[0], "--config", config]) == 0
    said = capsys.readouterr().out
    assert f"cancelled message {ids[0]} (1 new cancellation(s))" in said
    assert "cancelled 1 cancellation(s)" not in said
    assert main(["jobs", "cancel", "batch-42", "--ahead", "--config", config]) == 0
    assert main(["jobs", "cancel", "--record", "doc-9", "--config", config]) == 0
    capsys.readouterr()

    assert main(["jobs", "cancellations", "--json", "--config", config]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(c["kind"], c["value"]) for c in listed] == [
        ("message", ids[0]), ("message", "batch-42"), ("queued", "doc-9")]
    assert listed[2]["ends"] == "with the messages queued then"
    assert main(["jobs", "cancellations", "--config", config]) == 0
    title, header, *rows = capsys.readouterr().out.splitlines()
    assert title == "cancellations in force, oldest first: 3" and header.startswith("cancelled")
    assert rows[0].startswith(f"message {ids[0]} ")
    assert main(["jobs", "uncancel", "batch-42", "--config", config]) == 0
    assert "withdrew 1 cancellation(s)" in capsys.readouterr().out
    assert main(["jobs", "uncancel", "batch-42", "--config", config]) == 1
    assert "no such cancellation is in force" in capsys.readouterr().err
    assert main(["jobs", "uncancel", "--all", "--config", config]) == 0
    assert "withdrew 2 cancellation(s): none is in force now" in capsys.readouterr().out
    assert main(["jobs", "cancellations", "--json", "--config", config]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_replay_and_purge_of_every_dead_letter_take_all_and_a_yes(
        tmp_path, capsys, broker, broker_url, qname, declare):
    queue = qname("in")
    config = str(_config(tmp_path, broker_url, [queue]))
    declare(load_settings(config, env={}))
    for n in range(3):
        broker.publish(dlq_name(queue), b'{"id": "x"}', message_id=f"dead-{n}",
                       headers={"x-chalk-error": "it broke", "x-chalk-attempts": 1})

    def letters() -> list[str]:
        assert main(["dlq", "list", "--json", "--config", config]) == 0
        return [d["message_id"] for d in json.loads(capsys.readouterr().out)]

    for action in ("replay", "purge"):
        assert main(["dlq", action, "--config", config]) == 2
        err = capsys.readouterr().err
        assert "give a message ID" in err and "or --all for every dead letter" in err
        assert "(3 now)" in err
    assert letters() == ["dead-0", "dead-1", "dead-2"]

    # on a terminal --all asks; anything but yes does nothing
    said = _on_a_terminal(["dlq", "purge", "--all", "--config", config], "n\n")
    assert f"purge all 3 dead letter(s) of {queue}.dlq? [y/N]" in said
    assert "purge: nothing done" in said
    _on_a_terminal(["dlq", "replay", "--all", "--config", config], "\n")
    assert letters() == ["dead-0", "dead-1", "dead-2"]

    assert main(["dlq", "purge", "dead-1", "--config", config]) == 0    # one, no question
    assert "purged 1 dead letter(s)" in capsys.readouterr().out
    assert main(["dlq", "purge", "dead-1", "--config", config]) == 1
    assert "no dead letter with message ID 'dead-1'" in capsys.readouterr().err
    said = _on_a_terminal(["dlq", "replay", "--all", "--config", config], "yes\n")
    assert "replayed 2 dead letter(s)" in said
    assert letters() == [] and broker.depth(queue) == 2

    # in a script (no terminal to ask on): --yes, or nothing
    broker.publish(dlq_name(queue), b'{"id": "y"}', message_id="dead-9",
                   headers={"x-chalk-error": "it broke"})
    assert main(["dlq", "purge", "--all", "--config", config]) == 2
    assert "give --yes" in capsys.readouterr().err
    assert main(["dlq", "purge", "--all", "--yes", "--config", config]) == 0
    assert "purged 1 dead letter(s)" in capsys.readouterr().out
    assert letters() == []


@pytest.mark.slow
def test_a_records_cancellation_ends_with_the_messages_queued_now_unless_lasting(
        tmp_path, capsys, broker_url, qname):
    queue = qname("in")
    config = _config(tmp_path, broker_url, [queue])
    c = ["--config", str(config)]
    settings = load_settings(config, env={})
    push_records(settings, queue, [{"id": "doc-1", "attributes": {}},
                                   {"id": "doc-2", "attributes": {}}])
    assert main(["jobs", "cancel", "--record", "doc-1", *c]) == 0
    assert main(["jobs", "cancel", "--record", "doc-2", "--lasting", *c]) == 0
    said = capsys.readouterr().out
    assert "the messages naming record doc-1 queued now" in said
    assert "every message naming record doc-2 until withdrawn" in said
    time.sleep(1.1)     # a message's AMQP timestamp is in whole seconds
    push_records(settings, queue, [{"id": "doc-1", "attributes": {}},   # a later crawl
                                   {"id": "doc-2", "attributes": {}}])
    with Service(settings) as service:
        service.run(until=lambda s: s["committed"] + s["cancelled"] >= 4, idle_exit=60)
    assert (service.stats["committed"], service.stats["cancelled"]) == (1, 3)
    # doc-1: the queued message cancelled, the later one ran; doc-2: both cancelled
    assert stored_counts(settings.blackboard_url, ["doc-1", "doc-2"]) == {1: 1, None: 1}
