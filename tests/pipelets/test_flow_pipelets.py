from __future__ import annotations

import pytest
from pipelets_helpers import configured, make, values

from blackboard import Blackboard
from pipelets import PipeletConfigurationError
from pipelets.filtering import Filter
from pipelets.fingerprint import Fingerprint
from pipelets.split import DocumentSplitter, split_text

TEXT = "First paragraph.\n\n  Second one,\nstill second.\n\n\n\nThird."


def test_split_text_by_paragraphs():
    assert split_text(TEXT) == ["First paragraph.", "Second one,\nstill second.", "Third."]


def test_split_text_by_size_packs_paragraphs_and_cuts_long_ones():
    pieces = split_text("aaa bbb ccc ddd. eee fff\n\nx\n\ny", "size", 10)
    assert pieces == ["aaa bbb", "ccc ddd.", "eee fff\n\nx", "y"]


def test_split_text_cuts_words_longer_than_the_size():
    assert split_text("abcdefghij", "paragraphs", 4) == ["abcd", "efgh", "ij"]


def test_document_splitter_makes_fragments_that_replace_the_record(bb):
    make(bb, "doc", Content=TEXT, title="T")
    bb.set_attachment("doc", "raw", b"bytes")
    out = configured(DocumentSplitter, indexAttribute="n").process(bb, ["doc"])
    assert out == ["doc#0", "doc#1", "doc#2"]
    assert values(bb, "doc#1", "Content") == ["Second one,\nstill second."]
    assert values(bb, "doc#1", "n") == [1]
    assert values(bb, "doc#1", "title") == ["T"]
    assert bb.document("doc#1")["parent"] == "doc"
    assert bb.attachment_names("doc#1") == []
    assert values(bb, "doc", "Content") == [TEXT]


def test_document_splitter_keeps_the_parent_and_attachments_when_asked(bb):
    make(bb, "doc", Content=TEXT)
    bb.set_attachment("doc", "raw", b"bytes")
    out = configured(DocumentSplitter, keepParent="true", keepAttachments=True, mode="size",
                     maxSize="1000", output="piece").process(bb, ["doc"])
    assert out == ["doc", "doc#0"]
    assert not bb.has_attribute("doc#0", "Content")
    assert bb.get_attachment("doc#0", "raw") == b"bytes"


def test_document_splitter_lets_records_without_text_go_on(bb):
    make(bb, "empty", Content="   ")
    make(bb, "none")
    assert configured(DocumentSplitter).process(bb, ["empty", "none"]) == ["empty", "none"]


def test_document_splitter_needs_a_size_in_size_mode():
    with pytest.raises(PipeletConfigurationError) as err:
        DocumentSplitter().configure({"mode": "size"})
    assert "'maxSize'" in str(err.value)


def test_document_splitter_fragments_are_stored_on_commit(sqlite_url):
    with Blackboard.connect(sqlite_url) as board:
        make(board, "doc", Content="one\n\ntwo")
        board.commit("doc")
    with Blackboard.connect(sqlite_url) as board:
        board.load("doc")
        out = configured(DocumentSplitter).process(board, ["doc"])
        board.commit_many(["doc", *out])
    with Blackboard.connect(sqlite_url) as board:
        board.load_many(["doc#0", "doc#1"])
        assert not board.is_new("doc#1")
        assert board.get_attributes("doc#1") == {"Content": "two"}


def test_fingerprint_is_equal_for_equal_content_and_differs_otherwise(bb):
    make(bb, "a", title="Hello", body=["x", "y"], url="http://a")
    make(bb, "b", title="Hello", body=["x", "y"], url="http://b")
    make(bb, "c", title="Hello", body=["y", "x"], url="http://a")
    p = configured(Fingerprint, attributes="title, body")
    p.process(bb, ["a", "b", "c"])
    fa, fb, fc = (values(bb, r, "fingerprint")[0] for r in "abc")
    assert fa == fb != fc
    assert len(fa) == 64 and int(fa, 16) >= 0


def test_fingerprint_tells_absent_from_empty_and_can_normalize(bb):
    make(bb, "absent")
    make(bb, "empty", t="")
    make(bb, "loose", t="  Hello   WORLD ")
    make(bb, "tight", t="hello world")
    configured(Fingerprint, attribute="t", algorithm="md5").process(bb, ["absent", "empty"])
    assert values(bb, "absent", "fingerprint") != values(bb, "empty", "fingerprint")
    configured(Fingerprint, attribute="t", normalize="yes", output="fp").process(
        bb, ["loose", "tight"])
    assert values(bb, "loose", "fp") == values(bb, "tight", "fp")


def test_fingerprint_of_attachments_and_of_everything(bb):
    make(bb, "a", x=1)
    make(bb, "b", x=1)
    bb.set_attachment("a", "Content", b"data")
    bb.set_attachment("b", "Content", b"data!")
    configured(Fingerprint, attachments="Content", output="att").process(bb, ["a", "b"])
    assert values(bb, "a", "att") != values(bb, "b", "att")
    p = configured(Fingerprint)
    p.process(bb, ["a"])
    first = values(bb, "a", "fingerprint")
    p.process(bb, ["a"])   # the output itself is not hashed: stable on re-run
    assert values(bb, "a", "fingerprint") == first


def test_fingerprint_rejects_an_unknown_algorithm():
    with pytest.raises(PipeletConfigurationError) as err:
        Fingerprint().configure({"algorithm": "crc32"})
    assert "'algorithm'" in str(err.value)


def _filter_ids(bb, **config):
    return configured(Filter, **config).process(bb, ["a", "b", "c"])


def test_filter_by_existence_equality_and_regex(bb):
    make(bb, "a", lang="de", n=3)
    make(bb, "b", lang=["en", "EN-us"], n=4)
    make(bb, "c")
    assert _filter_ids(bb, attribute="lang") == ["a", "b"]
    assert _filter_ids(bb, attribute="lang", invert="true") == ["c"]
    assert _filter_ids(bb, attribute="lang", equals="de") == ["a"]
    assert _filter_ids(bb, attribute="n", equals=["3", "5"]) == ["a"]
    assert _filter_ids(bb, attribute="lang", matches="^en-", ignoreCase=True) == ["b"]
    assert _filter_ids(bb, attribute="lang", equals="DE", ignoreCase="yes", invert=True) == \
        ["b", "c"]


def test_filter_rejects_two_conditions_and_bad_regex():
    with pytest.raises(PipeletConfigurationError):
        Filter().configure({"attribute": "a", "equals": "x", "matches": "y"})
    with pytest.raises(PipeletConfigurationError) as err:
        Filter().configure({"attribute": "a", "matches": "(("})
    assert "'matches'" in str(err.value)
