"""The work-bound bench's three steps on a web page: strip its HTML, detect its language,
fingerprint its text.  About a millisecond of CPU a page of ``web_pages``'s corpus.

Both sides of ``--pipelets real`` run these very functions: the hand-written
consumer on each record's JSON (:func:`web_steps`), Chalk in three Python
pipelets written against the Blackboard API, in a package the bench puts next
to its workflow with a copy of this file (``bench_listener.REAL_PIPELETS``).

* **strip**: the page parsed with lxml and turned into text by the built-in
  ``HtmlToText`` pipelet's function (``pipelets.html.html_to_text``: the head,
  scripts and styles left out, block elements as paragraphs);
* **language**: the built-in ``LanguageIdentify`` pipelet's function
  (``pipelets.language.identify_language``: function words and telltale
  letters of seven languages), ``und`` when the evidence is too thin;
* **fingerprint**: a MinHash sketch for finding near-duplicate pages, which
  the built-in ``Fingerprint`` (an exact hash) is not: the text's words
  lowercased, every run of four (shingle) hashed with CRC-32, the 16 smallest
  hashes kept in order, as hex.  Two pages share about as many of them as
  their shingle sets overlap.

Only what a page needs: the hand-written consumer imports these two functions
from Chalk's pipelets as it would import them from any library, nothing else
of Chalk runs in its process.

Run ``python bench/web_steps.py --records 2000`` for the CPU each step takes a
record of the corpus, in this process (best of three rounds).
"""

from __future__ import annotations

import argparse
import heapq
import re
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import lxml.html
from lxml import etree

from pipelets.html import html_to_text
from pipelets.language import identify_language

__all__ = ["ATTRIBUTES", "SHINGLE", "SKETCH", "UNDETERMINED", "detect_language", "fingerprint",
           "strip_html", "web_steps"]

SHINGLE = 4          # words a shingle
SKETCH = 16          # hashes a fingerprint keeps
UNDETERMINED = "und"  # ISO 639-2: the language could not be told
#: The record's attributes: the page (HTML in, its text out), what the steps write.
ATTRIBUTES = ("content", "language", "fingerprint")

_WORD = re.compile(r"\w+")


def strip_html(html: str) -> str:
    """The text of an HTML page (paragraphs apart by a blank line); ``""`` for a page
    with nothing to parse."""
    if not html.strip():
        return ""
    try:
        root = lxml.html.document_fromstring(html)
    except etree.ParserError:  # only comments or whitespace
        return ""
    return html_to_text(root)


def detect_language(text: str) -> str:
    """The ISO 639-1 code of the text's language, or ``und``."""
    return identify_language(text) or UNDETERMINED


def fingerprint(text: str) -> str:
    """The text's MinHash sketch: the :data:`SKETCH` smallest CRC-32 hashes of its
    :data:`SHINGLE`-word shingles, 8 hex digits each (fewer for a text of fewer
    shingles; ``""`` for one without words)."""
    words = _WORD.findall(text.lower())
    shingles = {" ".join(words[i:i + SHINGLE]) for i in range(max(1, len(words) - SHINGLE + 1))}
    hashes = {zlib.crc32(s.encode()) for s in shingles if s}
    return "".join(f"{h:08x}" for h in heapq.nsmallest(SKETCH, hashes))


def web_steps(doc: dict[str, Any]) -> None:
    """The three steps on a record's dict: ``content`` (HTML) becomes its text, and
    ``language`` and ``fingerprint`` are written, as the bench's pipelets do."""
    text = strip_html(doc.get("content", ""))
    doc["content"] = text
    doc["language"] = detect_language(text)
    doc["fingerprint"] = fingerprint(text)


def main(argv: list[str] | None = None) -> int:
    from web_pages import page

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000, help="records of the corpus")
    args = parser.parse_args(argv)
    pages = [page(n) for n in range(args.records)]

    def cpu(step: Callable[[str], str], inputs: list[str]) -> tuple[float, list[str]]:
        """µs of CPU a record, best of three rounds; the step's outputs."""
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            outputs = [step(x) for x in inputs]
            best = min(best, time.process_time() - started)
        return best / len(inputs) * 1e6, outputs

    strip, texts = cpu(strip_html, pages)
    language, _ = cpu(detect_language, texts)
    sketch, _ = cpu(fingerprint, texts)
    print(f"{args.records:,} records: strip {strip:.0f} µs a record, language {language:.0f}, "
          f"fingerprint {sketch:.0f}; all three {strip + language + sketch:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
