"""``chalk reprocess`` feeding a real service (RabbitMQ and Spark): each selected record runs
through the workflow once per run, a part published twice runs once, the runs show in the
job log, ``--list`` and the dashboard, and 20,000 records reprocessed with the command
killed (SIGKILL) halfway and run again are each processed exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import kill_group, stored_attributes, stored_counts, wait_until
from listener_router_helpers import write_test_workflows as write_workflows
from reprocess_helpers import dying_before_the_second_save, store_docs, write_reprocess_config

from blackboard import Blackboard
from listener_router import load_settings
from listener_router.cli import main
from listener_router.jobs import JobLogTables
from listener_router.reprocess import Runs, message_id
from listener_router.store import ServiceStore
from listener_router.watch._pages import render
from listener_router.watch._reprocess import reprocess_runs

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _project(tmp_path: Path, db: str, broker_url: str, queue: str) -> Path:
    workflows = write_workflows(tmp_path / "workflows")
    return write_reprocess_config(tmp_path / "chalk.toml", db=db, broker=broker_url,
                                  queue=queue, workflows=str(workflows))


def _chalk(*args: str) -> int:
    return main(["reprocess", *args])


def _runs(url: str) -> list[Any]:
    store = ServiceStore.connect(url)
    try:
        return store.tables(Runs).recent(100)
    finally:
        store.close()


@pytest.mark.slow
def test_each_run_runs_its_records_through_the_workflow_once_and_shows_where_operators_look(
        tmp_path, sqlite_url, broker_url, qname, run_service, capsys, monkeypatch):
    docs = store_docs(sqlite_url, 60)
    config = _project(tmp_path, sqlite_url, broker_url, qname("in"))
    (tmp_path / "ids.txt").write_text("img-007\ngone\ndoc-002\n")
    selections = {
        ("--prefix", "img-0"): {r for r in docs if r.startswith("img-0")},
        ("--source", "web"): {r for r, d in docs.items() if d["source"] == "web"},
        ("--xpath", '$record/Val[@key="lang"] = "fr"'):
            {r for r, d in docs.items() if d["lang"] == "fr"},
        ("--ids-from", str(tmp_path / "ids.txt")): {"img-007", "doc-002"},
    }
    for options in selections:
        assert _chalk("--config", str(config), "--workflow", "Counting", *options) == 0
    expected = Counter(r for chosen in selections.values() for r in chosen)
    stats = run_service(load_settings(config),
                        until=lambda s: s["committed"] >= sum(expected.values()), idle_exit=60)
    assert stats["committed"] == sum(expected.values()) and stats["dead"] == 0
    found = stored_attributes(sqlite_url, sorted(docs), ["count"])
    assert {r: (a or {}).get("count") for r, a in found.items()} == \
        {r: expected.get(r) for r in docs}       # once per run that chose it, else never
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "250")
    runs = _runs(sqlite_url)
    assert main(["jobs", "--config", str(config), "--record", "img-007"]) == 0
    log = capsys.readouterr().out
    for run in runs:
        shown = message_id(run.id, "img-007") in log
        assert shown == (run.selection in ('{"prefix":"img-0"}',) or "ids_from" in run.selection)
    assert "committed" in log
    assert _chalk("--config", str(config), "--list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(v["published"], v["committed"], v["state"]) for v in listed] == \
        [(len(chosen), len(chosen), "finished") for chosen in reversed(selections.values())]
    store = ServiceStore.connect(sqlite_url)
    page = render("reprocess.html", p=reprocess_runs(store))
    store.close()
    assert all(f'data-run="{run.id}" data-state="finished"' in page for run in runs)
    assert '<td class="num committed">12</td>' in page    # the source run, all committed


@pytest.mark.slow
def test_a_part_published_again_after_a_crash_runs_once(
        tmp_path, sqlite_url, broker_url, qname, run_service, monkeypatch, capsys):
    docs = store_docs(sqlite_url, 40)
    config = _project(tmp_path, sqlite_url, broker_url, qname("in"))
    with dying_before_the_second_save(monkeypatch):
        assert _chalk("--config", str(config), "--workflow", "Counting", "--rate", "50") == 130
    assert _chalk("--config", str(config), "--workflow", "Counting") == 0   # the same command
    assert "resuming" in capsys.readouterr().err
    stats = run_service(load_settings(config),
                        until=lambda s: s["committed"] >= 40 and s["duplicate"] >= 10,
                        idle_exit=60)
    assert (stats["committed"], stats["duplicate"]) == (40, 10)
    assert stored_counts(sqlite_url, sorted(docs)) == Counter({1: 40})


# Parts of 500 start 0.2 s apart at --rate 2500; a part's cursor is saved some 50 ms after
# it starts.  Killing this long after a save aims at the next part's publishing, before its
# cursor is saved: the part then goes out again after the restart.
KILL_AFTER = 0.17


def _store_many(url: str, count: int) -> list[str]:
    ids = [f"rec-{i:05d}" for i in range(count)]
    with Blackboard.connect(url) as bb:
        for start in range(0, count, 2000):
            part = ids[start:start + 2000]
            for rid in part:
                bb.create(rid)
                bb.set_literal(rid, "n", int(rid[4:]))
            bb.commit_many(part)
    return ids


@pytest.mark.slow
@pytest.mark.chaos
def test_20000_records_reprocessed_with_the_command_killed_halfway_run_once_each(
        tmp_path, sqlite_url, broker_url, qname, run_service):
    total = 20_000
    ids = _store_many(sqlite_url, total)
    queue = qname("in")
    config = _project(tmp_path, sqlite_url, broker_url, queue)
    command = [sys.executable, "-m", "listener_router", "reprocess", "--config", str(config),
               "--workflow", "Counting", "--rate", "2500"]
    log = tmp_path / "reprocess.log"
    seen: dict[str, Any] = {}

    def reprocess_killed_and_run_again() -> None:
        store = ServiceStore.connect(sqlite_url)
        runs = store.tables(Runs)
        try:
            with open(log, "ab") as out:
                first = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
                at = wait_until(lambda: [r for r in runs.recent(1) if r.published >= total // 2],
                                timeout=120, what="half the records published", every=0.01,
                                explain=log.read_text)
                time.sleep(KILL_AFTER)
                kill_group(first)                       # SIGKILL, reaped
                seen["published before the kill"] = at[0].published
                seen["killed"] = runs.recent(1)[0]
                second = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                        timeout=600)
                seen["second"] = second.returncode
        except BaseException as e:  # the main thread reports it
            seen["error"] = e
        finally:
            store.close()

    started = time.monotonic()
    worker = threading.Thread(target=reprocess_killed_and_run_again, daemon=True)
    worker.start()
    stats = run_service(load_settings(config), until=lambda s: s["committed"] >= total,
                        idle_exit=180)
    took = time.monotonic() - started
    worker.join(timeout=300)
    assert "error" not in seen, seen.get("error")
    assert seen["second"] == 0, log.read_text()
    killed = seen["killed"]
    assert killed.state == "running" and killed.shown_state == "interrupted"
    assert total // 2 <= killed.published < total
    assert "resuming" in log.read_text()
    print(f"\n20,000 records, killed at {seen['published before the kill']:,} published, "
          f"resumed: committed {stats['committed']}, duplicates dropped {stats['duplicate']}, "
          f"{took:.1f} s from the first start to the last commit")
    assert stats["committed"] == total and stats["dead"] == 0
    assert stored_counts(sqlite_url, ids) == Counter({1: total})   # each processed once
    (run,) = _runs(sqlite_url)
    assert (run.state, run.published, run.looked, run.id) == ("finished", total, total, killed.id)
    store = ServiceStore.connect(sqlite_url)
    try:
        assert store.tables(Runs).committed([run]) == {run.id: total}
        committed = store.tables(JobLogTables).entries(states=("committed",), queues=(queue,),
                                                        limit=total * 2)
    finally:
        store.close()
    by_message = Counter(e.message_id for e in committed)
    assert len(by_message) == total and set(by_message.values()) == {1}
    assert set(by_message) == {message_id(run.id, rid) for rid in ids}
