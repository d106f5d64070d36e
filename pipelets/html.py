"""HTML to plain text, with the title and meta tags as attributes."""

from __future__ import annotations

import re
from typing import Any

import lxml.html
from lxml import etree

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig
from pipelets._io import check_encoding, decode_text, read_endpoints

__all__ = ["HtmlToText", "html_to_text"]

#: Elements that start a new paragraph in the text.
BLOCK_TAGS = frozenset("""
    address article aside blockquote body caption center dd details dialog dir div dl dt
    fieldset figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 header hgroup hr
    html legend li main menu nav ol p pre section summary table tbody tfoot thead tr ul
""".split())
#: Elements whose end starts a new line.
LINE_TAGS = frozenset({"br", "option"})
#: Table cells: separated by a space on their line.
CELL_TAGS = frozenset({"td", "th"})
DEFAULT_REMOVED = ("head", "script", "style", "noscript", "template", "object", "applet",
                   "iframe")

_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>", re.I)
_INLINE_SPACE = re.compile(r"[^\S\n]+")
_MANY_BREAKS = re.compile(r"\n{3,}")
_SPACE = re.compile(r"\s+")
_PARA, _LINE = "\x00P", "\x00L"


def _normalize(text: str) -> str:
    return _INLINE_SPACE.sub(" ", text).strip()


def _one_line(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def html_to_text(root: Any, removed: frozenset[str] = frozenset(DEFAULT_REMOVED)) -> str:
    """The text of a parsed HTML tree: paragraphs apart by a blank line, ``<br>`` a newline.

    Content of ``removed`` elements (scripts, styles, the head) is left out.
    """
    parts: list[str] = []
    skipping: Any = None
    pre = 0
    for event, el in etree.iterwalk(root, events=("start", "end")):
        tag = el.tag.lower() if isinstance(el.tag, str) else None
        if event == "start":
            if skipping is not None or tag is None:
                continue
            if tag in removed:
                skipping = el
                continue
            if tag in BLOCK_TAGS:
                parts.append(_PARA)
            if tag == "pre":
                pre += 1
            if el.text:
                parts.append(el.text if pre else el.text.replace("\n", " "))
            continue
        if skipping is not None and el is not skipping:
            continue
        skipping = None
        if tag in BLOCK_TAGS:
            parts.append(_PARA)
        elif tag in LINE_TAGS:
            parts.append(_LINE)
        elif tag in CELL_TAGS:
            parts.append(" ")
        if tag == "pre":
            pre -= 1
        if el.tail and el is not root:
            parts.append(el.tail if pre else el.tail.replace("\n", " "))
    text = "".join(parts).replace("\r", "").replace(_PARA, "\n\n").replace(_LINE, "\n")
    text = "\n".join(_normalize(line) for line in text.split("\n"))
    return _MANY_BREAKS.sub("\n\n", text).strip()


class HtmlToText(Pipelet):
    """Turn HTML into plain text; put the title and meta tags into attributes.

    SMILA's ``HtmlToTextPipelet`` configurations load unchanged.

    Parameters:
        input / inputName: the attribute or attachment with the HTML (default ``Content``).
        inputType: ``attribute`` (default) or ``attachment``.
        output / outputName: where the text goes (default: the input name).
        outputType: ``attribute`` (default) or ``attachment`` (UTF-8 bytes).
        title: attribute that receives the ``<title>`` (default: none).
        meta: map of meta tag name (``name``, ``property`` or ``http-equiv``)
            → attribute; SMILA's ``meta:<name>`` keys do the same, and
            ``meta:title`` means the ``<title>`` element (or a title meta tag).
        removeContentTags: elements left out with their content (a list or
            comma-separated; default head, script, style, noscript, template,
            object, applet, iframe).
        encoding: of attachment bytes (default: byte-order mark, the
            document's charset declaration, UTF-8, windows-1252).

    Text: block elements become paragraphs apart by a blank line, ``<br>``
    a line break, runs of whitespace one space.  A record without the input
    passes unchanged; binary or undecodable input fails the record.
    """

    runs_in_service = True
    parameters = frozenset({"input", "inputName", "inputType", "output", "outputName",
                            "outputType", "title", "meta", "removeContentTags", "encoding"})

    def configure(self, config: dict[str, Any]) -> None:
        smila_meta = {k: v for k, v in config.items() if isinstance(k, str) and k.startswith("meta:")}
        super().configure({k: v for k, v in config.items() if k not in smila_meta})
        self.config = dict(config)
        s = PipeletConfig(type(self).__name__, config)
        self.input, self.output = read_endpoints(s, default_input="Content")
        self.title: str | None = s.name("title", default=None)
        meta = {str(k).strip().lower(): v for k, v in s.mapping("meta", default={}).items()}
        for key, value in smila_meta.items():
            meta[key[len("meta:"):].strip().lower()] = value
        self.meta: dict[str, str] = {}
        for key, attribute in meta.items():
            name = f"meta:{key}" if f"meta:{key}" in config else "meta"
            if not key:
                raise s.error(name, "names no meta tag")
            if not isinstance(attribute, str) or not attribute.strip():
                raise s.error(name, f"expected an attribute name, got {attribute!r}")
            self.meta[key] = attribute.strip()
        if "title" in self.meta and self.title is None:
            self.title = self.meta.pop("title")
            self._title_meta = True
        else:
            self._title_meta = False
        removed = s.names("removeContentTags", default=list(DEFAULT_REMOVED))
        self.removed = frozenset(t.lower() for t in removed)
        self.encoding = check_encoding(s, "encoding", s.name("encoding", default=None))

    def _parse(self, source: bytes | str) -> Any:
        if isinstance(source, bytes):
            source = decode_text(source, self.encoding, what=f"HTML in {self.input}")
        source = _XML_DECL.sub("", source, count=1)
        if not source.strip():
            return None
        try:
            return lxml.html.document_fromstring(source)
        except (etree.ParserError, ValueError) as e:
            if "Document is empty" in str(e):
                return None   # only comments or whitespace
            raise ValueError(f"HTML in {self.input} does not parse: {e}") from e

    def _heads(self, root: Any) -> tuple[list[str], dict[str, list[str]]]:
        titles = [t for t in (_one_line(el.text_content()) for el in root.iter("title")) if t]
        metas: dict[str, list[str]] = {}
        for el in root.iter("meta"):
            key = (el.get("name") or el.get("property") or el.get("http-equiv") or "").lower()
            content = el.get("content")
            if key and content is not None and _one_line(content):
                metas.setdefault(key.strip(), []).append(_one_line(content))
        if self._title_meta and not titles:
            titles = metas.get("title", [])
        return titles[:1], metas

    def process_record(self, bb: Blackboard, rid: str) -> None:
        sources = self.input.read_bytes(bb, rid)
        if not sources:
            return
        texts: list[str] = []
        titles: list[str] = []
        metas: dict[str, list[str]] = {}
        for source in sources:
            root = self._parse(source)
            if root is None:
                texts.append("")
                continue
            texts.append(html_to_text(root, self.removed))
            found_titles, found_metas = self._heads(root)
            titles += found_titles
            for key, values in found_metas.items():
                metas.setdefault(key, []).extend(values)
        self.output.write_text(bb, rid, texts, separator="\n\n")
        if self.title and titles:
            bb.set_literals(rid, self.title, titles)
        for key, attribute in self.meta.items():
            if metas.get(key):
                bb.set_literals(rid, attribute, metas[key])
