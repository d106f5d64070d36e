"""The job log against a real broker and database: every step of a message's life,
statistics that survive restarts, dead letters read from the log, ``chalk process`` runs.

Services run in this process on the local runner (the log does not depend on
where workflows run; ``test_scheduled_jobs`` and ``test_two_services`` use
real ``chalk run`` processes).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from listener_router_helpers import stored_counts, write_test_workflows
from sqlalchemy import func, select

from blackboard import Blackboard
from listener_router import BatchObserver, Service, push_records
from listener_router.cli import main
from listener_router.cli._jobs import jobs
from listener_router.cluster import LeaderTasks, Membership, Retention
from listener_router.jobs import JobLogRetention, JobLogTables, Sketch
from listener_router.jobs._read import statistics
from listener_router.jobs._tables import job_log
from listener_router.store import InboxLog, Outbox, ServiceStore

pytestmark = [pytest.mark.broker]


def config_for(path: Path, settings) -> Path:
    rule = settings.listeners[0]
    path.write_text(f'[blackboard]\nurl = "{settings.blackboard_url}"\n'
                    f'[broker]\nurl = "{settings.broker_url}"\n'
                    f'[[listener]]\nname = "t"\nqueue = "{rule.queue}"\nworkflow = "{rule.workflow}"\n')
    return path


def run(settings, until, **kwargs):
    with Service(settings, **kwargs) as service:
        return service.run(until=until, idle_exit=60)


def steps_of(capsys) -> list[str]:
    title, header, *lines = capsys.readouterr().out.strip().splitlines()
    assert title.startswith("job log: ") and header.split()[:2] == ["when", "step"]
    return [line.split()[2] for line in lines]   # date, time, step, …


class Reports(BatchObserver):
    def __init__(self):
        self.reports = []

    def batch_finished(self, report):
        self.reports.append(report)


@pytest.fixture
def fragile(tmp_path, make_settings):
    workflows = write_test_workflows(tmp_path / "workflows")
    return make_settings("Fragile", workflows_dir=workflows, max_retries=2,
                         backoff_ms=(50, 50)).with_overrides(runner="local")


def test_retried_dead_replayed_and_committed_show_in_order_after_a_restart(
        tmp_path, capsys, monkeypatch, fragile, broker):
    settings = fragile
    queue = settings.listeners[0].queue
    url = settings.blackboard_url
    config = config_for(tmp_path / "chalk.toml", settings)
    monkeypatch.setenv("COLUMNS", "250")
    push_records(settings, queue, [{"id": "r1", "attributes": {"fail": True}}]
                 + [{"id": f"g{i}", "attributes": {}} for i in range(5)])
    first = run(settings, lambda s: s["dead"] >= 1 and s["committed"] >= 5)
    assert (first["retrying"], first["dead"]) == (2, 1)

    assert main(["jobs", "--record", "r1", "--config", str(config)]) == 0
    assert steps_of(capsys) == ["received", "retrying", "received", "retrying", "received", "dead"]
    assert main(["dlq", "list", "--config", str(config)]) == 0
    listed = capsys.readouterr().out
    assert "r1" in listed and "asked to fail" in listed and "3" in listed
    assert main(["dlq", "show", "--json", "--config", str(config)]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["records"] == ["r1"]
    assert [h["state"] for h in shown["history"]].count("retrying") == 2
    assert broker.depth(f"{queue}.dlq") == 0     # moved into the store, not browsed

    store = ServiceStore.connect(url)
    before = statistics(store)[(queue, "Fragile")]
    assert {k: before.counts.get(k) for k in ("committed", "retrying", "dead", "records")} == {
        "committed": 5, "retrying": 2, "dead": 1, "records": 5}
    assert before.durations["latency"].count == 5

    with Blackboard.connect(url) as bb:   # the cause is fixed
        bb.load("r1")
        bb.set_literal("r1", "fail", False)
        bb.commit("r1")
    assert main(["dlq", "replay", "--all", "--yes", "--config", str(config)]) == 0
    assert "replayed 1" in capsys.readouterr().out
    assert main(["dlq", "list", "--config", str(config)]) == 0
    assert "r1" not in capsys.readouterr().out          # replayed: no longer a dead letter

    push_records(settings, queue, [{"id": f"h{i}", "attributes": {}} for i in range(3)])
    reports = Reports()
    second = run(settings, lambda s: s["committed"] >= 4, observers=[reports])   # the restart
    assert second["committed"] == 4

    assert main(["jobs", "--record", "r1", "--config", str(config)]) == 0
    assert steps_of(capsys) == ["received", "retrying", "received", "retrying", "received", "dead",
                                "replayed", "received", "committed"]
    assert main(["jobs", "--state", "dead", "--config", str(config)]) == 0
    assert " dead (replayed 20" in capsys.readouterr().out        # the entry is marked
    assert stored_counts(url, ["r1"]) == {1: 1}

    after = statistics(store)[(queue, "Fragile")]
    assert {k: after.counts.get(k) for k in ("committed", "retrying", "dead", "records")} == {
        "committed": 9, "retrying": 2, "dead": 1, "records": 9}
    assert after.durations["latency"].count == before.durations["latency"].count + 4
    for stage in ("run", "commit", "batch"):
        new = Sketch.of(r.seconds[stage] for r in reports.reports if stage in r.seconds)
        expected = Sketch().merge(before.durations[f"stage:{stage}"]).merge(new)
        assert after.durations[f"stage:{stage}"] == expected, stage
    store.close()


def test_chalk_jobs_filters_and_follows(tmp_path, capsys, monkeypatch, make_settings):
    settings = make_settings("Demo").with_overrides(runner="local")
    queue = settings.listeners[0].queue
    config = config_for(tmp_path / "chalk.toml", settings)
    monkeypatch.setenv("COLUMNS", "250")
    push_records(settings, queue, [{"id": f"a{i}", "attributes": {"text": "x y"}} for i in range(3)])
    run(settings, lambda s: s["committed"] >= 3)
    assert main(["jobs", "--queue", queue, "--state", "committed,dead", "--config",
                 str(config)]) == 0
    title, header, *rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 3 and all(" committed " in row for row in rows)
    assert [row[header.index("outgoing"):].split()[0] for row in rows] == ["1", "1", "1"]
    assert main(["status", "--config", str(config)]) == 0
    status = capsys.readouterr().out
    assert "committed/s (5 min)" in status and "0 live member(s)" in status
    assert "statistics from " in status and "(the window's start: --since) until now" in status
    assert "Demo" in status and "latency p50/p99" in status
    assert main(["jobs", "--workflow", "Nope", "--config", str(config)]) == 0
    assert "no job-log entries match" in capsys.readouterr().out
    assert main(["jobs", "--since", "1d", "--until", "2000-01-01", "--config",
                 str(config)]) == 0
    assert "no job-log entries match" in capsys.readouterr().out

    printed: list[str] = []
    done = threading.Event()
    follower = threading.Thread(target=jobs, kwargs=dict(
        settings=settings, states=("committed",), limit=0, follow=True, poll=0.2,
        write=printed.append, stop=done.is_set))
    follower.start()
    try:
        push_records(settings, queue, [{"id": f"b{i}", "attributes": {"text": "z"}}
                                       for i in range(2)])
        run(settings, lambda s: s["committed"] >= 2)
        deadline = time.monotonic() + 30
        while sum(" committed " in line for line in printed) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        done.set()
        follower.join(timeout=30)
    followed = [line for line in printed if " committed " in line]
    assert len(followed) == 2 and all(" b" in line for line in followed)


def test_chalk_process_runs_are_in_the_log(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workflows = write_test_workflows(tmp_path / "workflows")
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "p1", "attributes": {}}\n{"id": "p2", "attributes": {"fail": true}}\n')
    assert main(["process", "--workflow", "Fragile", "--input", str(source), "--local",
                 "--workflows", str(workflows)]) == 1
    capsys.readouterr()
    assert main(["jobs", "--config", str(_empty(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert " processed " in out and " p1 " in out
    assert " failed " in out and "p2 asked to fail" in out
    store = ServiceStore.connect(f"sqlite:///{tmp_path / 'chalk.db'}")
    summary = statistics(store)[("(process)", "Fragile")]
    assert (summary.counts["processed"], summary.counts["failed"]) == (1, 1)
    assert summary.durations["stage:run"].count == 1
    store.close()


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.toml"
    path.write_text("")
    return path


def test_retention_drops_old_log_rows_and_statistics(sqlite_url):
    store = ServiceStore.connect(sqlite_url)
    log = store.tables(JobLogTables)
    old, new = time.time() - 10 * 86400, time.time()
    with store.engine.begin() as conn:
        JobLogTables.write(conn, [(t, "committed", "q", f"m{t}", 0, 0, "W", "n", None, t, "r", 1,
                                   0, None) for t in (old, new)])
        JobLogTables.add_counts(conn, "n", {(old, "q", "W", "committed"): 1,
                                            (new, "q", "W", "committed"): 1})
    leader = Membership(store, "n")
    leader.beat()                                   # the only member: it leads
    done = LeaderTasks(leader, [Retention(store, 7), JobLogRetention(store, log, 7)]).run_all()
    assert done["job_log_retention"] >= 1 and "retention" in done
    assert [e.at for e in log.entries()] == [new]
    assert [r.period for r in log.statistics()] == [new]
    store.close()


@pytest.mark.postgres
@pytest.mark.slow
def test_two_members_on_postgres_share_the_log_and_the_statistics(tmp_path, pg_url,
                                                                 make_settings, capsys,
                                                                 monkeypatch):
    base = make_settings("Demo", batch_size=10, prefetch=20).with_overrides(
        runner="local", blackboard_url=pg_url)
    queue = base.listeners[0].queue
    config = config_for(tmp_path / "chalk.toml", base)
    records = [{"id": f"m{i:03d}", "attributes": {"text": "a b"}} for i in range(300)]
    push_records(base, queue, records)
    totals: dict[str, int] = {}
    services = [Service(base.with_overrides(node=name)) for name in ("pg-a", "pg-b")]
    for service in services:
        service.open()
    try:
        def work(service: Service) -> None:
            totals[service.node] = service.run(idle_exit=4)["committed"]
        threads = [threading.Thread(target=work, args=(s,)) for s in services]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
    finally:
        for service in services:
            service.close()
    assert sum(totals.values()) == 300 and all(totals.values())   # both took work
    store = ServiceStore.connect(pg_url)
    summary = statistics(store)[(queue, "Demo")]
    assert summary.counts["committed"] == 300
    assert summary.members == {"pg-a", "pg-b"}
    assert summary.durations["latency"].count == 300
    assert main(["jobs", "--state", "committed", "--limit", "1000", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count(" committed ") == 300
    assert " pg-a " in out and " pg-b " in out
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_log_tables_skip_a_step_logged_twice_and_add_counts_on_both_databases(request, backend):
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    store = ServiceStore.connect(url)
    log = store.tables(JobLogTables)
    now = time.time()
    dead = (now, "dead", "q", "m1", 0, 2, "W", "n", "b1", now - 1, "r1", 2, 0, "broke")
    with store.engine.begin() as conn:
        assert JobLogTables.write_once(conn, dead)
        assert not JobLogTables.write_once(conn, dead)            # the same step again
        JobLogTables.write(conn, [dead[:1] + ("committed",) + dead[2:]] * 2,
                           [("r2", "q", "m1", "r1", now)])          # committed rows: no index
        JobLogTables.add_counts(conn, "n", {(60.0, "q", "W", "dead"): 1})
        JobLogTables.add_counts(conn, "n", {(60.0, "q", "W", "dead"): 2})
        JobLogTables.put_sketches(conn, "n", {(60.0, "q", "W", "latency"): (
            3, 0.6, Sketch.of([0.1, 0.2, 0.3]).dumps())})
    entries = log.entries(record="r2")
    assert [e.state for e in entries] == ["dead", "committed", "committed"]
    assert log.record_ids(entries[0]) == ["r1", "r2"]
    with store.engine.begin() as conn:
        assert log.replayed(conn, "q", "m1", 1, "replayed by test") == 1
    assert [e.resolved for e in log.entries(states=("dead",))] == ["replayed"]
    assert [e.round for e in log.entries(states=("replayed",), record="r2")] == [1]
    summary = statistics(store)[("q", "W")]
    assert summary.counts == {"dead": 3}
    assert summary.durations["latency"] == Sketch.of([0.1, 0.2, 0.3])
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_commit_is_logged_on_its_inbox_row_and_read_back_with_the_steps(request, backend):
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    store = ServiceStore.connect(url)
    log = store.tables(JobLogTables)
    now = time.time()
    retried = (now - 5, "retrying", "q", "m1", 0, 0, "W", "n", "b0", now - 6, "r1", 2, 0, "flaky")
    logged = InboxLog("W", "n", "b1", [(0, 1, now - 2, "r1", 2, 1), (0, 0, now - 2, "r3", 1, 0)])
    with store.engine.begin() as conn:
        assert JobLogTables.write_once(conn, retried)
        JobLogTables.write(conn, (), [("r2", "q", "m1", "r1", now)])   # m1's second record
        Outbox.write(conn, [("m1", "q"), ("m3", "q")], [], writer="n", logged=logged)
        Outbox.write(conn, [("m4", "other")], [], writer="n")          # the log was off
    with store.engine.connect() as conn:   # a commit writes no log row of its own
        assert conn.execute(select(func.count()).select_from(job_log)).scalar_one() == 1
    by_record = log.entries(record="r2")
    # the rows keep x-chalk-attempts as received (attempts before); entries number from 1
    assert [(e.state, e.attempt, e.batch, e.outgoing) for e in by_record] == [
        ("retrying", 1, "b0", 0), ("committed", 2, "b1", 1)]
    committed = by_record[1]
    assert committed.id < 0 and committed.member == "n" and committed.workflow == "W"
    assert committed.received_at == pytest.approx(now - 2) and committed.at >= now
    assert log.record_ids(committed) == ["r1", "r2"]
    assert committed.id == log.entries(message_id="m1", states=("committed",))[0].id
    assert {e.message_id for e in log.entries(states=("committed",))} == {"m1", "m3"}
    assert [e.message_id for e in log.entries(since=now - 1)] in (["m1", "m3"],
                                                                           ["m3", "m1"])
    assert log.entries(workflows=("X",)) == []
    assert log.entries(states=("retrying",), record="r3") == []
    assert len(log.entries(limit=2)) == 2 and log.count() == 3
    assert store.outbox.purge(0.0) == 3                  # the inbox's retention is the log's
    assert [e.state for e in log.entries()] == ["retrying"]
    store.close()
