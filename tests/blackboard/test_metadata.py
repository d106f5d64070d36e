"""Every metadata and annotation method of the Blackboard, with its error cases."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blackboard import (
    Annotation,
    Blackboard,
    BlackboardError,
    Literal,
    Path,
    PathError,
    PathStep,
    RecordNotFoundError,
    ValueTypeError,
)


def test_set_get_add_literals(local: Blackboard) -> None:
    local.set_literal("r", "title", "Hello")
    local.add_literal("r", "title", Literal("World", "word"))
    local.add_literal("r", Path("title[7]"), 3)  # the index is irrelevant for add
    assert local.get_literals("r", "title") == [Literal("Hello"), Literal("World", "word"),
                                                Literal(3)]
    assert local.get_literal("r", "title") == Literal("Hello")
    assert local.get_literal("r", "title[1]").semantic_type == "word"
    assert local.literals_size("r", "title") == 3
    assert local.has_literals("r", "title")
    assert local.has_attribute("r", "title")
    local.set_literals("r", "title", ["only", dt.date(2020, 1, 1)])
    assert [lit.value for lit in local.get_literals("r", "title")] == ["only", dt.date(2020, 1, 1)]
    local.set_literal("r", "title[5]", "one")
    assert local.get_literals("r", "title") == [Literal("one")]


def test_absent_attributes_read_as_empty_but_get_literal_raises(local: Blackboard) -> None:
    assert local.get_literals("r", "missing") == []
    assert local.literals_size("r", "missing") == 0
    assert not local.has_literals("r", "missing")
    assert not local.has_attribute("r", "missing")
    assert not local.has_attribute("r", "no/such/object")
    with pytest.raises(PathError) as caught:
        local.get_literal("r", "missing")
    assert "record 'r' path 'missing'" in str(caught.value)
    assert caught.value.record_id == "r"


def test_get_literal_out_of_range_names_record_path_and_count(local: Blackboard) -> None:
    local.set_literals("r", "a", [1, 2])
    with pytest.raises(PathError) as caught:
        local.get_literal("r", "a[2]")
    assert str(caught.value) == ("record 'r' path 'a[2]': index 2 out of range: "
                                 "only 2 literal value(s)")
    with pytest.raises(PathError, match="annotations, not a literal"):
        local.get_literal("r", "a[-1]")


def test_remove_literal_by_index_and_all(local: Blackboard) -> None:
    local.set_literals("r", "a", ["x", "y", "z"])
    local.remove_literal("r", "a[1]")
    assert [v.value for v in local.get_literals("r", "a")] == ["x", "z"]
    with pytest.raises(PathError, match="no literal at index 5"):
        local.remove_literal("r", "a[5]")
    local.remove_literals("r", "a")
    assert not local.has_attribute("r", "a")
    local.remove_literals("r", "a")  # absent: nothing to do
    with pytest.raises(PathError, match="no literal at index 0"):
        local.remove_literal("r", "a")


def test_literals_and_objects_share_an_attribute_and_index_separately(local: Blackboard) -> None:
    local.set_literal("r", "mixed", "lit0")
    local.set_literal("r", "mixed/inner", "in0")   # creates sub-object mixed[0]
    local.set_literal("r", "mixed[1]/inner", "in1")  # and mixed[1]
    local.add_literal("r", "mixed", "lit1")
    assert local.literals_size("r", "mixed") == 2
    assert local.object_size("r", "mixed") == 2
    assert local.get_literal("r", "mixed[1]/inner").value == "in1"
    local.set_literals("r", "mixed", ["only"])  # literals replaced, objects kept
    assert local.object_size("r", "mixed") == 2
    local.remove_object("r", "mixed[0]")
    assert local.get_literal("r", "mixed[0]/inner").value == "in1"
    local.remove_objects("r", "mixed")
    assert not local.has_objects("r", "mixed")
    assert local.get_literals("r", "mixed") == [Literal("only")]


def test_top_level_reads_and_writes_skip_sub_objects_and_keep_them(local: Blackboard) -> None:
    """The inlined top-level paths of get_literal, get_literals and set_literal (a parsed
    record) index literals apart from sub-objects, keep the sub-objects, and leave the record
    unchanged on a bad value."""
    local.set_literal("r", "mixed/inner", "in0")  # sub-object first in the values
    local.add_literal("r", "mixed", "lit0")
    local.set_literal("r", "mixed[1]/inner", "in1")
    local.add_literal("r", "mixed", Literal("lit1", "word"))
    assert local.get_literal("r", "mixed").value == "lit0"
    assert local.get_literal("r", "mixed[1]") == Literal("lit1", "word")
    with pytest.raises(PathError, match="index 2 out of range: only 2 literal value"):
        local.get_literal("r", "mixed[2]")
    local.set_literal("r", "mixed[1]", 7)
    assert local.get_literals("r", "mixed") == [Literal(7)]
    assert local.object_size("r", "mixed") == 2
    assert local.get_literal("r", "mixed[1]/inner").value == "in1"
    with pytest.raises(ValueTypeError):
        local.set_literal("r", "mixed", object())
    assert local.get_literals("r", "mixed") == [Literal(7)]
    assert local.get_literals("r", "mixed[1]") == [Literal(7)]  # every literal, whatever the index
    assert local.get_literals("r", "absent") == []


def test_sub_objects_nest_and_carry_semantic_types(local: Blackboard) -> None:
    local.set_literal("r", "author/name", "Ada")
    local.set_literal("r", "author/address/city", "London")
    assert local.attribute_names("r") == ["author"]
    assert local.attribute_names("r", "author") == ["name", "address"]
    assert local.attribute_names("r", Path("author/address")) == ["city"]
    assert local.get_object_semantic_type("r", "author") is None
    local.set_object_semantic_type("r", "author", "Person")
    assert local.get_object_semantic_type("r", "author[0]") == "Person"
    local.set_object_semantic_type("r", "author", None)
    assert local.get_object_semantic_type("r", "author") is None
    assert local.add_object("r", "author", "Person") == 1
    assert local.get_object_semantic_type("r", "author[1]") == "Person"
    assert local.has_objects("r", "author") and local.object_size("r", "author") == 2
    local.remove_attribute("r", "author")
    assert local.attribute_names("r") == []


def test_creating_objects_only_at_the_next_free_index_and_atomically(local: Blackboard) -> None:
    with pytest.raises(PathError, match=r"no sub-object at 'a\[1\]'"):
        local.set_literal("r", "a[1]/x", 1)
    with pytest.raises(PathError, match="cannot be created"):
        local.set_literal("r", "a/b[2]/x", 1)
    assert local.document("r")["meta"] == {}  # a bad path changed nothing
    with pytest.raises(ValueTypeError):
        local.set_literal("r", "a/b", object())
    assert local.document("r")["meta"] == {}  # nor did a bad value


def test_bad_paths_and_objects_raise_path_errors_naming_the_place(local: Blackboard) -> None:
    local.set_literal("r", "a/b", 1)
    with pytest.raises(PathError) as caught:
        local.get_literals("r", "a[3]/b")
    assert str(caught.value) == ("record 'r' path 'a[3]/b': index 3 out of range at 'a[3]': "
                                 "only 1 sub-object(s)")
    with pytest.raises(PathError, match="record 'r'.*bad path 'a//b'"):
        local.get_literals("r", "a//b")
    with pytest.raises(PathError, match="annotations, not a sub-object"):
        local.get_literals("r", "a[-1]/b")
    with pytest.raises(PathError, match="empty path"):
        local.get_literals("r", "")
    with pytest.raises(PathError, match="no sub-object at 'zz'"):
        local.attribute_names("r", "zz")
    with pytest.raises(PathError):
        local.get_object_semantic_type("r", "nothing")
    with pytest.raises(PathError, match="index -1"):
        local.set_literal("r", "a[-1]", 1)
    with pytest.raises(PathError):
        local.remove_object("r", "a[4]")


@pytest.mark.parametrize("bad", [None, b"bytes", {"a": 1}, [1], float("nan"), object()])
def test_values_of_the_wrong_type_raise_naming_record_and_path(local: Blackboard, bad: object) -> None:
    with pytest.raises(ValueTypeError) as caught:
        local.set_literal("r", "a", bad)
    assert "record 'r' path 'a'" in str(caught.value)
    assert isinstance(caught.value, TypeError)
    assert local.document("r")["meta"] == {}


def test_set_literals_wants_a_list(local: Blackboard) -> None:
    with pytest.raises(ValueTypeError, match="set_literal"):
        local.set_literals("r", "a", "abc")


def test_unknown_records_raise_record_not_found(local: Blackboard) -> None:
    calls = [
        lambda: local.get_literals("nope", "a"), lambda: local.set_literal("nope", "a", 1),
        lambda: local.attribute_names("nope"), lambda: local.get_annotations("nope", None, "a"),
        lambda: local.has_attachment("nope", "a"), lambda: local.commit("nope"),
        lambda: local.get_record_note("nope", "n"), lambda: local.split("nope", "f"),
        lambda: local.delete("nope"), lambda: local.document("nope"),
    ]
    for call in calls:
        with pytest.raises(RecordNotFoundError) as caught:
            call()
        assert "record 'nope' is not on this blackboard" in str(caught.value)
    with pytest.raises(BlackboardError, match="bad record ID"):
        local.get_literals("", "a")
    with pytest.raises(BlackboardError, match="bad record ID"):
        local.create(7)  # type: ignore[arg-type]


def test_annotations_on_record_attribute_object_and_literal(local: Blackboard) -> None:
    rec = Annotation(["r"], {"k": 1})
    att = Annotation(named={"source": "crawler"})
    obj = Annotation(["o"], annotations={"inner": [Annotation([True])]})
    local.set_literal("r", "a", 1)
    local.set_literal("r", "o/x", 1)
    local.set_annotation("r", None, "rec", rec)
    local.set_annotation("r", "a[-1]", "att", att)
    local.add_annotation("r", Path().add("a", PathStep.ATTRIBUTE_ANNOTATION), "att", rec)
    local.set_annotation("r", "o", "obj", obj)
    local.set_literal("r", "lit", Literal("v", None, {"l": [Annotation([1.5])]}))

    assert local.annotation_names("r") == ["rec"]
    assert local.annotation_names("r", "") == ["rec"]
    assert local.get_annotation("r", None, "rec") == rec
    assert local.get_annotations("r", "a[-1]", "att") == [att, rec]
    assert local.get_annotation("r", "a[-1]", "att") == att
    assert local.has_annotations("r", "o") and local.has_annotation("r", "o", "obj")
    assert local.get_annotation("r", "o", "obj").annotations["inner"][0].values == (True,)
    assert local.get_literal("r", "lit").annotations == {"l": (Annotation([1.5]),)}
    assert local.get_annotation("r", "o", "missing") is None
    assert local.get_annotations("r", "o", "missing") == []
    assert not local.has_annotation("r", "a[-1]", "missing")
    assert not local.has_annotations("r", "absent[-1]")
    assert local.annotation_names("r", "absent[-1]") == []

    local.set_annotations("r", "a[-1]", "att", [att, att, att])
    assert len(local.get_annotations("r", "a[-1]", "att")) == 3
    local.remove_annotation("r", "a[-1]", "att")
    assert not local.has_annotations("r", "a[-1]")
    local.remove_annotation("r", "a[-1]", "att")  # absent: no-op
    local.set_annotations("r", None, "rec", [])
    assert not local.has_annotation("r", None, "rec")
    local.remove_annotations("r", "o")
    assert not local.has_annotations("r", "o")


def test_annotation_errors(local: Blackboard) -> None:
    with pytest.raises(ValueTypeError, match="expected an Annotation"):
        local.set_annotation("r", None, "n", {"values": [1]})  # type: ignore[arg-type]
    with pytest.raises(ValueTypeError, match="annotation name"):
        local.add_annotation("r", None, "", Annotation())
    with pytest.raises(PathError, match="no sub-object at 'x'"):
        local.get_annotations("r", "x", "n")
    with pytest.raises(PathError, match="cannot be created"):
        local.set_annotation("r", "x/y[3]", "n", Annotation())
    assert local.document("r")["meta"] == {}


def test_message_attributes_round_trip_as_plain_json(local: Blackboard) -> None:
    attrs = {"title": "T", "tags": ["a", "b"], "n": 3, "author": {"name": "A", "ids": [1, 2]}}
    local.set_attributes("r", attrs)
    assert local.get_attributes("r") == attrs
    assert local.get_attributes("r", ["n", "absent"]) == {"n": 3}
    assert local.get_literal("r", "author/ids[1]").value == 2
    with pytest.raises(ValueTypeError, match="record 'r' path 'bad'"):
        local.set_attributes("r", {"bad": None})
    with pytest.raises(PathError, match="bad attribute name"):
        local.set_attributes("r", {"a/b": 1})


@given(st.text(), st.integers(0, 2))
def test_get_literal_of_a_plain_string_equals_the_literal_made_from_it(text: str, index: int) -> None:
    bb = Blackboard.local()
    bb.create("r")
    bb.set_literals("r", "a", [1, *[f"{text}{i}" for i in range(index)], text])
    got = bb.get_literal("r", f"a[{index + 1}]")
    assert got == Literal(text) and hash(got) == hash(Literal(text))
    assert (got.value, got.semantic_type, got.annotations, repr(got)) == \
        (text, None, {}, repr(Literal(text)))
    with pytest.raises(AttributeError):
        got.value = "other"  # type: ignore[misc]
