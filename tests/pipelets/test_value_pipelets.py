from __future__ import annotations

import datetime as dt

import pytest
from pipelets_helpers import configured, make, values

from blackboard import Annotation, Blackboard, Literal
from pipelets import PipeletConfigurationError, PipeletError
from pipelets.values import AddValues, Copy, RemoveAttribute, Rename, SetValue, SubAttributeExtract


def test_set_value_replaces_the_values(bb):
    make(bb, "a", status=["old", "older"])
    configured(SetValue, attribute="status", value="new").process(bb, ["a"])
    assert values(bb, "a", "status") == ["new"]


def test_set_value_converts_xml_text_to_the_type_asked(bb):
    make(bb, "a")
    configured(SetValue, attribute="n", values=["3", "4"], type="int").process(bb, ["a"])
    configured(SetValue, attribute="d", value="2024-05-01", type="date").process(bb, ["a"])
    configured(SetValue, attribute="f", value="true", type="bool").process(bb, ["a"])
    assert values(bb, "a", "n") == [3, 4]
    assert values(bb, "a", "d") == [dt.date(2024, 5, 1)]
    assert values(bb, "a", "f") == [True]


def test_set_value_rejects_a_value_of_the_wrong_type():
    with pytest.raises(PipeletConfigurationError) as err:
        SetValue().configure({"attribute": "n", "value": "three", "type": "int"})
    assert "'value'" in str(err.value)


def test_add_values_with_smila_parameter_names_appends(bb):
    make(bb, "a", out="value0")
    make(bb, "b")
    p = configured(AddValues, outputAttribute="out", valuesToAdd=["value1", "value2"])
    assert p.process(bb, ["a", "b"]) == ["a", "b"]
    assert values(bb, "a", "out") == ["value0", "value1", "value2"]
    assert values(bb, "b", "out") == ["value1", "value2"]


def test_add_values_takes_a_single_value_and_a_semantic_type(bb):
    make(bb, "a")
    configured(AddValues, attribute="tag", values="x", semanticType="keyword").process(bb, ["a"])
    assert bb.get_literals("a", "tag") == [Literal("x", "keyword")]


def test_add_values_refuses_both_names_for_one_setting():
    with pytest.raises(PipeletConfigurationError) as err:
        AddValues().configure({"attribute": "a", "outputAttribute": "b", "values": "x"})
    assert "given twice" in str(err.value)


def test_copy_attribute_to_attribute_keeps_sub_objects_and_annotations(bb):
    make(bb, "a", src=["v", {"k": "s"}])
    bb.set_annotation("a", "src[-1]", "origin", Annotation(["web"]))
    configured(Copy, input="src", output="dst").process(bb, ["a"])
    assert bb.get_attributes("a", ["dst"]) == {"dst": ["v", {"k": "s"}]}
    assert bb.get_annotation("a", "dst[-1]", "origin") == Annotation(["web"])
    assert bb.has_attribute("a", "src")


def test_copy_attachment_to_attribute_in_smila_terms_and_move(bb):
    make(bb, "a")
    bb.set_attachment("a", "Content", "grüße".encode())
    configured(Copy, inputType="ATTACHMENT", outputType="ATTRIBUTE", inputName="Content",
               outputName="Content", mode="MOVE").process(bb, ["a"])
    assert values(bb, "a", "Content") == ["grüße"]
    assert not bb.has_attachment("a", "Content")


def test_copy_attribute_to_attachment_joins_values(bb):
    make(bb, "a", lines=["one", "two"])
    configured(Copy, input="lines", output="text", outputType="attachment").process(bb, ["a"])
    assert bb.get_attachment("a", "text") == b"one\ntwo"


def test_copy_fails_the_record_whose_attachment_is_not_text(bb):
    make(bb, "good")
    make(bb, "bad")
    bb.set_attachment("good", "c", b"ok")
    bb.set_attachment("bad", "c", b"\xff\xfe\xfa")
    p = configured(Copy, input="c", inputType="attachment", output="t")
    p.process(bb, ["good"])
    with pytest.raises(PipeletError) as err:
        p.process(bb, ["bad"])
    assert err.value.record_id == "bad"
    assert "utf-8" in str(err.value)


def test_copy_passes_records_without_the_source(bb):
    make(bb, "a")
    configured(Copy, input="missing", output="x").process(bb, ["a"])
    assert bb.attribute_names("a") == []


def test_copy_rejects_an_unknown_input_type():
    with pytest.raises(PipeletConfigurationError) as err:
        Copy().configure({"input": "a", "output": "b", "inputType": "file"})
    assert "'inputType'" in str(err.value)


def test_rename_moves_values_with_their_types(bb):
    bb.create("a")
    bb.set_literals("a", "old", [Literal("x", "t"), 2])
    configured(Rename, **{"from": "old", "to": "new"}).process(bb, ["a"])
    assert bb.get_literals("a", "new") == [Literal("x", "t"), Literal(2)]
    assert not bb.has_attribute("a", "old")


def test_rename_into_its_own_sub_object_fails_naming_the_record(bb):
    make(bb, "a", old={"k": "v"})
    with pytest.raises(PipeletError) as err:
        configured(Rename, **{"from": "old", "to": "old/k2"}).process(bb, ["a"])
    assert err.value.record_id == "a"


def test_remove_attribute_takes_a_comma_separated_list(bb):
    make(bb, "a", x=1, y=2, z=3)
    configured(RemoveAttribute, attributes="x, y, absent").process(bb, ["a"])
    assert bb.attribute_names("a") == ["z"]


def test_sub_attribute_extract_walks_every_sub_object(bb):
    make(bb, "a", Authors=[{"Name": "Ann"}, {"Name": ["Bob", "Bo"]}, {"Mail": "x"}])
    configured(SubAttributeExtract, inputPath="Authors/Name", outputPath="Author").process(bb, ["a"])
    assert values(bb, "a", "Author") == ["Ann", "Bob", "Bo"]


@pytest.mark.parametrize("mode, expected", [("FIRST", ["Ann"]), ("LAST", ["Bo"]),
                                            ("ALL_AS_ONE", ["Ann Bob Bo"])])
def test_sub_attribute_extract_modes(bb, mode, expected):
    make(bb, "a", Authors=[{"Name": "Ann"}, {"Name": ["Bob", "Bo"]}])
    configured(SubAttributeExtract, inputPath="Authors/Name", outputPath="o",
               mode=mode).process(bb, ["a"])
    assert values(bb, "a", "o") == expected


def test_value_pipelets_on_a_stored_blackboard(sqlite_url):
    with Blackboard.connect(sqlite_url) as board:
        make(board, "r", title="T", tmp="x")
        board.set_attachment("r", "Content", b"body")
        board.commit("r")
    with Blackboard.connect(sqlite_url) as board:
        board.load("r")
        configured(Copy, input="Content", inputType="attachment", output="text").process(board, ["r"])
        configured(Rename, **{"from": "title", "to": "Title"}).process(board, ["r"])
        configured(RemoveAttribute, attribute="tmp").process(board, ["r"])
        configured(AddValues, attribute="tags", values=["a", "b"]).process(board, ["r"])
        board.commit("r")
    with Blackboard.connect(sqlite_url) as board:
        board.load("r")
        assert board.get_attributes("r") == {"text": "body", "Title": "T", "tags": ["a", "b"]}
        assert board.get_attachment("r", "Content") == b"body"
