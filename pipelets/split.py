"""Splitting one record into fragments: by paragraphs or by size, or an XML document by marker tags."""

from __future__ import annotations

import html
import os
import re
import stat
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlparse

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig
from pipelets._io import read_endpoints
from pipelets._literals import string_values

__all__ = ["DocumentSplitter", "XmlSplit", "iter_snippets", "split_text"]

_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")
_SENTENCE_END = re.compile(r"[.!?;:]\s")


def _chop(text: str, max_size: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_size`` characters.

    Cuts go after a sentence end in the second half of the window, else at
    the last whitespace there, else hard at ``max_size``.
    """
    pieces = []
    while len(text) > max_size:
        window = text[: max_size + 1]
        half = max_size // 2
        cut = -1
        for match in _SENTENCE_END.finditer(window):
            if match.start() + 1 >= half:
                cut = match.start() + 1
        if cut < 0:
            space = max(window.rfind(" "), window.rfind("\n"), window.rfind("\t"))
            cut = space if space >= half else max_size
        piece, text = text[:cut].strip(), text[cut:].strip()
        if piece:
            pieces.append(piece)
    if text.strip():
        pieces.append(text.strip())
    return pieces


def split_text(text: str, mode: str = "paragraphs", max_size: int | None = None) -> list[str]:
    """The pieces of ``text``.

    ``paragraphs``: one piece per paragraph (text between blank lines), long
    paragraphs cut at ``max_size``.  ``size``: paragraphs packed together up
    to ``max_size`` characters (joined by a blank line), long ones cut.
    """
    paragraphs = [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
    if max_size is None:
        return paragraphs
    pieces = [piece for p in paragraphs for piece in _chop(p, max_size)]
    if mode == "paragraphs":
        return pieces
    packed: list[str] = []
    for piece in pieces:
        if packed and len(packed[-1]) + 2 + len(piece) <= max_size:
            packed[-1] = f"{packed[-1]}\n\n{piece}"
        else:
            packed.append(piece)
    return packed


class DocumentSplitter(Pipelet):
    """Split each record into fragment records, one per piece of its text.

    Fragments are made with ``blackboard.split`` (IDs ``<id>#0``, ``<id>#1``,
    …): each is a copy of the record whose text attribute holds only its piece.

    Parameters:
        attribute: the text attribute to split (default ``Content``); several
            string values are read as paragraphs of one text.
        mode: ``paragraphs`` (default) or ``size``.
        maxSize: the largest piece in characters (required for ``size``;
            with ``paragraphs`` it cuts long paragraphs).
        output: the attribute of a fragment receiving its piece (default: the
            text attribute).
        indexAttribute: attribute receiving the fragment's position (0, 1, …)
            (default: none).
        keepParent: return the original record too, before its fragments
            (default false: only the fragments go on).
        keepAttachments: fragments keep the record's attachments (default
            false: they are removed from the fragments).

    A record without text (or with only whitespace) makes no fragments and
    goes on as itself.
    """

    runs_in_service = True
    parameters = frozenset({"attribute", "mode", "maxSize", "output", "indexAttribute",
                            "keepParent", "keepAttachments"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute", default="Content")
        self.mode: str = s.choice("mode", ("paragraphs", "size"), default="paragraphs")
        self.max_size: int | None = s.integer("maxSize", default=None, minimum=1)
        if self.mode == "size" and self.max_size is None:
            raise s.error("maxSize", "is required with mode 'size'")
        self.output: str = s.name("output", default=self.attribute)
        self.index_attribute: str | None = s.name("indexAttribute", default=None)
        self.keep_parent: bool = s.boolean("keepParent", default=False)
        self.keep_attachments: bool = s.boolean("keepAttachments", default=False)

    def process_record(self, blackboard: Blackboard, rid: str) -> list[str] | None:
        text = "\n\n".join(string_values(blackboard, rid, self.attribute))
        pieces = split_text(text, self.mode, self.max_size)
        if not pieces:
            return None
        out = [rid] if self.keep_parent else []
        for index, piece in enumerate(pieces):
            fid = blackboard.split(rid, str(index))
            if self.output != self.attribute:
                blackboard.remove_attribute(fid, self.attribute)
            blackboard.set_literal(fid, self.output, piece)
            if self.index_attribute:
                blackboard.set_literal(fid, self.index_attribute, index)
            if not self.keep_attachments:
                for name in blackboard.attachment_names(fid):
                    blackboard.remove_attachment(fid, name)
            out.append(fid)
        return out


_CHUNK = 1 << 16


def _marker(name: str, closing: bool) -> re.Pattern[bytes]:
    tag = re.escape(name.encode())
    if closing:
        return re.compile(rb"</" + tag + rb"\s*>")
    return re.compile(rb"<" + tag + rb"(?:\s[^<>]*)?/?>")  # an empty-element tag opens (and closes) too


def iter_snippets(stream: Any, begin: str, begin_closing: bool, end: str, end_closing: bool,
                  chunk: int = _CHUNK) -> Iterator[bytes]:
    """The byte snippets of an XML stream between a begin and an end marker tag, read in chunks.

    A snippet starts at an opening begin tag (or just after a closing one) and
    ends after a closing end tag (or just before an opening one); markers are
    found by name, without parsing, so the document need not be well-formed
    outside the snippets and may be larger than memory.
    """
    start_re, end_re = _marker(begin, begin_closing), _marker(end, end_closing)
    buf = b""
    eof = False
    while True:
        m = start_re.search(buf)
        if m is None:
            if eof:
                return
            keep = buf.rfind(b"<")
            buf = buf[keep:] if keep >= 0 else b""
        else:
            e = end_re.search(buf, m.end())
            if e is not None:
                yield buf[m.end() if begin_closing else m.start():e.end() if end_closing else e.start()]
                buf = buf[e.end() if end_closing else e.start():]
                continue
            if eof:
                return  # an unterminated snippet at the end: dropped
            buf = buf[m.start():]
        more = stream.read(chunk)
        if not more:
            eof = True
        buf += more


def _key(snippet: bytes, tag: str) -> str | None:
    name = re.escape(tag.encode())
    m = re.search(rb"<" + name + rb"(?:\s[^<>]*)?>(.*?)</" + name + rb"\s*>", snippet, re.S)
    if m is None:
        return None
    text = html.unescape(m.group(1).decode("utf-8", errors="replace")).strip()
    return text or None


def _inside(path: str, base: str) -> bool:
    return os.path.commonpath([path, base]) == base


def open_inside(value: str, base: str, what: str) -> Any:
    """The regular file ``value`` names (a path, relative to ``base`` or absolute, or a
    ``file:`` URL), opened for reading, when it lies inside the folder ``base``.

    Symbolic links are followed before the check (one that leads out is refused), the
    file is opened without blocking and checked again once open (a FIFO, a device, a
    directory, ``/proc`` is refused, and so is a path swapped for a link meanwhile).

    Raises:
        ValueError: naming ``what`` (the record and attribute), the path and why.
    """
    text = value.strip()
    if text.startswith(("http:", "https:")):
        raise ValueError(f"{what}: {text!r}: reading URLs is not supported (pipelets make no "
                         "network calls); give a file path or put the document in an attachment")
    if text.startswith("file:"):
        parsed = urlparse(text)
        text = unquote(parsed.netloc + parsed.path)
    if not text or "\x00" in text:
        raise ValueError(f"{what}: {value!r} is not a file path")
    path = os.path.realpath(os.path.join(base, text))
    if not _inside(path, base):
        raise ValueError(f"{what}: {value!r} is outside baseDirectory {base!r}; only files "
                         "inside it are read")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ValueError(f"{what}: cannot open {value!r} in baseDirectory {base!r}: "
                         f"{e.strerror}") from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{what}: {value!r} is not a regular file; only regular files "
                             "are read")
        opened = f"/proc/self/fd/{fd}"
        if os.path.exists(opened) and not _inside(os.path.realpath(opened), base):
            raise ValueError(f"{what}: {value!r} changed while it was opened; only files "
                             f"inside baseDirectory {base!r} are read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class XmlSplit(Pipelet):
    """Split an XML document into fragment records, one per snippet between two marker tags.

    SMILA's ``xmlprocessing.XmlSplitterPipelet`` (e.g. a Wikipedia dump into
    one record per ``<page>``).  The document is an attachment, or an
    attribute holding a file path (or ``file:`` URL); it is read in chunks,
    never whole.  Each snippet with a ``keyTagName`` element becomes the
    fragment ``<id>#<key>`` (``blackboard.split``): no attributes or
    attachments of the parent, the snippet in ``outputName``, and
    ``MessageProperties/isXmlSnippet = "true"`` as SMILA set.  A snippet
    without the key tag is skipped (SMILA logged it); a key seen twice in one
    document gets `` (2)``, `` (3)``…

    Differences from SMILA: the Java pipelet sent the snippet records to the
    queue itself and returned only the input; here they are returned with it
    (``keepParent``) and go wherever the router sends result records.  URLs
    are not fetched.  Fragment IDs always use ``#``.  A path comes from a
    message, so it is read only when it names a regular file inside
    ``baseDirectory`` (required with ``inputType = attribute``): no path out
    of it, by ``..`` or a symbolic link, no device, FIFO or ``/proc`` file.

    Parameters:
        beginTagName, endTagName: the marker tags (required).
        isBeginClosingTag (false), isEndClosingTag (true): whether each marker
            is the closing tag (SMILA's names and defaults of its tests).
        keyTagName: the tag whose text names a fragment (required).
        inputType / inputName: ``attachment`` (default) holding the XML, or
            ``attribute`` holding its path (default name ``Content``).
        baseDirectory: with ``inputType = attribute``, the folder the paths must be
            in (required; relative paths in the attribute start there, a relative
            folder starts at the working directory).
        outputType / outputName: where a fragment gets its snippet
            (``attribute`` as text, the default, or ``attachment`` as bytes;
            default name ``Content``).
        keepParent: return the input record before its fragments (default true).
        idSeparator, maxBufferSize: SMILA's; only ``#`` is accepted, the size is
            not needed.
    """

    runs_in_service = True
    parameters = frozenset({"beginTagName", "isBeginClosingTag", "endTagName", "isEndClosingTag",
                            "keyTagName", "inputType", "inputName", "input", "outputType", "outputName",
                            "output", "keepParent", "idSeparator", "maxBufferSize",
                            "baseDirectory"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.begin: str = s.name("beginTagName")
        self.begin_closing: bool = s.boolean("isBeginClosingTag", default=False)
        self.end: str = s.name("endTagName")
        self.end_closing: bool = s.boolean("isEndClosingTag", default=True)
        self.key: str = s.name("keyTagName")
        self.source, self.target = read_endpoints(s, default_input="Content", default_input_type="attachment")
        self.keep_parent: bool = s.boolean("keepParent", default=True)
        self.base: str | None = None
        if self.source.kind == "attribute":
            if not s.has("baseDirectory"):
                raise s.error("baseDirectory", "inputType attribute reads the file a message "
                                               "names: give the folder such files must be in")
            base = os.path.realpath(s.text("baseDirectory"))
            if not os.path.isdir(base):
                raise s.error("baseDirectory", f"no folder {base!r} (relative paths start at "
                                               f"{os.getcwd()!r})")
            self.base = base
        if s.text("idSeparator", default="#") != "#":
            raise s.error("idSeparator", "only '#' is possible: Chalk fragment IDs are <id>#<name>")
        s.integer("maxBufferSize", default=None, minimum=1)
        for name in ("beginTagName", "endTagName", "keyTagName"):
            if not re.fullmatch(r"[\w.\-:]+", config[name].strip()):
                raise s.error(name, f"{config[name]!r} is not an XML tag name")

    def process_record(self, blackboard: Blackboard, rid: str) -> list[str]:
        made = self._split(blackboard, rid)
        return [rid, *made] if self.keep_parent else made

    def _split(self, bb: Any, rid: str) -> list[str]:
        if not self.source.exists(bb, rid):
            return []
        if self.source.kind == "attachment":
            opened = bb.get_attachment_stream(rid, self.source.name)
        else:
            assert self.base is not None
            opened = open_inside(str(bb.get_literals(rid, self.source.name)[0].value),
                                 self.base, f"record {rid!r} {self.source}")
        made: list[str] = []
        seen: dict[str, int] = {}
        with opened as stream:
            for snippet in iter_snippets(stream, self.begin, self.begin_closing, self.end, self.end_closing):
                key = _key(snippet, self.key)
                if key is None:
                    continue
                seen[key] = seen.get(key, 0) + 1
                name = (key if seen[key] == 1 else f"{key} ({seen[key]})").replace("#", "%23")
                fid = bb.split(rid, name)
                for attr in bb.attribute_names(fid):
                    bb.remove_attribute(fid, attr)
                for att in bb.attachment_names(fid):
                    bb.remove_attachment(fid, att)
                if self.target.kind == "attachment":
                    bb.set_attachment(fid, self.target.name, snippet)
                else:
                    bb.set_literal(fid, self.target.name, snippet.decode("utf-8", errors="replace"))
                bb.set_attributes(fid, {"MessageProperties": {"isXmlSnippet": "true"}})
                made.append(fid)
        return made
