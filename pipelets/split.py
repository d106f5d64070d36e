"""Splitting one record into fragments: by paragraphs or by size."""

from __future__ import annotations

import re
from typing import Any

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import Settings
from pipelets._literals import string_values

__all__ = ["DocumentSplitter", "split_text"]

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

    parameters = frozenset({"attribute", "mode", "maxSize", "output", "indexAttribute",
                            "keepParent", "keepAttachments"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = Settings(type(self).__name__, config)
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
