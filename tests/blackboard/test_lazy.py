"""Lazy documents: stored text parsed on first use, deferred top-level writes, skipped writes.

The fast paths must be invisible: every test compares with what a parsed
record would give.  On SQLite and PostgreSQL (``store_url``).
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from blackboard import Annotation, Blackboard, Literal, StaleRecordError, ValueTypeError
from blackboard._storage import records

ATTRS = {"title": "T", "tags": ["a", "b"], "n": 3, "author": {"name": "X"}}


def versions(bb: Blackboard, ids: list[str]) -> dict[str, int]:
    assert bb.store is not None
    with bb.store.transaction(write=False) as tx:
        return dict(tx.conn.execute(select(records.c.id, records.c.version)
                                    .where(records.c.id.in_(ids))).all())


def seed(url: str, ids: list[str]) -> None:
    with Blackboard.connect(url, owner="seed") as bb:
        for rid in ids:
            bb.create(rid)
            bb.set_attributes(rid, ATTRS)
            bb.set_literals(rid, "mixed", ["x", "y"])
            bb.add_object(rid, "mixed")
            bb.set_literal(rid, "mixed[0]/inner", "deep")
        bb.commit_many(ids)


def test_loaded_records_stay_unparsed_until_read(bb: Blackboard, store_url: str) -> None:
    seed(store_url, ["a"])
    bb.load("a")
    entry = bb._entries["a"]
    assert entry._doc is None and isinstance(entry.raw, str)
    item = bb.export_records(["a"], encoded=True)[0]
    assert entry._doc is None and item["parent"] is None  # the stored text travels as is
    assert item["doc"] == entry.raw.encode()
    assert bb.get_literal("a", "title").value == "T"
    assert entry._doc is not None and entry.raw is None


def test_records_loaded_and_not_changed_are_not_written(bb: Blackboard, store_url: str) -> None:
    ids = [f"r{i}" for i in range(5)]
    seed(store_url, ids)
    before = versions(bb, ids)
    bb.load_many(ids)
    bb.get_literals("r1", "title")  # read: parsed, still unchanged
    bb.set_literal("r2", "title", "new")
    bb.commit_many(ids)
    after = versions(bb, ids)
    assert after == {**before, "r2": before["r2"] + 1}


def test_deferred_top_level_writes_equal_the_same_writes_on_a_parsed_record(
        store_url: str) -> None:
    seed(store_url, ["lazy", "eager"])
    with Blackboard.connect(store_url, owner="w") as bb:
        bb.load_many(["lazy", "eager"])
        bb.attribute_names("eager")  # parse this one first
        for rid in ("lazy", "eager"):
            bb.set_literal(rid, "title", Literal("t2", "kind"))
            bb.add_literal(rid, "tags", "c")
            bb.set_literal(rid, "mixed", "only")   # the sub-object stays
            bb.add_literal(rid, "fresh", 7)
            bb.set_literals(rid, "n", [])
            bb.set_literals(rid, "gone", [])
            bb.set_attributes(rid, {"n": [1, 2], "author": {"name": "Y"}})
            bb.add_literal(rid, "n[3]", 3)        # the index is irrelevant
        assert bb._entries["lazy"]._doc is None
        bb.commit_many(["lazy", "eager"])
    with Blackboard.connect(store_url, owner="r") as bb:
        bb.load_many(["lazy", "eager"])
        lazy, eager = bb.document("lazy"), bb.document("eager")
        assert lazy["meta"] == eager["meta"]
        assert bb.get_literals("lazy", "mixed") == [Literal("only")]
        assert bb.get_literal("lazy", "mixed[0]/inner").value == "deep"
        assert bb.get_literals("lazy", "n") == [Literal(1), Literal(2), Literal(3)]
        assert bb.get_literal("lazy", "title") == Literal("t2", "kind")


def test_reading_after_deferred_writes_sees_them(bb: Blackboard, store_url: str) -> None:
    seed(store_url, ["a"])
    bb.load("a")
    bb.set_literal("a", "title", "T2")
    bb.add_literal("a", "tags", "c")
    assert bb.get_literals("a", "tags") == [Literal("a"), Literal("b"), Literal("c")]
    assert bb.get_literal("a", "title").value == "T2"
    bb.set_annotation("a", "title[-1]", "why", Annotation(["because"]))
    bb.commit("a")
    bb.load("a")
    assert bb.get_literal("a", "title").value == "T2"
    assert bb.get_annotation("a", "title[-1]", "why") == Annotation(["because"])


def test_bad_values_fail_at_the_call_even_when_deferred(bb: Blackboard, store_url: str) -> None:
    seed(store_url, ["a"])
    bb.load("a")
    with pytest.raises(ValueTypeError, match="'a'.*title"):
        bb.set_literal("a", "title", float("nan"))
    with pytest.raises(ValueTypeError):
        bb.add_literal("a", "title", object())
    assert bb.get_literal("a", "title").value == "T"


def test_records_with_attachments_load_their_names(bb: Blackboard, store_url: str) -> None:
    seed(store_url, ["a"])
    bb.load("a")
    bb.set_attachment("a", "blob", b"123")
    bb.set_literal("a", "title", "with blob")
    bb.commit("a")
    bb.load("a")
    assert bb.has_attachment("a", "blob") and bb.get_attachment("a", "blob") == b"123"
    assert bb.document("a")["attachments"] == ["blob"]


def test_a_stale_batch_through_the_bulk_path_writes_nothing(store_url: str) -> None:
    ids = [f"s{i}" for i in range(300)]
    seed(store_url, ids)
    first = Blackboard.connect(store_url, owner="first", lease_seconds=0.2)
    second = Blackboard.connect(store_url, owner="second")
    try:
        first.load_many(ids)
        for rid in ids:
            first.set_literal(rid, "title", "first")
        import time
        time.sleep(0.3)
        second.load_many(ids[:1])
        second.set_literal(ids[0], "title", "second")
        second.commit_many(ids[:1])
        with pytest.raises(StaleRecordError):
            first.commit_many(ids)
        first.invalidate_many(ids)
        second.load_many(ids)
        assert second.get_literal(ids[0], "title").value == "second"
        assert all(second.get_literal(rid, "title").value == "T" for rid in ids[1:])
    finally:
        first.close()
        second.close()


def test_encoded_transport_items_carry_json_bytes_both_ways(bb: Blackboard,
                                                             store_url: str) -> None:
    seed(store_url, ["a", "b"])
    bb.load_many(["a", "b"])
    bb.set_literal("b", "title", "changed")
    fid = bb.split("a", "part")
    items = bb.export_records(["a", "b", fid], encoded=True)
    assert all(isinstance(item["doc"], bytes) for item in items)
    assert [item["id"] for item in items] == ["a", "b", fid]
    assert items[2]["parent"] == "a"
    worker = Blackboard.local()
    worker.import_records(items, changed=False)
    assert worker._entries["a"]._doc is None  # still text on the worker
    assert worker.get_literal("b", "title").value == "changed"
    worker.add_literal("a", "tags", "w")
    back = worker.export_records(worker.changed_ids(), encoded=True)
    assert [item["id"] for item in back] == ["a", fid]  # the fragment is new
    bb.import_records(back)
    bb.commit_many(["a", "b", fid])
    bb.load_many(["a", fid])
    assert bb.get_literals("a", "tags") == [Literal("a"), Literal("b"), Literal("w")]
    assert bb.parent_id(fid) == "a"


def test_plain_and_encoded_exports_describe_the_same_record(local: Blackboard) -> None:
    local.set_attributes("r", ATTRS)
    local.set_attachment("r", "x", b"1")
    plain = local.export_records(["r"])[0]
    encoded = local.export_records(["r"], encoded=True)[0]
    other = Blackboard.local()
    other.import_records([encoded])
    assert other.document("r") == plain["doc"]
    assert other.get_attachment("r", "x") == b"1"
