"""The work-bound bench's corpus and steps: varied pages, the same on every machine, and
steps that do the work they are named for.

A corpus that came out differently elsewhere, or steps that skipped part of a
page, would make one sitting's figures incomparable with another's.
"""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_docs import code_blocks

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
web_pages = importlib.import_module("web_pages")
web_steps = importlib.import_module("web_steps")

PAGE = """<!DOCTYPE html><html><head><title>Ignored</title><style>p {color: red}</style>
<script>var x = 1;</script></head><body><nav><a href="/">Home</a></nav>
<h1>Der Fluss</h1><p>Die Brücke über den Fluss ist für die Bürger der Stadt sehr wichtig, und
sie wird nach dem Winter &amp; im Frühling wieder geöffnet.<p>Zweiter Absatz<br>mit Zeile
</body></html>"""


def worked(n: int) -> dict[str, Any]:
    """Record ``n`` as the three web steps leave it."""
    doc = {"content": web_pages.page(n)}
    web_steps.web_steps(doc)
    return doc


def assert_web_work_done(records: dict[str, dict[str, Any]], numbers: range) -> None:
    """Each record (``b`` and its number) holds its page's text, language and fingerprint,
    as the steps make them (and what else it had: ``sent``)."""
    for n in numbers:
        record = records[f"b{n:07d}"]
        assert {k: v for k, v in record.items() if k != "sent"} == worked(n), n
        assert "<" not in record["content"] and "dataLayer" not in record["content"]
        assert len(record["fingerprint"]) in range(8, 129, 8)
    languages = {records[f"b{n:07d}"]["language"] for n in numbers}
    assert len(languages) >= 3, languages  # the corpus has several


def test_the_steps_turn_a_page_into_its_text_language_and_fingerprint() -> None:
    doc = {"content": PAGE, "kept": 1}
    web_steps.web_steps(doc)
    assert doc["content"] == (
        "Home\n\nDer Fluss\n\nDie Brücke über den Fluss ist für die Bürger der Stadt sehr "
        "wichtig, und sie wird nach dem Winter & im Frühling wieder geöffnet.\n\n"
        "Zweiter Absatz\nmit Zeile")
    assert doc["language"] == "de"
    assert re.fullmatch(r"[0-9a-f]{128}", doc["fingerprint"])
    assert doc["kept"] == 1


def test_a_page_without_text_gets_no_language_and_an_empty_fingerprint() -> None:
    for page in ("", "   ", "<!-- only a comment -->", "<html><body></body></html>"):
        doc = {"content": page}
        web_steps.web_steps(doc)
        assert doc == {"content": "", "language": "und", "fingerprint": ""}, page


def test_near_duplicate_pages_share_most_of_their_fingerprint() -> None:
    def hashes(n: int) -> set[str]:
        found = web_steps.fingerprint(web_steps.strip_html(web_pages.page(n)))
        return {found[i:i + 8] for i in range(0, len(found), 8)}

    same = hashes(7) & hashes(7 + web_pages.POOL)   # one pool page, another record's number
    other = hashes(7) & hashes(8)
    assert len(same) >= 12 and len(other) <= 2, (len(same), len(other))


def test_the_corpus_is_varied_and_its_languages_are_told() -> None:
    pages = [web_pages.page(n) for n in range(0, web_pages.POOL, 5)]
    sizes = sorted(len(p.encode()) for p in pages)
    assert sizes[0] < 2_000 and sizes[-1] > 30_000 and 5_000 < sizes[len(sizes) // 2] < 12_000
    declared = [re.search(r'<html lang="(\w+)">', p).group(1) for p in pages]  # type: ignore[union-attr]
    assert set(declared) == set(web_pages.LANGUAGES)
    told = [web_steps.detect_language(web_steps.strip_html(p)) for p in pages]
    right = sum(d == t for d, t in zip(declared, told, strict=True))
    assert right >= 0.97 * len(pages), Counter(zip(declared, told, strict=True))
    for tag in ("<script", "<style", "<table", "<ul", "<!--", "&amp;"):
        assert any(tag in p for p in pages), tag
    assert len({web_pages.page(n) for n in range(50)}) == 50  # each record its own page


def test_the_corpus_figures_on_the_performance_page_are_what_the_script_prints(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The page shows the command and its output: the corpus is the same on every machine."""
    (block,) = [b for b in code_blocks(REPO / "docs" / "performance.md", "")
                if "bench/web_pages.py" in b]
    command, shown = block.strip().split("\n", 1)
    argv = shlex.split(command)
    assert argv[:2] == [".venv/bin/python", "bench/web_pages.py"]
    assert web_pages.main(argv[2:]) == 0
    assert capsys.readouterr().out.strip() == shown.strip()


def test_the_step_costs_command_on_the_performance_page_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The page's command, over fewer records (the figures are the page's, not a test's)."""
    (block,) = [b for b in code_blocks(REPO / "docs" / "performance.md", "")
                if "bench/web_steps.py" in b]
    argv = shlex.split(block)
    assert argv[:2] == [".venv/bin/python", "bench/web_steps.py"]
    assert web_steps.main([*argv[2:], "--records", "30"]) == 0
    assert re.fullmatch(r"30 records: strip \d+ µs a record, language \d+, fingerprint \d+; "
                        r"all three \d+", capsys.readouterr().out.strip())
