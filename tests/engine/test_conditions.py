"""Conditions: the direct answer for simple comparisons equals lxml's XPath answer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine._conditions import RECORD_NS, _compile, _fast_test

NS = (("rec", RECORD_NS),)

FAST_SHAPES = [
    "$record/Val[@key='lang'] = 'de'",
    "$record/Val[@key='lang'] != 'de'",
    "$record/Val[@key='lang']",
    "$records/Val[@key='lang'] = 'de'",
    '$request.records/rec:Record[1]/rec:Val[@key="lang"] = "de"',
    "$request.records/rec:Record[1]/rec:Val[@key='lang'] != 'text/html'",
    "$request.records/Record[1]/Val[@key='lang']",
    "$record/rec:Val[@key='lang'] = '1'",
    "  $record/Val[ @key = 'lang' ]='true'  ",
    # SMILA's older record form: every literal value is a V
    '$request.records/rec:Record[1]/rec:A[@n="lang"]/rec:L/rec:V = "de"',
    "$request.records/rec:Record[1]/rec:A[@n='lang']/rec:L/rec:V != 'de'",
    "$records/A[@n='lang']/L/V",
    "$record/rec:A[@n='lang']/rec:L/rec:V = 'true'",
]

SLOW_SHAPES = [
    "$record/Val[@key='lang'] = 1",
    "not($record/Val[@key='lang'] = 'de')",
    "$record/Val[@key='lang'] = 'de' and $record/Val[@key='x'] = 'y'",
    "$request.records/rec:Record[1]/Val[@key='lang'] = 'de'",
    "$record/other:Val[@key='lang'] = 'de'",
    "$request.records/rec:Record[1]/rec:A[@n='lang']/L/rec:V = 'de'",
    "$record/rec:A[@n='lang']/rec:L = 'de'",
]

values = st.one_of(
    st.sampled_from(["de", "en", "text/html", "1", "true", ""]),
    st.integers(-3, 3),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.builds(lambda v: {"lit": v, "type": "string"}, st.sampled_from(["de", "en"])),
    st.just({"obj": {"attrs": {"lang": ["de"]}}}),
)
attrs = st.dictionaries(st.sampled_from(["lang", "x", "title"]), st.lists(values, min_size=0, max_size=3), max_size=3)
documents = st.lists(attrs.map(lambda a: {"id": "r", "meta": {"attrs": a}}), min_size=0, max_size=3)


@pytest.mark.parametrize("expression", FAST_SHAPES)
def test_simple_comparisons_take_the_direct_path(expression: str) -> None:
    assert _fast_test(expression, dict(NS)) is not None


@pytest.mark.parametrize("expression", SLOW_SHAPES)
def test_other_shapes_stay_with_xpath(expression: str) -> None:
    ns = dict(NS) | {"other": "urn:other"}
    assert _fast_test(expression, ns) is None


@settings(max_examples=300, deadline=None)
@given(docs=documents, expression=st.sampled_from(FAST_SHAPES))
def test_direct_answer_equals_xpath(docs: list[dict[str, Any]], expression: str) -> None:
    condition = _compile(expression, NS)
    assert condition.fast is not None
    slow = dataclasses.replace(condition, fast=None)
    assert condition.test(docs) == slow.test(docs), (expression, docs)
