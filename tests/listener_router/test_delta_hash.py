"""A record's content hash (delta processing): canonical, kind-exact, annotations left out."""

from __future__ import annotations

import datetime as dt
import io

from hypothesis import given
from hypothesis import strategies as st

from blackboard import Annotation, Blackboard, Literal
from listener_router.delta import Content, content_hash


def _record(attributes: dict, *, order: list[str] | None = None, bb: Blackboard | None = None,
            rid: str = "r") -> tuple[Blackboard, str]:
    bb = bb or Blackboard.local()
    bb.create(rid)
    for name in order or list(attributes):
        bb.set_literals(rid, name, attributes[name])
    return bb, rid


def _hash(attributes: dict, content: Content | None = None, **kw) -> str:
    return content_hash(*_record(attributes, **kw), content or Content())


def test_the_order_attributes_were_set_in_does_not_count_the_order_of_values_does():
    values = {"title": ["Hi"], "tags": ["a", "b"], "n": [1]}
    assert _hash(values) == _hash(values, order=["n", "tags", "title"])
    assert _hash(values) != _hash({**values, "tags": ["b", "a"]})
    assert _hash(values) != _hash({**values, "tags": ["a", "b", "b"]})


def test_a_values_kind_counts_as_it_does_on_the_blackboard():
    kinds = [1, 1.0, True, "1", dt.date(2026, 1, 1), "2026-01-01",
             dt.datetime(2026, 1, 1, 0, 0), "2026-01-01T00:00:00"]
    hashes = {_hash({"v": [value]}) for value in kinds}
    assert len(hashes) == len(kinds)


def test_annotations_semantic_types_and_the_source_are_not_content():
    plain = _hash({"title": ["Hi"]})
    bb, rid = _record({"title": [Literal("Hi", "text", {"lang": [Annotation(["en"])]})]})
    bb.set_annotation(rid, None, "nextDestination", Annotation(["elsewhere"]))
    bb.set_annotation(rid, "title[-1]", "seen", Annotation(named={"by": "crawler"}))
    bb.set_source(rid, "web")
    assert content_hash(bb, rid) == plain


def test_sub_objects_are_content_by_their_own_attributes():
    bb, rid = _record({"title": ["Hi"]})
    bb.add_object(rid, "author")
    bb.set_literal(rid, "author/name", "Ada")
    first = content_hash(bb, rid)
    bb.set_object_semantic_type(rid, "author", "person")
    assert content_hash(bb, rid) == first
    bb.set_literal(rid, "author/name", "Bob")
    assert content_hash(bb, rid) != first


def test_a_rule_names_the_attributes_and_attachments_that_are_content():
    bb, rid = _record({"title": ["Hi"], "crawled": ["monday"]})
    bb.set_attachment(rid, "Content", b"body")
    bb.set_attachment(rid, "thumb", b"\x89PNG")
    titled = Content.of(["title"], None)
    both = Content.of(["title"], ["Content"])
    before = {c: content_hash(bb, rid, c) for c in (Content(), titled, both)}
    bb.set_literal(rid, "crawled", "tuesday")
    bb.set_attachment(rid, "thumb", b"\x89PNG2")
    assert content_hash(bb, rid, titled) == before[titled]
    assert content_hash(bb, rid, both) == before[both]
    assert content_hash(bb, rid) != before[Content()]
    bb.set_attachment_from_stream(rid, "Content", io.BytesIO(b"other body"))
    assert content_hash(bb, rid, both) != before[both]
    assert content_hash(bb, rid, titled) == before[titled]


def test_a_named_attribute_the_record_lacks_is_absent_and_adding_it_is_a_change():
    content = Content.of(["title", "summary"], [])
    bb, rid = _record({"title": ["Hi"]})
    without = content_hash(bb, rid, content)
    assert without == _hash({"title": ["Hi"]}, Content.of(["title"], []))
    bb.set_literal(rid, "summary", "")
    assert content_hash(bb, rid, content) != without


_scalars = st.one_of(st.text(max_size=5), st.integers(-5, 5), st.booleans(),
                     st.floats(allow_nan=False, allow_infinity=False, width=32))


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=3),
                       st.lists(_scalars, min_size=1, max_size=3), max_size=5),
       st.randoms())
def test_the_hash_is_the_same_however_the_record_was_built_and_after_a_round_trip(values,
                                                                                  rng):
    order = list(values)
    rng.shuffle(order)
    bb, rid = _record(values)
    shuffled = _hash(values, order=order)
    assert content_hash(bb, rid) == shuffled
    other = Blackboard.local()
    other.import_records(bb.export_records([rid]))   # what crosses to a Spark worker and back
    assert content_hash(other, rid) == shuffled
