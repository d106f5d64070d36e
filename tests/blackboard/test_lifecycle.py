"""Lifecycle, leases, batches and storage, on SQLite and PostgreSQL (``store_url``)."""

from __future__ import annotations

import io
import time

import pytest
from sqlalchemy import Column, MetaData, String, Table, event, select, text

from blackboard import (
    SCHEMA_VERSION,
    Annotation,
    Blackboard,
    BlackboardError,
    Literal,
    RecordLockedError,
    RecordNotFoundError,
    SqlStore,
    StaleRecordError,
    StorageError,
)
from blackboard._storage import CHUNK_SIZE, attachments


def stored(url: str, rid: str) -> dict | None:
    store = SqlStore(url)
    try:
        found = store.read([rid]).get(rid)
        return found[0] if found else None
    finally:
        store.dispose()


def test_create_commit_load_round_trip(bb: Blackboard, store_url: str) -> None:
    bb.create("doc-1", source="web")
    bb.set_literal("doc-1", "title", Literal("Hi", "text"))
    bb.set_annotation("doc-1", None, "lang", Annotation(["en"]))
    bb.commit("doc-1")
    assert "doc-1" not in bb
    bb.load("doc-1")
    assert not bb.is_new("doc-1")
    assert bb.get_literal("doc-1", "title") == Literal("Hi", "text")
    assert bb.get_annotation("doc-1", None, "lang") == Annotation(["en"])
    assert bb.document("doc-1")["source"] == "web"
    assert stored(store_url, "doc-1")["meta"]["attrs"]["title"] == [{"lit": "Hi", "type": "text"}]


def test_a_records_source_is_read_and_changed_and_kept_by_a_commit(
        bb: Blackboard, store_url: str) -> None:
    bb.load_many(["a", "b"])
    assert bb.get_source("a") is None
    bb.set_source("a", "web")
    bb.set_literal("b", "n", 1)
    bb.commit_many(["a", "b"])
    bb.load_many(["a", "b"])
    assert (bb.get_source("a"), bb.get_source("b")) == ("web", None)
    bb.set_source("a", "web")                      # the same: nothing to write
    assert bb.changed_ids() == []
    bb.set_source("a", None)
    assert bb.changed_ids() == ["a"]
    with pytest.raises(BlackboardError) as caught:
        bb.set_source("b", 7)  # type: ignore[arg-type]
    assert "record 'b'" in str(caught.value)
    bb.commit_many(["a", "b"])
    assert stored(store_url, "a")["source"] is None


def test_load_of_an_absent_record_marks_it_new_and_invalidate_leaves_no_trace(
        bb: Blackboard, store_url: str) -> None:
    bb.load("fresh")
    assert bb.is_new("fresh") and bb.ids() == ["fresh"] and len(bb) == 1
    bb.set_literal("fresh", "a", 1)
    bb.invalidate("fresh")
    assert "fresh" not in bb
    assert stored(store_url, "fresh") is None
    with pytest.raises(RecordNotFoundError):
        bb.get_literals("fresh", "a")


def test_create_does_not_read_and_its_commit_overwrites(bb: Blackboard) -> None:
    bb.create("x")
    bb.set_literal("x", "old", 1)
    bb.set_attachment("x", "blob", b"old bytes")
    bb.commit("x")
    bb.create("x")
    assert bb.attribute_names("x") == []
    bb.set_literal("x", "new", 2)
    bb.commit("x")
    bb.load("x")
    assert bb.attribute_names("x") == ["new"]
    assert not bb.has_attachment("x", "blob")
    with pytest.raises(BlackboardError, match="already on this blackboard"):
        bb.create("x")


def test_changes_dropped_by_invalidate_are_not_stored(bb: Blackboard) -> None:
    bb.create("x")
    bb.set_literal("x", "a", 1)
    bb.commit("x")
    bb.load("x")
    bb.set_literal("x", "a", 2)
    bb.invalidate("x")
    bb.load("x")
    assert bb.get_literal("x", "a").value == 1


def test_split_makes_a_fragment_with_parent_notes_attachments_and_instance(bb: Blackboard) -> None:
    bb.create("p")
    bb.set_literal("p", "a", 1)
    bb.set_attachment("p", "file", b"content")
    bb.set_record_note("p", "seen", [1, 2])
    bb.bind_instance("inst-1", ["p"])
    fid = bb.split("p", "page1")
    assert fid == "p#page1"
    assert bb.parent_id(fid) == "p" and bb.parent_id("p") is None
    assert bb.get_literal(fid, "a").value == 1
    assert bb.get_attachment(fid, "file") == b"content"
    assert bb.get_record_note(fid, "seen") == [1, 2]
    assert bb.instance_of(fid) == "inst-1"
    bb.set_literal(fid, "a", 2)
    assert bb.get_literal("p", "a").value == 1  # a copy, not a view
    with pytest.raises(BlackboardError, match="bad fragment name"):
        bb.split("p", "a#b")
    with pytest.raises(BlackboardError, match="already on this blackboard"):
        bb.split("p", "page1")
    bb.commit_many(["p", fid])
    bb.load(fid)
    assert bb.document(fid)["parent"] == "p"
    assert bb.get_attachment(fid, "file") == b"content"


def test_fragment_of_a_stored_attachment_is_copied_even_when_the_parent_is_deleted(
        bb: Blackboard) -> None:
    bb.create("p")
    bb.set_attachment("p", "file", b"x" * (CHUNK_SIZE + 10))
    bb.commit("p")
    bb.load("p")
    fid = bb.split("p", "1")
    bb.delete("p")
    bb.commit_many(["p", fid])
    bb.load_many(["p", fid])
    assert bb.is_new("p")
    assert bb.get_attachment(fid, "file") == b"x" * (CHUNK_SIZE + 10)


def test_delete_removes_record_and_attachments_on_commit(bb: Blackboard, store_url: str) -> None:
    bb.create("d")
    bb.set_attachment("d", "f", b"bytes")
    bb.commit("d")
    bb.load("d")
    bb.delete("d")
    assert bb.is_deleted("d") and bb.changed_ids() == ["d"]
    bb.commit("d")
    assert stored(store_url, "d") is None
    store = SqlStore(store_url)
    with store.transaction() as tx:
        assert tx.conn.execute(select(attachments.c.chunk)).all() == []
    store.dispose()


def test_a_second_blackboard_gets_record_locked_naming_the_holder(store_url: str) -> None:
    with Blackboard.connect(store_url, owner="alice") as alice, \
            Blackboard.connect(store_url, owner="bob") as bob:
        alice.load_many(["a", "b"])
        with pytest.raises(RecordLockedError) as caught:
            bob.load_many(["b", "c"])
        assert caught.value.holders == {"b": "alice"}
        assert "record 'b' is held by 'alice'" in str(caught.value)
        assert "c" not in bob  # all or nothing
        with pytest.raises(RecordLockedError):
            bob.create("a")
        alice.commit("a")  # commit releases
        bob.create("a")
        alice.invalidate("b")  # invalidate releases
        bob.load("b")


def test_load_waits_up_to_the_lock_timeout(store_url: str) -> None:
    with Blackboard.connect(store_url, owner="holder", lease_seconds=0.5) as holder, \
            Blackboard.connect(store_url, owner="waiter") as waiter:
        holder.load("r")
        started = time.monotonic()
        with pytest.raises(RecordLockedError, match="after waiting 0.1 s"):
            waiter.load("r", lock_timeout=0.1)
        waiter.load("r", lock_timeout=5)  # the holder's lease expires meanwhile
        assert 0.3 < time.monotonic() - started < 5


def test_a_stale_holder_cannot_overwrite_the_takers_commit(store_url: str) -> None:
    with Blackboard.connect(store_url, owner="slow", lease_seconds=0.2) as slow, \
            Blackboard.connect(store_url, owner="fast") as fast:
        slow.create("r")
        slow.set_literal("r", "v", 0)
        slow.commit("r")
        slow.load("r")
        slow.set_literal("r", "v", "slow")
        time.sleep(0.3)
        fast.load("r")  # takes the expired lease
        with pytest.raises(StaleRecordError) as held:
            slow.commit("r")
        assert held.value.holders == {"r": "fast"}
        assert "nothing written" in str(held.value)
        fast.set_literal("r", "v", "fast")
        fast.commit("r")
        with pytest.raises(StaleRecordError) as moved:
            slow.commit("r")  # lease free again, but the version moved on
        assert "version 2 in storage, version 1 was loaded" in str(moved.value)
        assert "r" in slow  # still there: invalidate it
        slow.invalidate("r")
        slow.load("r")
        assert slow.get_literal("r", "v").value == "fast"


def test_stale_absent_and_created_records_are_refused(store_url: str) -> None:
    with Blackboard.connect(store_url, owner="a", lease_seconds=0.2) as a, \
            Blackboard.connect(store_url, owner="b") as b:
        a.load("n")  # absent
        a.create("c")
        time.sleep(0.3)
        b.create("n")
        b.create("c")
        b.commit_many(["n", "c"])
        with pytest.raises(StaleRecordError, match="created meanwhile"):
            a.commit("n")
        with pytest.raises(StaleRecordError, match="lease lapsed"):
            a.commit("c")


def test_an_expired_lease_nobody_took_still_commits(store_url: str) -> None:
    with Blackboard.connect(store_url, owner="a", lease_seconds=0.1) as a:
        a.create("r")
        a.commit("r")
        a.load("r")
        a.set_literal("r", "x", 1)
        time.sleep(0.2)
        assert a.store.purge_expired_leases() == 1
        a.commit("r")
        a.load("r")
        assert a.get_literal("r", "x").value == 1


def test_renew_leases_keeps_records_ours(store_url: str) -> None:
    with Blackboard.connect(store_url, owner="a", lease_seconds=0.3) as a, \
            Blackboard.connect(store_url, owner="b") as b:
        a.load_many(["x", "y"])
        for _ in range(3):
            time.sleep(0.15)
            assert a.renew_leases() == 2
        with pytest.raises(RecordLockedError):
            b.load("x")
        holders = a.store.lease_holders(["x", "y", "z"])
        assert {k: v[0] for k, v in holders.items()} == {"x": "a", "y": "a"}


def test_commit_hook_runs_inside_the_commit_transaction(bb: Blackboard, store_url: str) -> None:
    outbox = Table("test_outbox", MetaData(), Column("id", String(50), primary_key=True))
    outbox.metadata.create_all(bb.store.engine)
    bb.create("h")
    bb.commit("h", hook=lambda conn: conn.execute(outbox.insert().values(id="m1")))
    bb.create("h2")

    def failing(conn):
        conn.execute(outbox.insert().values(id="m2"))
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError):
        bb.commit_many(["h2"], hook=failing)
    with bb.store.engine.connect() as conn:
        assert conn.execute(select(outbox.c.id)).scalars().all() == ["m1"]
    assert stored(store_url, "h2") is None and "h2" in bb


def test_batches_use_a_constant_number_of_statements(bb: Blackboard) -> None:
    statements: list[str] = []
    event.listen(bb.store.engine, "before_cursor_execute",
                 lambda conn, cursor, stmt, *rest: statements.append(stmt))

    def count(action, *args) -> int:
        statements.clear()
        action(*args)
        return len(statements)

    counts = {}
    for n in (3, 400):
        ids = [f"r{n}-{i}" for i in range(n)]
        created = count(bb.create, ids[0])
        assert created <= 3
        loaded = count(bb.load_many, ids[1:])
        for rid in ids:
            bb.set_literal(rid, "a", 1)
        committed = count(bb.commit_many, ids)
        bb.load_many(ids)
        for rid in ids:
            bb.set_literal(rid, "a", 2)
        recommitted = count(bb.commit_many, ids)
        bb.load_many(ids)
        invalidated = count(bb.invalidate_many, ids + ["not-here"])
        counts[n] = (loaded, committed, recommitted, invalidated)
    assert counts[3] == counts[400]
    assert all(c <= 6 for c in counts[3]), counts


def test_notes_global_record_and_workflow(bb: Blackboard) -> None:
    bb.set_global_note("g", {"a": [1, 2]})
    assert bb.has_global_note("g") and bb.get_global_note("g") == {"a": [1, 2]}
    assert bb.global_note_names() == ["g"]
    with pytest.raises(BlackboardError, match="no global note 'x'"):
        bb.get_global_note("x")
    with pytest.raises(TypeError, match="JSON"):
        bb.set_global_note("bad", object())
    bb.set_global_note("t", (1, 2))
    assert bb.get_global_note("t") == [1, 2]  # stored as JSON
    bb.remove_global_note("t")
    assert not bb.has_global_note("t")

    bb.create("r")
    bb.set_record_note("r", "n", "v")
    assert bb.has_record_note("r", "n") and bb.get_record_note("r", "n") == "v"
    assert bb.record_note_names("r") == ["n"]
    with pytest.raises(BlackboardError, match="record 'r': no record note 'x'"):
        bb.get_record_note("r", "x")
    with pytest.raises(TypeError):
        bb.set_record_note("r", "bad", {1, 2})

    with pytest.raises(BlackboardError, match="not bound to a workflow instance"):
        bb.set_workflow_note("r", "w", 1)
    assert not bb.has_workflow_note("r", "w")
    bb.create("s")
    bb.bind_instance(("msg", 1), ["r", "s"])
    bb.set_workflow_note("r", "w", 1)
    assert bb.get_workflow_note("s", "w") == 1  # shared by the instance
    fid = bb.split("s", "f")
    assert bb.has_workflow_note(fid, "w")
    with pytest.raises(BlackboardError, match="no workflow note 'x'"):
        bb.get_workflow_note("r", "x")
    bb.commit("r")
    assert bb.get_workflow_note("s", "w") == 1  # the instance still has records
    bb.invalidate_many(["s", fid])
    bb.create("r")
    bb.bind_instance(("msg", 1), ["r"])
    assert not bb.has_workflow_note("r", "w")  # gone with the instance's last record
    assert not bb.has_record_note("r", "n")  # record notes went with the record
    bb.set_workflow_note("r", "w", 2)
    bb.clear_instance(("msg", 1))
    assert bb.instance_of("r") is None
    assert bb.has_global_note("g")  # global notes stay


def test_attachments_set_get_stream_remove_and_persist(bb: Blackboard, store_url: str) -> None:
    bb.create("a")
    assert not bb.has_attachment("a", "f")
    with pytest.raises(BlackboardError, match="record 'a': no attachment 'f'"):
        bb.get_attachment("a", "f")
    bb.set_attachment("a", "small", b"abc")
    data = bytes(range(256)) * (CHUNK_SIZE // 256 * 2 + 7)  # a bit over 2 chunks
    bb.set_attachment_from_stream("a", "big", io.BytesIO(data))
    assert bb.get_attachment("a", "big") == data
    with bb.get_attachment_stream("a", "big") as stream:
        assert stream.read(10) == data[:10]
    assert sorted(bb.attachment_names("a")) == ["big", "small"]
    with pytest.raises(TypeError):
        bb.set_attachment("a", "x", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="binary mode"):
        bb.set_attachment_from_stream("a", "x", io.StringIO("text"))  # type: ignore[arg-type]
    with pytest.raises(BlackboardError, match="bad attachment name"):
        bb.set_attachment("a", "", b"")
    bb.commit("a")
    bb.load("a")
    assert bb.get_attachment("a", "small") == b"abc"
    with bb.get_attachment_stream("a", "big") as stream:
        parts = []
        while chunk := stream.read(100_000):
            parts.append(chunk)
    assert b"".join(parts) == data
    assert bb.store.attachment_size("a", "big") == len(data)
    with bb.store.transaction() as tx:
        chunks = tx.conn.execute(select(attachments.c.chunk).where(
            attachments.c.record_id == "a", attachments.c.name == "big")).scalars().all()
    assert sorted(chunks) == [0, 1, 2]
    bb.remove_attachment("a", "big")
    bb.set_attachment("a", "small", b"new")
    bb.commit("a")
    bb.load("a")
    assert bb.attachment_names("a") == ["small"]
    assert bb.get_attachment("a", "small") == b"new"
    assert bb.store.attachment_size("a", "big") is None


def test_transport_items_carry_records_between_blackboards(bb: Blackboard) -> None:
    bb.create("t")
    bb.set_literal("t", "a", 1)
    bb.set_attachment("t", "f", b"data")
    bb.commit("t")
    bb.load("t")
    bb.bind_instance("i", ["t"])
    worker = Blackboard.local()
    worker.import_records(bb.export_records(["t"], attachments="none"), changed=False)
    assert worker.changed_ids() == []
    worker.set_literal("t", "a", 2)
    fid = worker.split("t", "w")
    worker.set_attachment(fid, "g", b"new")
    back = worker.export_records(worker.changed_ids(), attachments="changed")
    bb.import_records(back)
    assert set(bb.changed_ids()) == {"t", fid}
    assert bb.instance_of(fid) == "i"
    bb.commit_many(["t", fid])
    bb.load_many(["t", fid])
    assert bb.get_literal("t", "a").value == 2
    assert bb.get_attachment("t", "f") == b"data"
    assert bb.get_attachment(fid, "f") == b"data"  # copied from the parent in storage
    assert bb.get_attachment(fid, "g") == b"new"


def test_schema_is_created_once_with_a_version_row(store_url: str) -> None:
    first = SqlStore(store_url)
    second = SqlStore(store_url)  # idempotent
    assert first.schema_version() == second.schema_version() == SCHEMA_VERSION
    with first.transaction() as tx:
        tx.conn.execute(text("UPDATE chalk_meta SET value = '99' WHERE key = 'schema_version'"))
    with pytest.raises(StorageError, match="schema version 99"):
        SqlStore(store_url)
    first.dispose()
    second.dispose()


def test_close_and_context_manager_release_what_is_left(store_url: str) -> None:
    with Blackboard.connect(store_url, owner="a") as a:
        a.load_many(["x", "y"])
    with Blackboard.connect(store_url, owner="b") as b:
        b.load_many(["x", "y"])


def test_unreachable_storage_raises_storage_error() -> None:
    with pytest.raises(StorageError, match="unavailable"):
        Blackboard.connect("postgresql+psycopg://postgres@127.0.0.1:1/none",
                           connect_args={"connect_timeout": 2})
    with pytest.raises(StorageError, match="cannot open storage|not supported"):
        Blackboard.connect("mysql+pymysql://x@localhost/db")


def test_a_local_blackboard_needs_no_storage() -> None:
    local = Blackboard.local()
    local.load("x")
    assert local.is_new("x")
    local.set_literal("x", "a", 1)
    local.commit_many(["x"])
    assert local.ids() == []
    assert local.renew_leases() == 0


def test_bind_instances_binds_like_bind_instance_one_by_one(local: Blackboard) -> None:
    for rid in ("a", "b", "c"):
        local.create(rid)
    local.bind_instance("old", ["c"])
    local.bind_instances([(1, ["a", "b"]), (2, ["c"])])
    assert [local.instance_of(r) for r in ("a", "b", "c")] == [1, 1, 2]
    local.set_workflow_note("a", "w", "x")
    assert local.get_workflow_note("b", "w") == "x"   # one instance, one set of notes
    assert not local.has_workflow_note("c", "w")
    with pytest.raises(BlackboardError, match="record 'zz' is not on this blackboard"):
        local.bind_instances([(3, ["a"]), (4, ["zz"])])
    assert local.instance_of("a") == 1                  # nothing bound when one is missing
