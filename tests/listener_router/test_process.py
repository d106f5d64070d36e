"""``chalk process`` through the pipeline's own stages: what it adds to the loop it replaced
(a record named twice, a hung record, a record another owner holds) and what it leaves out
(inbox rows, routing)."""

from __future__ import annotations

import json
from pathlib import Path

from listener_router_helpers import write_test_workflows
from sqlalchemy import func, select, table

from blackboard import Blackboard
from listener_router.cli import main
from listener_router.store import ServiceStore


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _process(tmp_path: Path, workflow: str, records: list[dict], *extra: str) -> int:
    source = _jsonl(tmp_path / "in.jsonl", records)
    return main(["process", "--workflow", workflow, "--input", str(source), "--output",
                 "out.jsonl", "--workflows", str(tmp_path / "workflows"), "--local", *extra])


def _output(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]


def _log(tmp_path: Path) -> list[tuple[str, str | None, str]]:
    from listener_router.jobs._tables import job_log
    store = ServiceStore.connect(f"sqlite:///{tmp_path / 'chalk.db'}")
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(select(job_log.c.state, job_log.c.record, job_log.c.queue)
                                .order_by(job_log.c.id)).all()
    finally:
        store.close()
    return [tuple(r) for r in rows]


def test_a_record_named_twice_in_the_file_is_processed_twice_in_order(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_test_workflows(tmp_path / "workflows")
    assert _process(tmp_path, "Counting", [{"id": "d1", "attributes": {}},
                                           {"id": "d2", "attributes": {}},
                                           {"id": "d1", "attributes": {}}]) == 0
    assert "3 succeeded, 0 failed" in capsys.readouterr().out
    assert [(r["id"], r["attributes"]["count"]) for r in _output(tmp_path)] == [
        ("d1", 1), ("d2", 1), ("d1", 2)]
    assert _log(tmp_path) == [("processed", "d1", "(process)"), ("processed", "d2", "(process)"),
                              ("processed", "d1", "(process)")]


def test_a_hung_record_fails_alone_within_the_batch_timeout(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_test_workflows(tmp_path / "workflows")
    (tmp_path / "chalk.toml").write_text("[engine]\nbatch_timeout = 2\n")
    code = _process(tmp_path, "Hanging", [{"id": "h1", "attributes": {}},
                                          {"id": "h2", "attributes": {"hang": True}},
                                          {"id": "h3", "attributes": {}}])
    assert code == 1
    out, err = capsys.readouterr()
    assert "2 succeeded, 1 failed" in out
    assert "record 'h2': timeout: pipelet lr_test_pipelets.HangWhenFlagged" in err
    assert "attempt" not in err.splitlines()[-1]    # no retries: no attempts note
    assert [r["id"] for r in _output(tmp_path)] == ["h1", "h3"]
    assert ("failed", "h2", "(process)") in _log(tmp_path)


def test_a_record_another_owner_holds_fails_alone_and_the_rest_commit(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_test_workflows(tmp_path / "workflows")
    url = f"sqlite:///{tmp_path / 'chalk.db'}"
    ServiceStore.connect(url).close()
    other = Blackboard.connect(url, owner="other", lease_seconds=600)
    other.load("p2")
    try:
        code = _process(tmp_path, "Counting", [{"id": "p1", "attributes": {}},
                                               {"id": "p2", "attributes": {}},
                                               {"id": "p3", "attributes": {}}])
    finally:
        other.invalidate("p2")
        other.close()
    assert code == 1
    out, err = capsys.readouterr()
    assert "2 succeeded, 1 failed" in out
    assert "record 'p2':" in err and "held by 'other'" in err
    assert [r["id"] for r in _output(tmp_path)] == ["p1", "p3"]


def test_process_writes_no_inbox_rows_and_routes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_test_workflows(tmp_path / "workflows")
    assert _process(tmp_path, "Routed", [{"id": f"r{i}", "attributes": {"dest": "out.q"}}
                                         for i in range(3)]) == 0
    capsys.readouterr()
    store = ServiceStore.connect(f"sqlite:///{tmp_path / 'chalk.db'}")
    try:
        with store.engine.connect() as conn:
            inbox, outbox = (conn.execute(select(func.count()).select_from(table(name))).scalar()
                             for name in ("chalk_inbox", "chalk_outbox_batches"))
    finally:
        store.close()
    assert (inbox, outbox) == (0, 0)
    # a second run over the same file processes the records again, as it always has
    assert _process(tmp_path, "Routed", [{"id": "r0", "attributes": {"dest": "out.q"}}]) == 0
    assert _output(tmp_path)[0]["attributes"]["count"] == 2


def test_the_database_out_at_a_commit_stops_the_run_with_exit_2(tmp_path, capsys,
                                                                             monkeypatch):
    from sqlalchemy.exc import OperationalError
    monkeypatch.chdir(tmp_path)
    write_test_workflows(tmp_path / "workflows")

    def out(self, ids, hook=None):
        raise OperationalError("COMMIT", {}, Exception("the database went away"))

    monkeypatch.setattr(Blackboard, "commit_many", out)
    code = _process(tmp_path, "Counting", [{"id": f"o{i}", "attributes": {}} for i in range(3)])
    assert code == 2
    out_, err = capsys.readouterr()
    assert "succeeded" not in out_
    assert "chalk process: commit failed:" in err
    assert "the database went away" in err
    assert _output(tmp_path) == []


def test_a_commit_the_store_refuses_fails_its_record_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_test_workflows(tmp_path / "workflows")
    commit_many = Blackboard.commit_many

    def refusing(self, ids, hook=None):
        if "p2" in ids:
            raise ValueError("p2 does not fit")
        return commit_many(self, ids, hook=hook)

    monkeypatch.setattr(Blackboard, "commit_many", refusing)
    code = _process(tmp_path, "Counting", [{"id": f"p{i}", "attributes": {}} for i in range(4)])
    assert code == 1
    out, err = capsys.readouterr()
    assert "3 succeeded, 1 failed" in out
    assert "record 'p2': commit refused: ValueError: p2 does not fit" in err
    assert [r["id"] for r in _output(tmp_path)] == ["p0", "p1", "p3"]
    assert ("failed", "p2", "(process)") in _log(tmp_path)
