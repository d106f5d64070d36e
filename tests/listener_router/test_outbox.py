"""The outbox: a row per committed batch; sent is marked per batch; earlier layouts upgrade."""

from __future__ import annotations

import json

import pytest
from listener_router_helpers import records_of
from sqlalchemy import create_engine, inspect, select, text

from listener_router.broker import OutMessage
from listener_router.cli import main
from listener_router.jobs import JobLogTables
from listener_router.store import CORE, InboxLog, Outbox, ServiceStore
from listener_router.store._outbox import inbox, outbox


def open_outbox(engine):
    """The outbox over ``engine``, its tables made as the service makes them."""
    CORE.create(engine)
    return Outbox(engine)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def _message(target: str, mid: str, source: str, rid: str) -> tuple[str, OutMessage]:
    return source, OutMessage(routing_key=target, message_id=mid,
                              headers={"x-chalk-source": source, "operation": "ADD"},
                              body=json.dumps({"records": [{"id": rid}]}).encode())


def test_a_committed_batch_is_one_outbox_row_named_by_its_inputs(db_url):
    engine = create_engine(db_url)
    box = open_outbox(engine)
    with engine.begin() as conn:
        batch = Outbox.write(conn, [("m1", "q"), ("m2", "q"), ("m3", "q")], [
            _message("out", "o1", "m1", "r1"), _message("out", "o2", "m1", "r2"),
            _message("out", "o3", "m2", "r3")])
    assert batch is not None
    assert box.seen("q", ["m1", "m2", "m3", "m4"]) == {"m1": batch, "m2": batch, "m3": None}
    assert box.seen("other", ["m1"]) == {}  # keyed by queue too
    unsent = box.unsent([batch])
    assert [m.message_id for m in unsent[batch]] == ["o1", "o2", "o3"]
    assert unsent[batch][2].body == b'{"records": [{"id": "r3"}]}'
    assert unsent[batch][2].headers == {"x-chalk-source": "m2", "operation": "ADD"}
    assert box.unsent_count() == 3
    assert box.outgoing_counts([("m1", batch), ("m2", batch), ("m3", None)]) == [2, 1, 0]
    box.mark_sent([batch])
    assert box.unsent([batch]) == {} and box.unsent_count() == 0
    with engine.connect() as conn:
        assert conn.execute(select(outbox.c.size)).scalar_one() == 3
    engine.dispose()


def test_an_outbox_written_by_an_earlier_chalk_is_upgraded_without_losing_unsent_rows(db_url):
    engine = create_engine(db_url)
    with engine.begin() as conn:  # the layout before outbox batches
        conn.execute(text("CREATE TABLE chalk_inbox (queue VARCHAR(255), message_id VARCHAR(255), "
                          "status VARCHAR(16), processed_at FLOAT, PRIMARY KEY (queue, message_id))"))
        conn.execute(text("CREATE TABLE chalk_outbox (id VARCHAR(255) PRIMARY KEY, message_id "
                          "VARCHAR(255), exchange VARCHAR(255), routing_key VARCHAR(255), body TEXT, "
                          "headers TEXT, created_at FLOAT, sent_at FLOAT)"))
        conn.execute(text("INSERT INTO chalk_inbox VALUES ('q', 'in-1', 'committed', 1.0), "
                          "('q', 'in-2', 'committed', 2.0)"))
        conn.execute(text("""INSERT INTO chalk_outbox VALUES
            ('out-1', 'in-1', '', 'next', '{"records":[{"id":"a"}]}', '{"x-chalk-source":"in-1"}', 1.0, NULL),
            ('out-2', 'in-2', '', 'next', '{"records":[{"id":"b"}]}', '{"x-chalk-source":"in-2"}', 2.0, 5.0)
        """))
    box = open_outbox(engine)
    open_outbox(engine)  # idempotent
    seen = box.seen("q", ["in-1", "in-2"])
    assert seen["in-2"] is None and seen["in-1"] is not None
    (messages,) = box.unsent([seen["in-1"]]).values()
    assert [(m.message_id, m.routing_key, m.body, m.headers) for m in messages] == [
        ("out-1", "next", b'{"records":[{"id":"a"}]}', {"x-chalk-source": "in-1"})]
    assert "chalk_outbox" not in inspect(engine).get_table_names()
    with engine.connect() as conn:
        assert conn.execute(select(inbox.c.batch).where(inbox.c.message_id == "in-1")).scalar()
    with engine.begin() as conn:  # the upgraded inbox takes the job log's columns
        Outbox.write(conn, [("in-3", "q")], [], logged=InboxLog("W", "n", "b", [(0, 1, 3.0, "c",
                                                                                   1, 0)]))
    store = ServiceStore.connect(db_url)
    assert [(e.message_id, e.attempt, e.record) for e in store.tables(JobLogTables).entries()] == [
        ("in-3", 2, "c")]
    store.close()
    engine.dispose()


@pytest.mark.broker
def test_a_redelivered_message_publishes_its_unsent_batch_whole_then_marks_it_sent(
        make_settings, run_service, broker, declare):
    """The crash fell between commit and confirm: the inputs come back, the work is not redone."""
    settings = make_settings()
    queue, out = settings.listeners[0].queue, settings.routers[0].queue
    declare(settings)
    box = open_outbox(create_engine(settings.blackboard_url))
    with box.engine.begin() as conn:
        batch = Outbox.write(conn, [("in-1", queue), ("in-2", queue)], [
            _message(out, "o1", "in-1", "r1"), _message(out, "o2", "in-2", "r2")])
    broker.publish(queue, b'{"id": "r1"}', message_id="in-1")
    broker.publish(queue, b'{"id": "r2"}', message_id="in-2")
    stats = run_service(settings, until=lambda s: s["duplicate"] >= 2)
    assert (stats["duplicate"], stats["committed"]) == (2, 0)
    arrived = broker.drain(out)
    assert sorted(p.message_id for p, _ in arrived) == ["o1", "o2"]  # once: the batch went whole
    assert sorted(r["id"] for r in records_of(arrived)) == ["r1", "r2"]
    assert box.unsent([batch]) == {}
    assert broker.depth(queue) == 0


@pytest.mark.broker
def test_status_counts_processed_and_unsent_messages(tmp_path, capsys, monkeypatch,
                                                    make_settings):
    settings = make_settings()
    box = open_outbox(create_engine(settings.blackboard_url))
    with box.engine.begin() as conn:
        Outbox.write(conn, [("in-1", "q"), ("in-2", "q")], [
            _message("out", "o1", "in-1", "r1"), _message("out", "o2", "in-1", "r2"),
            _message("out", "o3", "in-2", "r3")])
    config = tmp_path / "chalk.toml"
    config.write_text(f'[blackboard]\nurl = "{settings.blackboard_url}"\n'
                      f'[broker]\nurl = "{settings.broker_url}"\n')
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["status", "--config", str(config)]) == 0
    assert "2 processed message(s), 3 unsent outbox message(s)" in capsys.readouterr().out
    # what ``chalk jobs`` shows (the job log, outgoing counts too) is in test_job_log.py
