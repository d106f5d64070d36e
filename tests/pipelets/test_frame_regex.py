"""Python regular expressions translated for the JVM match exactly the same on portable text."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from pipelets._frames import java_regex, java_replacement, portable, top_group

PATTERNS = [
    r"\s+", r"\S+", r"\b(\w{3,})\b", r"[^\W_]+(?:['\u2019\-][^\W_]+)*", r"\d+(?:\.\d+)?", r"[aeiou]",
    r"[^a-z ]", r"^\w+", r"\w+$", r"\bund\b", r"x*", r"(?i)[a-c]+", r"(?i)Und", r"(?s)a.b", r"a.b",
    r"(\w)\1", r"(?=a)\w", r"(?<!\s)b", r"\Ba", r"a{2,3}?", r"(a|bc)+", r"[\s\d]", r"\W\D", r"$",
    r"(?m)\w$", r"\A\w", r"\w\Z", r"-\b", r"\b-", r"a\B", r"\B-", r"(?i)\bund\b", r"\b\d+\b",
    r"\b(?:ab|c)\b", r"\b(\w)+\b", r"\b\w*\b",
]
ALPHABET = "abcxAB und UND 1234567890_-'.\t\n\r\x0b\x0c\x1c\x1d\x1f\"\\$"


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = ["", " ", "\n", "und", "a\n", "aab", "a\nb"]
    while len(out) < n:
        out.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30))))
    return out


def test_every_test_pattern_translates() -> None:
    for pattern in PATTERNS:
        assert java_regex(re.compile(pattern)) is not None, pattern


@pytest.mark.parametrize("pattern", [
    r"(?P<name>a)", r"(?m)^a", r"(?>ab)", r"(a)?(?(1)b|c)", r"(?i:a)b", r"(?i)\u017f",
])
def test_constructs_that_differ_in_java_are_refused(pattern: str) -> None:
    assert java_regex(re.compile(pattern)) is None


def test_replacement_templates() -> None:
    assert java_replacement("and") == "and"
    assert java_replacement("$5 off") == "\\$5 off"
    assert java_replacement(r"<\1>") == "<$1>"
    assert java_replacement(r"\g<1>") is None
    assert java_replacement(r"\12") is None
    assert java_replacement("a\\\\b") is None


def test_word_boundaries_next_to_a_known_character_become_lookarounds() -> None:
    word = java_regex(re.compile(r"\w"))[len("(?d)"):]
    assert java_regex(re.compile(r"\bund\b")) == f"(?d)(?<!{word})und(?!{word})"
    assert java_regex(re.compile(r"-\b")) == f"(?d)\\x{{2d}}(?={word})"
    assert java_regex(re.compile(r"\b\w*\b")) == f"(?d)\\b{word}*\\b"  # may match nothing: stays


def test_top_group_and_portable_text() -> None:
    assert top_group(re.compile(r"\b(\w+)\b"), 1)
    assert not top_group(re.compile(r"a|(b)"), 1)
    assert top_group(re.compile(r"a|(b)"), 0)
    assert portable("plain ascii\t\x1c") and not portable("Straße")


@pytest.mark.spark
def test_java_matches_python_on_random_text(spark: Any) -> None:
    from pyspark.sql import functions as F

    from engine import SparkRunner

    SparkRunner(spark)  # the session as the runner sets it up
    texts = _texts(600, seed=4)
    frame = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    columns = []
    for n, pattern in enumerate(PATTERNS):
        java = java_regex(re.compile(pattern))
        columns.append(F.regexp_extract_all("t", F.lit(java), F.lit(0)).alias(f"all{n}"))
        columns.append(F.regexp_replace("t", F.lit(java), F.lit("<$0>")).alias(f"sub{n}"))
        columns.append(F.regexp_count("t", F.lit(java)).alias(f"count{n}"))
    rows = {r["i"]: r for r in frame.select("i", *columns).collect()}
    for n, pattern in enumerate(PATTERNS):
        compiled = re.compile(pattern)
        for i, text in enumerate(texts):
            row = rows[i]
            where = f"pattern {pattern!r} on {text!r}"
            assert row[f"all{n}"] == [m.group(0) for m in compiled.finditer(text)], where
            assert row[f"sub{n}"] == compiled.sub(lambda m: f"<{m.group(0)}>", text), where
            assert row[f"count{n}"] == sum(1 for _ in compiled.finditer(text)), where
