"""Reading and writing a pipelet's input/output: an attribute or an attachment.

Several SMILA pipelets (HtmlToText, Copy, XPathExtractor, XslTransformation)
take ``inputType``/``outputType`` (``ATTRIBUTE`` or ``ATTACHMENT``) and
``inputName``/``outputName``; :class:`Endpoint` is that pair.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from blackboard import Blackboard
from pipelets._config import REQUIRED, PipeletConfig

__all__ = ["Endpoint", "decode_text", "read_endpoints"]

KINDS = ("attribute", "attachment")
_CHARSET = re.compile(rb"""(?:charset|encoding)\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


@dataclass(frozen=True)
class Endpoint:
    """An attribute or attachment of a record."""

    kind: str   # "attribute" or "attachment"
    name: str

    def exists(self, bb: Blackboard, rid: str) -> bool:
        if self.kind == "attachment":
            return bool(bb.has_attachment(rid, self.name))
        return bool(bb.has_attribute(rid, self.name))

    def read_bytes(self, bb: Blackboard, rid: str) -> list[bytes | str]:
        """Attachment bytes (one item) or the attribute's string values."""
        if self.kind == "attachment":
            return [bb.get_attachment(rid, self.name)] if bb.has_attachment(rid, self.name) else []
        if not bb.has_attribute(rid, self.name):
            return []
        out: list[bytes | str] = []
        for lit in bb.get_literals(rid, self.name):
            if not isinstance(lit.value, str):
                raise ValueError(f"attribute {self.name!r} holds a {lit.data_type} value "
                                 f"({lit.value!r}), not text")
            out.append(lit.value)
        return out

    def write_text(self, bb: Blackboard, rid: str, texts: list[str], *, encoding: str = "utf-8",
                   separator: str = "\n") -> None:
        if self.kind == "attachment":
            bb.set_attachment(rid, self.name, separator.join(texts).encode(encoding))
        else:
            bb.set_literals(rid, self.name, texts)

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}"


def read_endpoints(s: PipeletConfig, *, default_input: str | None = None,
                   default_input_type: str = "attribute",
                   default_output_type: str = "attribute") -> tuple[Endpoint, Endpoint]:
    """``input``/``inputName``, ``inputType``, ``output``/``outputName``, ``outputType``.

    The output name defaults to the input name.
    """
    in_name = s.name("input", "inputName",
                     default=REQUIRED if default_input is None else default_input)
    in_kind = s.choice("inputType", KINDS, default=default_input_type)
    out_name = s.name("output", "outputName", default=in_name)
    out_kind = s.choice("outputType", KINDS, default=default_output_type)
    return Endpoint(in_kind, in_name), Endpoint(out_kind, out_name)


def check_encoding(s: PipeletConfig, name: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        codecs.lookup(value)
    except LookupError:
        raise s.error(name, f"unknown encoding {value!r}") from None
    return value


def decode_text(data: bytes, encoding: str | None = None, *, what: str = "content") -> str:
    """Bytes of a text document → str.

    Order: byte-order mark, the given ``encoding``, a ``charset=``/
    ``encoding=`` declaration in the first 2 KB, UTF-8, then windows-1252.
    Raises ``ValueError`` for binary data (NUL bytes without a UTF-16/32 BOM)
    and for bytes that do not decode in a declared encoding.
    """
    for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF32_LE, "utf-32"),
                       (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
                       (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return data.decode(codec)
    if b"\x00" in data[:8192]:
        raise ValueError(f"{what} is binary (it holds NUL bytes), not text")
    declared = encoding
    if declared is None:
        match = _CHARSET.search(data[:2048])
        if match:
            try:
                declared = codecs.lookup(match.group(1).decode("ascii")).name
            except LookupError:
                declared = None
    if declared is not None:
        try:
            return data.decode(declared)
        except UnicodeDecodeError as e:
            if encoding is not None:
                raise ValueError(f"{what} does not decode as {encoding}: {e}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")
