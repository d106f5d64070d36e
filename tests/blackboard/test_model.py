from __future__ import annotations

import datetime as dt
import json

import pytest

from blackboard import FORMAT, Annotation, Blackboard, BlackboardError, Literal, ValueTypeError
from blackboard._model import MIGRATIONS, literal_to_value, migrate, new_document, value_to_literal


def test_literals_remember_type_semantic_type_and_annotations() -> None:
    ann = Annotation(["x"], {"k": 1})
    lit = Literal(dt.date(2024, 2, 29), "day", {"src": [ann]})
    assert lit.value == dt.date(2024, 2, 29)
    assert lit.data_type == "date"
    assert lit.semantic_type == "day"
    assert lit.annotations == {"src": (ann,)}
    assert Literal(dt.datetime(2024, 1, 1, 12)).data_type == "datetime"
    assert [Literal(v).data_type for v in ("s", 1, 1.5, True)] == ["str", "int", "float", "bool"]


def test_literal_and_annotation_equality_is_type_exact_and_hashable() -> None:
    assert Literal(1) != Literal(True)
    assert Literal(1) != Literal(1.0)
    assert Literal("a", "t") == Literal("a", "t")
    assert len({Literal(1), Literal(1), Literal(True)}) == 2
    assert Annotation([1]) != Annotation([True])
    assert Annotation(named={"a": 1, "b": 2}) == Annotation(named={"b": 2, "a": 1})
    nested = Annotation(annotations={"n": [Annotation(["x"])]})
    assert hash(nested) == hash(Annotation(annotations={"n": (Annotation(["x"]),)}))


def test_an_annotation_pickles_to_an_equal_one() -> None:
    import pickle

    ann = Annotation(["x", 1], {"k": True}, {"n": [Annotation(named={"m": 2.5})]})
    again = pickle.loads(pickle.dumps(ann))
    assert again == ann and hash(again) == hash(ann) and again.annotations == ann.annotations


def test_values_are_immutable() -> None:
    with pytest.raises(AttributeError):
        Literal(1).value = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        Annotation().values = (1,)  # type: ignore[misc]


@pytest.mark.parametrize("bad", [None, b"x", [1], {"a": 1}, float("nan"), float("inf"), object(),
                                 2**63, -2**63 - 1, 2**70])
def test_literals_refuse_values_json_cannot_carry(bad: object) -> None:
    with pytest.raises(ValueTypeError):
        Literal(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [None, dt.date(2020, 1, 1), [1], float("nan"), 2**64])
def test_annotations_refuse_non_scalar_values(bad: object) -> None:
    with pytest.raises(ValueTypeError):
        Annotation([bad])
    with pytest.raises(ValueTypeError):
        Annotation(named={"k": bad})


def test_nested_annotations_must_be_annotations() -> None:
    with pytest.raises(ValueTypeError):
        Annotation(annotations={"n": ["x"]})  # type: ignore[list-item]
    with pytest.raises(ValueTypeError):
        Literal(1, annotations={"n": [1]})  # type: ignore[list-item]


@pytest.mark.parametrize("value", [
    "text", 0, -5, 2**63 - 1, -2**63, 1.25, True, False, dt.date(1999, 12, 31),
    dt.datetime(2024, 5, 1, 8, 30, 15, 123456),
    dt.datetime(2024, 5, 1, 8, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    Literal("x", "kind"), Literal(3, None, {"a": [Annotation([1], {"b": "c"})]}),
])
def test_a_literal_survives_the_document_form_and_json(value: object) -> None:
    stored = json.loads(json.dumps(literal_to_value(value)))
    back = value_to_literal(stored)
    assert back == (value if isinstance(value, Literal) else Literal(value))  # type: ignore[arg-type]


def test_integers_past_64_bits_are_refused_with_the_record_and_path(
        local: Blackboard) -> None:
    with pytest.raises(ValueTypeError) as caught:
        local.set_literal("r", "big", 2**64)
    assert "'r'" in str(caught.value) and "big" in str(caught.value)
    assert "64-bit" in str(caught.value)
    with pytest.raises(ValueTypeError):
        local.set_attributes("r", {"big": [1, 2**64]})


def test_plain_literals_are_stored_bare_and_others_wrapped() -> None:
    assert literal_to_value("x") == "x"
    assert literal_to_value(Literal("x", "t")) == {"lit": "x", "type": "t"}
    assert literal_to_value(dt.date(2020, 1, 2)) == {"lit": "2020-01-02", "dt": "date"}


def test_documents_carry_their_format_version() -> None:
    doc = new_document("r1", source="crawler")
    assert doc["v"] == FORMAT == 1
    assert doc["id"] == "r1" and doc["source"] == "crawler" and doc["parent"] is None


def test_migrate_upgrades_older_formats_and_refuses_newer_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    assert migrate({"id": "x", "meta": {}}) == {"id": "x", "meta": {}}  # no "v": format 1
    with pytest.raises(BlackboardError, match="record 'x': stored in format 99"):
        migrate({"v": 99, "id": "x"})
    monkeypatch.setattr("blackboard._model.FORMAT", 2)
    monkeypatch.setitem(MIGRATIONS, 1, lambda d: {**d, "meta": {"migrated": True}})
    assert migrate({"v": 1, "id": "x", "meta": {}}) == {"v": 2, "id": "x",
                                                        "meta": {"migrated": True}}
