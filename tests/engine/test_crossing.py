"""Records crossing to the workers and back: what is stored is byte for byte what the
Blackboard API would have stored without the crossing.

A record loaded and not read crosses as the text the store gave plus the message's
attributes as deferred writes, applied where the worker parses it; a record parsed on the
driver crosses as its document encoded again.  Both must commit the same rows, and the same
documents as the same writes made straight on the driver's blackboard.  Each path commits to a SQLite file of its
own, seeded alike; the stored rows (documents, versions, attachments) are compared.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from _pipelets import run_script
from engine_helpers import BPEL_HEADER, pipelet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from blackboard import Annotation, Blackboard, Literal
from engine import Workflow, load_workflow
from engine._results import apply_outputs, inputs_for
from engine._worker import chunk_partition, inputs_to_chunks, outputs_from_chunks

NAMES = ["text", "n", "tags", "o", "x"]
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
scalars = st.one_of(texts, st.integers(-2**63, 2**63 - 1), st.booleans(),
                    st.floats(allow_nan=False, allow_infinity=False))
objects = st.dictionaries(st.sampled_from(["k", "m"]),
                          st.one_of(scalars, st.lists(scalars, min_size=1, max_size=2)),
                          min_size=1, max_size=2)
json_values = st.one_of(scalars, objects,  # as a message carries them
                        st.lists(st.one_of(scalars, objects), min_size=1, max_size=3))
attributes = st.dictionaries(st.sampled_from(NAMES), json_values, max_size=3)
names = st.sampled_from(NAMES)
script_ops = st.one_of(
    st.tuples(st.sampled_from(["read", "remove"]), names, st.none()),
    st.tuples(st.sampled_from(["set", "add", "annotate"]), names, scalars),
    st.tuples(st.just("set_many"), names, st.lists(scalars, max_size=3)),
    st.tuples(st.just("typed"), names, st.dates().map(lambda d: d.isoformat())),
    st.tuples(st.just("attributes"), names, json_values),
    st.tuples(st.just("attach"), names, texts),
    st.tuples(st.just("split"), st.sampled_from(["f1", "f2"]), scalars),
    st.tuples(st.just("delete"), st.none(), st.none()),
).map(list)
stored = st.one_of(st.none(), st.tuples(attributes, st.lists(st.tuples(names, scalars),
                                                              max_size=2)))
records = st.lists(st.tuples(stored, attributes, st.lists(script_ops, max_size=6)),
                   min_size=1, max_size=3)

_examples = itertools.count()
PATHS = ("direct", "lazy", "parsed")


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Workflow:
    path = tmp_path_factory.mktemp("crossing") / "Scripted.xml"
    path.write_text(BPEL_HEADER.format(name="Scripted") + "<sequence>"
                    + pipelet("script", "Scripted") + "</sequence></process>")
    return load_workflow(path)


def _seed(url: str, rid: str, state: Any) -> None:
    if state is None:
        return
    attrs, typed = state
    with Blackboard.connect(url, owner="seed") as bb:
        bb.create(rid)
        bb.set_attributes(rid, attrs)
        for name, value in typed:
            bb.add_literal(rid, name, Literal(value, "kind",
                                              {"why": [Annotation(["seeded"], {"n": 1})]}))
        bb.commit(rid)


def _stored(url: str) -> tuple[list[Any], list[Any]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            docs = conn.execute(text("SELECT id, doc, version FROM chalk_records ORDER BY id")).all()
            blobs = conn.execute(text("SELECT record_id, name, chunk, data FROM chalk_attachments "
                                      "ORDER BY record_id, name, chunk")).all()
    finally:
        engine.dispose()
    return [tuple(r) for r in docs], [tuple(r) for r in blobs]


def _run(how: str, url: str, workflow: Workflow, batch: list[tuple[str, Any, dict[str, Any], list[Any]]],
         compress: bool) -> None:
    """Load the records, write the message's attributes, run the script (on the driver, or
    across chunks with the records as they came or parsed first), commit what ran."""
    with Blackboard.connect(url, owner=how) as bb:
        ids = [rid for rid, *_ in batch]
        bb.load_many(ids)
        for rid, _state, attrs, _script in batch:
            if how == "parsed":
                bb.document(rid)  # parsed up front: the attributes apply at once
            if attrs:
                bb.set_attributes(rid, attrs)
        if how == "direct":
            for rid, _state, _attrs, script in batch:
                run_script(bb, rid, script)
            bb.commit_many(bb.ids())
            return
        for rid, _state, _attrs, script in batch:
            bb.set_record_note(rid, "script", script)
        rows = inputs_for(bb, [(i, [rid]) for i, rid in enumerate(ids)])
        answer = list(chunk_partition(workflow, inputs_to_chunks(rows, 1, compress), compress))
        results = apply_outputs(bb, outputs_from_chunks(answer))
        assert all(r.ok for r in results), [r.error for r in results]
        bb.commit_many([rid for r in results for rid in r.record_ids])


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records, st.booleans())
def test_records_that_cross_store_what_the_same_writes_store_on_the_driver(
        tmp_path: Path, scripted: Workflow, batch: list[tuple[Any, dict[str, Any], list[Any]]],
        compress: bool) -> None:
    example = next(_examples)
    named = [(f"r{example}-{i}", state, attrs, script)
             for i, (state, attrs, script) in enumerate(batch)]
    stored = {}
    for how in PATHS:
        url = f"sqlite:///{tmp_path / f'{how}-{example}.db'}"
        for rid, state, _attrs, _script in named:
            _seed(url, rid, state)
        _run(how, url, scripted, named, compress)
        stored[how] = _stored(url)
    assert stored["lazy"] == stored["parsed"]  # documents, versions, attachments
    # The same bytes as the writes made on the driver.  Versions may differ there: a record
    # a workflow wrote but left byte for byte as it was stays home from the workers, so it
    # is not written again; on the driver it is.
    docs, blobs = stored["direct"]
    assert ([d[:2] for d in stored["lazy"][0]], stored["lazy"][1]) == ([d[:2] for d in docs], blobs)


def test_a_loaded_record_crosses_as_the_stored_text_with_the_attributes_deferred(
        sqlite_url: str, scripted: Workflow) -> None:
    _seed(sqlite_url, "r", ({"text": "stored"}, []))
    with Blackboard.connect(sqlite_url) as bb:
        bb.load("r")
        bb.set_attributes("r", {"n": 5})
        raw = bb._entries["r"].raw
        (row,) = inputs_for(bb, [(0, ["r"])])
        assert bb._entries["r"]._doc is None  # nothing parsed on the driver
        assert row.packed.docs == [raw.encode()]
        assert row.packed.env[0][5] is not None   # the attributes travel as deferred writes
        bb.invalidate("r")
