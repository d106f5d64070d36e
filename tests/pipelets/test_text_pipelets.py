from __future__ import annotations

import pytest
from pipelets_helpers import configured, make, values

from blackboard import Blackboard, Literal
from pipelets import PipeletConfigurationError, PipeletError
from pipelets.text import (
    Lowercase,
    NormalizeWhitespace,
    RegexExtract,
    Replace,
    WordCount,
    count_words,
)


def test_normalize_whitespace_collapses_and_strips_every_value(bb):
    make(bb, "a", title=["  Hello \t\n  World ", "x  y"])
    out = configured(NormalizeWhitespace, attribute="title").process(bb, ["a"])
    assert out == ["a"]
    assert values(bb, "a", "title") == ["Hello World", "x y"]


def test_normalize_whitespace_lowercases_when_asked_as_xml_string(bb):
    make(bb, "a", title=" Big   CAT ")
    configured(NormalizeWhitespace, attribute="title", lowercase="true").process(bb, ["a"])
    assert values(bb, "a", "title") == ["big cat"]


def test_normalize_whitespace_writes_to_output_and_keeps_source(bb):
    make(bb, "a", title=" A  B ")
    configured(NormalizeWhitespace, attribute="title", output="clean").process(bb, ["a"])
    assert values(bb, "a", "title") == [" A  B "]
    assert values(bb, "a", "clean") == ["A B"]


def test_normalize_whitespace_passes_records_without_the_attribute(bb):
    make(bb, "a", other="x")
    make(bb, "b", title=" y ")
    p = configured(NormalizeWhitespace, attribute="title")
    assert p.process(bb, ["a", "b"]) == ["a", "b"]
    assert not bb.has_attribute("a", "title")
    assert values(bb, "b", "title") == ["y"]


def test_normalize_whitespace_keeps_non_strings_and_literal_types(bb):
    bb.create("a")
    bb.set_literals("a", "v", [Literal(" a  b ", "name"), 7])
    configured(NormalizeWhitespace, attribute="v").process(bb, ["a"])
    lits = bb.get_literals("a", "v")
    assert [lit.value for lit in lits] == ["a b", 7]
    assert lits[0].semantic_type == "name"


def test_normalize_whitespace_does_not_touch_clean_records(sqlite_url):
    with Blackboard.connect(sqlite_url) as board:
        make(board, "a", title="clean")
        board.commit("a")
    with Blackboard.connect(sqlite_url) as board:
        board.load("a")
        configured(NormalizeWhitespace, attribute="title").process(board, ["a"])
        assert board.changed_ids() == []


@pytest.mark.parametrize("config, name", [
    ({}, "attribute"),
    ({"attribute": "t", "lowercase": "maybe"}, "lowercase"),
    ({"attribute": "t", "colour": "red"}, "colour"),
    ({"attribute": ""}, "attribute"),
])
def test_normalize_whitespace_rejects_bad_configuration_naming_the_parameter(config, name):
    with pytest.raises(PipeletConfigurationError) as err:
        NormalizeWhitespace().configure(config)
    assert name in str(err.value)


def test_a_missing_record_fails_naming_it(bb):
    with pytest.raises(PipeletError) as err:
        configured(Lowercase, attribute="t").process(bb, ["ghost"])
    assert err.value.record_id == "ghost"
    assert "'ghost'" in str(err.value)


def test_lowercase_lowercases_in_place(bb):
    make(bb, "a", title=["ÄBC Def", "x"])
    configured(Lowercase, attribute="title").process(bb, ["a"])
    assert values(bb, "a", "title") == ["äbc def", "x"]


def test_count_words_treats_apostrophes_and_hyphens_as_inside_words():
    assert count_words("Don't e-mail me, ok?  — 42 times") == 6
    assert count_words("") == 0


def test_word_count_sums_all_string_values(bb):
    make(bb, "a", body=["one two three", "four"])
    make(bb, "b", other="x")
    configured(WordCount, attribute="body", output="words").process(bb, ["a", "b"])
    assert values(bb, "a", "words") == [4]
    assert values(bb, "b", "words") == [0]


def test_word_count_needs_an_output():
    with pytest.raises(PipeletConfigurationError) as err:
        WordCount().configure({"attribute": "body"})
    assert "output" in str(err.value)


def test_text_pipelets_on_a_stored_blackboard(sqlite_url):
    with Blackboard.connect(sqlite_url) as board:
        make(board, "doc-1", title="  Mixed   Case  ")
        board.commit("doc-1")
    with Blackboard.connect(sqlite_url) as board:
        board.load("doc-1")
        configured(NormalizeWhitespace, attribute="title", lowercase=True).process(board, ["doc-1"])
        configured(WordCount, attribute="title", output="n").process(board, ["doc-1"])
        board.commit("doc-1")
    with Blackboard.connect(sqlite_url) as board:
        board.load("doc-1")
        assert board.get_attributes("doc-1") == {"title": "mixed case", "n": 2}


def test_regex_extract_takes_group_one_of_every_match(bb):
    make(bb, "a", body=["call 555-1234 or 555-9876", "fax 555-0000"])
    configured(RegexExtract, attribute="body", pattern=r"555-(\d+)", output="nums").process(bb, ["a"])
    assert values(bb, "a", "nums") == ["1234", "9876", "0000"]


def test_regex_extract_first_only_and_named_group(bb):
    make(bb, "a", body="x=1 x=2")
    p = configured(RegexExtract, attribute="body", pattern=r"x=(?P<n>\d)", group="n",
                   all="false", output="n")
    p.process(bb, ["a"])
    assert values(bb, "a", "n") == ["1"]


def test_regex_extract_without_a_match_removes_the_output(bb):
    make(bb, "a", body="nothing", nums="old")
    configured(RegexExtract, attribute="body", pattern=r"\d+", output="nums").process(bb, ["a"])
    assert not bb.has_attribute("a", "nums")


@pytest.mark.parametrize("config, name", [
    ({"attribute": "b", "output": "o", "pattern": "("}, "pattern"),
    ({"attribute": "b", "output": "o", "pattern": "(a)", "group": "2"}, "group"),
    ({"attribute": "b", "output": "o", "pattern": "a", "ignoreCase": "sometimes"}, "ignoreCase"),
])
def test_regex_extract_rejects_bad_configuration(config, name):
    with pytest.raises(PipeletConfigurationError) as err:
        RegexExtract().configure(config)
    assert repr(name) in str(err.value)


def test_replace_with_groups_and_ignore_case(bb):
    make(bb, "a", title="Hello World, hello")
    configured(Replace, attribute="title", pattern=r"hel(lo)", replacement=r"J\1",
               ignoreCase="true").process(bb, ["a"])
    assert values(bb, "a", "title") == ["Jlo World, Jlo"]


def test_replace_plain_text_with_count_and_empty_replacement(bb):
    make(bb, "a", t="a.b.c.d")
    configured(Replace, attribute="t", pattern=".", regex=False, count="2",
               output="u").process(bb, ["a"])
    assert values(bb, "a", "u") == ["abc.d"]
    assert values(bb, "a", "t") == ["a.b.c.d"]


def test_replace_rejects_a_replacement_naming_a_missing_group():
    with pytest.raises(PipeletConfigurationError) as err:
        Replace().configure({"attribute": "t", "pattern": "(a)", "replacement": r"\2"})
    assert "'replacement'" in str(err.value)
