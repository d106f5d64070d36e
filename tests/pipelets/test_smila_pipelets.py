"""The Python counterparts of SMILA's test, example, splitter and index pipelets."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pipelets_helpers import configured, make, values

from blackboard import Annotation, Blackboard
from pipelets import (
    AddLiteral,
    ErrorOnDemand,
    FileUri,
    FullTextIndex,
    FullTextSearch,
    HelloWorld,
    PipeletConfigurationError,
    PipeletError,
    SetAttributes,
    Splitter,
    XmlSplit,
)
from pipelets.split import iter_snippets

# -- SMILA's test and example pipelets ---------------------------------------------------

def test_splitter_replaces_each_record_by_three_fragment_copies(bb: Blackboard) -> None:
    make(bb, "a", title="A")
    make(bb, "b")
    out = configured(Splitter).process(bb, ["a", "b"])
    assert out == [f"{r}#fragment{j}" for r in "ab" for j in range(3)]
    assert bb.get_attributes("a#fragment1") == {"title": "A"}
    assert bb.document("a#fragment1")["parent"] == "a"
    two = configured(Splitter, factor=2, marker="part", indexAttribute="n").process(bb, ["b"])
    assert two == ["b#part0", "b#part1"] and values(bb, "b#part1", "n") == [1]


def test_splitter_refuses_a_marker_with_the_fragment_separator() -> None:
    with pytest.raises(PipeletConfigurationError, match="must not contain '#'"):
        configured(Splitter, marker="a#b")


def test_add_literal_numbers_records_within_each_instance(bb: Blackboard) -> None:
    for rid in ("a1", "a2", "b1"):
        make(bb, rid)
    bb.bind_instance(0, ["a1", "a2"])
    bb.bind_instance(1, ["b1"])
    pipelet = configured(AddLiteral)
    pipelet.process(bb, ["a1", "b1", "a2"])
    pipelet.process(bb, ["a1"])
    attr = AddLiteral.DEFAULT_ATTRIBUTE
    assert values(bb, "a1", attr) == ["SMILA #0", "SMILA #0"]
    assert values(bb, "a2", attr) == ["SMILA #1"] and values(bb, "b1", attr) == ["SMILA #0"]


def test_error_on_demand_fails_only_the_records_that_ask(bb: Blackboard) -> None:
    make(bb, "fine")
    make(bb, "processing", **{ErrorOnDemand.DEFAULT_SETTING: {"mode": "PROCESSING"}})
    make(bb, "runtime")
    bb.set_annotation("runtime", None, ErrorOnDemand.DEFAULT_SETTING, Annotation(named={"mode": "runtime"}))
    make(bb, "invalid", **{ErrorOnDemand.DEFAULT_SETTING: {"mode": "INVALID_ID"}})
    pipelet = configured(ErrorOnDemand)
    assert pipelet.process(bb, ["fine"]) == ["fine"]
    with pytest.raises(PipeletError) as info:
        pipelet.process(bb, ["fine", "processing"])
    assert info.value.record_id == "processing"
    with pytest.raises(PipeletError) as info:
        pipelet.process(bb, ["runtime"])
    assert info.value.record_id == "runtime" and isinstance(info.value.__cause__, RuntimeError)
    assert pipelet.process(bb, ["fine", "invalid"]) == ["fine", "ErrorPipelet-invalidId"]


def test_error_on_demand_sleeps_for_timeout_and_takes_a_mode_for_all(bb: Blackboard) -> None:
    make(bb, "r")
    started = time.monotonic()
    assert configured(ErrorOnDemand, mode="TIMEOUT", timeoutSeconds="1").process(bb, ["r"]) == ["r"]
    assert time.monotonic() - started >= 1
    with pytest.raises(PipeletConfigurationError):
        configured(ErrorOnDemand, mode="SOMETIMES")


def test_hello_world_appends_its_greeting(bb: Blackboard) -> None:
    make(bb, "r", Title="Chalk", flag=True)
    make(bb, "empty")
    configured(HelloWorld, source_attribute_name="Title", target_attribute_name="Greeting").process(bb, ["r", "empty"])
    assert values(bb, "r", "Greeting") == ["Chalk --- Hello world!!!"]
    assert values(bb, "empty", "Greeting") == [" --- Hello world!!!"]
    configured(HelloWorld, input="flag", output="flag").process(bb, ["r"])
    assert values(bb, "r", "flag") == ["true --- Hello world!!!"]


def test_set_attributes_writes_each_configured_value_with_its_shape(bb: Blackboard) -> None:
    make(bb, "r", one="old")
    configured(SetAttributes, one="new", many=["a", "b"], sub={"k": "v", "n": 2}).process(bb, ["r"])
    assert bb.get_attributes("r") == {"one": "new", "many": ["a", "b"], "sub": {"k": "v", "n": 2}}
    with pytest.raises(PipeletConfigurationError, match="cannot be written"):
        configured(SetAttributes, bad=None)


def test_file_uri_from_an_attribute_or_the_id(bb: Blackboard, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    make(bb, "/data/a b.txt")
    make(bb, "r", path="C:\\docs\\x.txt")
    make(bb, "rel", path="notes/y.txt")
    configured(FileUri).process(bb, ["/data/a b.txt"])
    configured(FileUri, _filenameAttribute="path").process(bb, ["r", "rel"])
    assert values(bb, "/data/a b.txt", "rdf:about") == ["file:/data/a%20b.txt"]
    assert values(bb, "r", "rdf:about") == ["file:/C:/docs/x.txt"]
    assert values(bb, "rel", "rdf:about") == [f"file:{tmp_path}/notes/y.txt"]
    make(bb, "none")
    with pytest.raises(PipeletError, match="'path' .* is missing"):
        configured(FileUri, filenameAttribute="path").process(bb, ["none"])


# -- XmlSplit ---------------------------------------------------------------------------

DUMP = (b"<?xml version='1.0'?><mediawiki><siteinfo><title>not a page</title></siteinfo>"
        b"<page><title>Alpha &amp; Co</title><text>one</text></page>\n"
        b"<page id='2'><title>Beta</title><text>two &lt;b&gt;</text></page>"
        b"<page><text>no key</text></page>"
        b"<page><title>Alpha &amp; Co</title><text>again</text></page>"
        b"<page><title>A#B</title></page></mediawiki>")


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
def test_snippets_are_found_whatever_the_chunk_size(chunk: int) -> None:
    snippets = list(iter_snippets(io.BytesIO(DUMP), "page", False, "page", True, chunk))
    assert len(snippets) == 5
    assert snippets[1] == b"<page id='2'><title>Beta</title><text>two &lt;b&gt;</text></page>"


def test_snippet_markers_may_be_closing_or_opening_tags() -> None:
    data = b"<a><x>1</x><sep/><x>2</x><sep/></a>"
    between = list(iter_snippets(io.BytesIO(data), "x", True, "sep", False))
    assert between == [b"", b""]
    assert list(iter_snippets(io.BytesIO(b"<r><h/>A<h/>B<end/></r>"), "h", False, "h", False, 2)) == [b"<h/>A"]


def test_xml_split_makes_a_fragment_per_keyed_snippet(bb: Blackboard) -> None:
    make(bb, "dump", Title="parent", other="x")
    bb.set_attachment("dump", "Content", DUMP)
    pipelet = configured(XmlSplit, beginTagName="page", isBeginClosingTag="false", endTagName="page",
                         isEndClosingTag="true", keyTagName="title")
    out = pipelet.process(bb, ["dump"])
    assert out == ["dump", "dump#Alpha & Co", "dump#Beta", "dump#Alpha & Co (2)", "dump#A%23B"]
    assert bb.get_attributes("dump#Beta") == {
        "Content": "<page id='2'><title>Beta</title><text>two &lt;b&gt;</text></page>",
        "MessageProperties": {"isXmlSnippet": "true"}}
    assert bb.attachment_names("dump#Beta") == []


def test_xml_split_reads_a_file_named_by_an_attribute_into_attachments(bb: Blackboard, tmp_path: Path) -> None:
    dump = tmp_path / "dump.xml"
    dump.write_bytes(DUMP)
    make(bb, "p", Path=str(dump))
    make(bb, "u", Path=dump.as_uri())
    make(bb, "web", Path="http://example.org/dump.xml")
    pipelet = configured(XmlSplit, beginTagName="page", endTagName="page", keyTagName="title",
                         inputType="ATTRIBUTE", inputName="Path", outputType="ATTACHMENT", outputName="Xml",
                         keepParent="false", baseDirectory=str(tmp_path))
    assert pipelet.process(bb, ["p"])[1] == "p#Beta"
    assert bb.get_attachment("p#Beta", "Xml").startswith(b"<page id='2'>")
    assert len(pipelet.process(bb, ["u"])) == 4  # the fragments only (keepParent false)
    with pytest.raises(PipeletError, match="reading URLs is not supported"):
        pipelet.process(bb, ["web"])


def test_xml_split_takes_smila_s_id_separator_only_as_the_fragment_separator() -> None:
    base = dict(beginTagName="page", endTagName="page", keyTagName="title")
    configured(XmlSplit, idSeparator="#", maxBufferSize="20", **base)
    with pytest.raises(PipeletConfigurationError, match="only '#'"):
        configured(XmlSplit, idSeparator="/", **base)
    with pytest.raises(PipeletConfigurationError, match="not an XML tag name"):
        configured(XmlSplit, beginTagName="pa ge", endTagName="page", keyTagName="title")


# -- full-text index ----------------------------------------------------------------------

def _index(tmp_path: Path, **config: Any) -> FullTextIndex:
    return configured(FullTextIndex, directory=str(tmp_path), **config)


def _search(bb: Blackboard, tmp_path: Path, query: str, **config: Any) -> list[str]:
    make(bb, "q", Query=query) if "q" not in bb else bb.set_literal("q", "Query", query)
    configured(FullTextSearch, directory=str(tmp_path), indexname="docs", **config).process(bb, ["q"])
    return values(bb, "q", "Results") if bb.has_attribute("q", "Results") else []


def test_index_takes_smila_s_indexing_map_and_finds_records(bb: Blackboard, tmp_path: Path) -> None:
    make(bb, "a", Title="Blue whales", Body={"Text": "swim in oceans"})
    make(bb, "b", Title="Red foxes", tags=["forest", "night"])
    _index(tmp_path, _indexing={"indexname": "docs", "executionMode": "ADD", "allowDoublets": "false"}).process(
        bb, ["a", "b"])
    assert _search(bb, tmp_path, "oceans") == ["a"]
    assert _search(bb, tmp_path, "forest OR whales") and set(_search(bb, tmp_path, "forest OR whales")) == {"a", "b"}
    assert _search(bb, tmp_path, "nothing") == []


def test_index_replaces_an_entry_unless_doublets_are_allowed_and_deletes(bb: Blackboard, tmp_path: Path) -> None:
    make(bb, "a", Title="first words")
    add = _index(tmp_path, indexName="docs")
    add.process(bb, ["a"])
    bb.set_literal("a", "Title", "second words")
    add.process(bb, ["a"])
    assert _search(bb, tmp_path, "first") == [] and _search(bb, tmp_path, "second") == ["a"]
    _index(tmp_path, indexName="docs", allowDoublets="true").process(bb, ["a"])
    assert _search(bb, tmp_path, "words", maxCount="5") == ["a", "a"]
    _index(tmp_path, _indexing={"indexName": "docs", "executionMode": "DELETE"}).process(bb, ["a"])
    assert _search(bb, tmp_path, "words") == []


def test_search_writes_scores_and_refuses_bad_queries(bb: Blackboard, tmp_path: Path) -> None:
    make(bb, "a", Title="chalk chalk board")
    make(bb, "b", Title="chalk")
    _index(tmp_path, indexname="docs", attributes="Title").process(bb, ["a", "b"])
    make(bb, "q", Query="chalk")
    configured(FullTextSearch, directory=str(tmp_path), indexname="docs", scoreAttribute="Scores").process(bb, ["q"])
    scores = values(bb, "q", "Scores")
    assert len(scores) == 2 and all(s > 0 for s in scores)
    bb.set_literal("q", "Query", 'unbalanced "quote')
    with pytest.raises(PipeletError) as info:
        configured(FullTextSearch, directory=str(tmp_path), indexname="docs").process(bb, ["q"])
    assert info.value.record_id == "q" and "FTS5 syntax" in str(info.value)


def _index_one_record(directory: str, tag: str, barrier: Any, answers: Any) -> None:
    bb = Blackboard.local()
    make(bb, tag, Title=f"written by {tag}")
    barrier.wait()
    try:
        configured(FullTextIndex, directory=directory, indexname="docs").process(bb, [tag])
        answers.put("ok")
    except Exception as e:  # noqa: BLE001 (the answer names it)
        answers.put(repr(e))


def test_two_processes_opening_a_new_index_at_once_both_write(bb: Blackboard, tmp_path: Path) -> None:
    """Two Spark workers of one batch may open a new index together: switching the file
    to WAL mode is refused at once while the other opens it ("database is locked"),
    which failed about one pair in forty before the switch was tried again."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for round_ in range(60):
        directory = str(tmp_path / f"round{round_}")
        barrier, answers = context.Barrier(2), context.Queue()
        workers = [context.Process(target=_index_one_record, args=(directory, tag, barrier, answers))
                   for tag in ("left", "right")]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert [answers.get(timeout=10) for _ in workers] == ["ok", "ok"], f"round {round_}"
        assert sorted(_search(bb, Path(directory), "written")) == ["left", "right"]


def test_index_configuration_errors_name_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(PipeletConfigurationError, match="'indexname'"):
        _index(tmp_path, _indexing={"executionMode": "ADD"})
    with pytest.raises(PipeletConfigurationError, match="bad index name"):
        _index(tmp_path, indexname="../escape")
    with pytest.raises(PipeletConfigurationError, match="executionMode"):
        _index(tmp_path, indexname="docs", executionMode="UPDATE")
    with pytest.raises(PipeletConfigurationError, match="given in _indexing and outside it"):
        _index(tmp_path, indexname="docs", _indexing={"indexname": "other"})


def _path_splitter(base: Path) -> XmlSplit:
    return configured(XmlSplit, beginTagName="page", endTagName="page", keyTagName="title",
                      inputType="attribute", inputName="Path", keepParent="false",
                      baseDirectory=str(base))


def test_xml_split_reads_a_path_only_with_a_base_directory(tmp_path: Path) -> None:
    base = dict(beginTagName="page", endTagName="page", keyTagName="title", inputType="attribute",
                inputName="Path")
    with pytest.raises(PipeletConfigurationError, match="baseDirectory"):
        configured(XmlSplit, **base)
    with pytest.raises(PipeletConfigurationError, match="no folder"):
        configured(XmlSplit, baseDirectory=str(tmp_path / "missing"), **base)


def test_xml_split_reads_regular_files_inside_its_base_directory(bb: Blackboard,
                                                                 tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    (dumps / "2024").mkdir(parents=True)
    (dumps / "2024" / "dump.xml").write_bytes(DUMP)
    make(bb, "rel", Path="2024/dump.xml")
    make(bb, "abs", Path=str(dumps / "2024" / "dump.xml"))
    make(bb, "url", Path=(dumps / "2024" / "dump.xml").as_uri())
    pipelet = _path_splitter(dumps)
    for rid in ("rel", "abs", "url"):
        assert f"{rid}#Beta" in pipelet.process(bb, [rid])


@pytest.mark.parametrize("name, words", [
    ("outside", "outside baseDirectory"),
    ("dotdot", "outside baseDirectory"),
    ("link-out", "outside baseDirectory"),
    ("environ", "outside baseDirectory"),
    ("device", "outside baseDirectory"),
    ("fifo", "not a regular file"),
    ("folder", "not a regular file"),
    ("link-device", "outside baseDirectory"),
])
def test_xml_split_refuses_every_path_but_a_regular_file_inside(bb: Blackboard, tmp_path: Path,
                                                                name: str, words: str) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    private = tmp_path / "private.xml"
    private.write_bytes(b"<r><page><title>SECRET</title></page></r>")
    (dumps / "link-out.xml").symlink_to(private)
    (dumps / "zero").symlink_to("/dev/zero")
    os.mkfifo(dumps / "pipe")
    (dumps / "sub").mkdir()
    paths = {"outside": str(private), "dotdot": "../private.xml", "link-out": "link-out.xml",
             "environ": "/proc/self/environ", "device": "/dev/zero", "fifo": "pipe",
             "folder": "sub", "link-device": "zero"}
    make(bb, "m", Path=paths[name])
    started = time.monotonic()
    with pytest.raises(PipeletError, match=words) as err:
        _path_splitter(dumps).process(bb, ["m"])
    assert time.monotonic() - started < 5       # a FIFO with no writer does not block
    assert err.value.record_id == "m" and "'Path'" in str(err.value)
    assert not [r for r in bb.attribute_names("m") if r.startswith("m#")]
