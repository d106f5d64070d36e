"""Identifying what a record holds: its MIME type, from content and from names.

``sniff`` looks at the first bytes of the content (magic numbers, markup);
``EXTENSIONS`` maps file extensions; ``MimeTypeIdentify`` combines them with
a ``Content-Type`` from the record's metadata.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig

__all__ = ["EXTENSIONS", "MimeTypeIdentify", "extension_of", "sniff"]

SNIFF_BYTES = 64 * 1024

#: File extension → MIME type.
EXTENSIONS: dict[str, str] = {
    # text and markup
    "txt": "text/plain", "text": "text/plain", "log": "text/plain", "md": "text/markdown",
    "markdown": "text/markdown", "csv": "text/csv", "tsv": "text/tab-separated-values",
    "htm": "text/html", "html": "text/html", "shtml": "text/html", "xhtml": "application/xhtml+xml",
    "xml": "application/xml", "xsd": "application/xml", "xsl": "application/xslt+xml",
    "xslt": "application/xslt+xml", "rss": "application/rss+xml", "atom": "application/atom+xml",
    "svg": "image/svg+xml", "kml": "application/vnd.google-earth.kml+xml",
    "bpel": "application/xml", "wsdl": "application/wsdl+xml",
    "json": "application/json", "jsonl": "application/jsonl", "yaml": "application/yaml",
    "yml": "application/yaml", "toml": "application/toml", "ini": "text/plain",
    "css": "text/css", "js": "text/javascript", "mjs": "text/javascript", "ts": "text/x-typescript",
    "py": "text/x-python", "java": "text/x-java-source", "c": "text/x-c", "h": "text/x-c",
    "cpp": "text/x-c++", "sh": "application/x-sh", "sql": "application/sql",
    "rtf": "application/rtf", "tex": "application/x-tex", "vcf": "text/vcard",
    "ics": "text/calendar", "eml": "message/rfc822", "properties": "text/plain",
    # documents
    "pdf": "application/pdf", "ps": "application/postscript", "eps": "application/postscript",
    "doc": "application/msword", "dot": "application/msword",
    "xls": "application/vnd.ms-excel", "ppt": "application/vnd.ms-powerpoint",
    "msg": "application/vnd.ms-outlook",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "odt": "application/vnd.oasis.opendocument.text",
    "ods": "application/vnd.oasis.opendocument.spreadsheet",
    "odp": "application/vnd.oasis.opendocument.presentation",
    "epub": "application/epub+zip",
    # images
    "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "jpe": "image/jpeg",
    "gif": "image/gif", "bmp": "image/bmp", "tif": "image/tiff", "tiff": "image/tiff",
    "webp": "image/webp", "ico": "image/x-icon", "heic": "image/heic",
    # audio and video
    "mp3": "audio/mpeg", "wav": "audio/wav", "ogg": "audio/ogg", "oga": "audio/ogg",
    "flac": "audio/flac", "m4a": "audio/mp4", "mp4": "video/mp4", "m4v": "video/mp4",
    "mov": "video/quicktime", "avi": "video/x-msvideo", "webm": "video/webm", "mkv": "video/x-matroska",
    # archives and binaries
    "zip": "application/zip", "jar": "application/java-archive", "gz": "application/gzip",
    "tgz": "application/gzip", "bz2": "application/x-bzip2", "xz": "application/x-xz",
    "7z": "application/x-7z-compressed", "rar": "application/vnd.rar", "tar": "application/x-tar",
    "exe": "application/vnd.microsoft.portable-executable", "dll": "application/vnd.microsoft.portable-executable",
    "wasm": "application/wasm", "woff": "font/woff", "woff2": "font/woff2", "ttf": "font/ttf",
    "otf": "font/otf", "sqlite": "application/vnd.sqlite3", "db": "application/vnd.sqlite3",
    "bin": "application/octet-stream",
}

_ZIP_FAMILY = {EXTENSIONS[e] for e in ("zip", "jar", "docx", "xlsx", "pptx", "odt", "ods", "odp", "epub")}
_OLE_FAMILY = {EXTENSIONS[e] for e in ("doc", "xls", "ppt", "msg")}
_XML_FAMILY_HINT = re.compile(r"(\+xml|/xml)$")

_MAGIC: list[tuple[int, bytes, str]] = [
    (0, b"%PDF-", "application/pdf"),
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),
    (0, b"\xff\xd8\xff", "image/jpeg"),
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"II*\x00", "image/tiff"),
    (0, b"MM\x00*", "image/tiff"),
    (0, b"ID3", "audio/mpeg"),
    (0, b"OggS", "audio/ogg"),
    (0, b"fLaC", "audio/flac"),
    (0, b"\x1a\x45\xdf\xa3", "video/x-matroska"),
    (0, b"\x1f\x8b", "application/gzip"),
    (0, b"BZh", "application/x-bzip2"),
    (0, b"\xfd7zXZ\x00", "application/x-xz"),
    (0, b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
    (0, b"Rar!\x1a\x07", "application/vnd.rar"),
    (257, b"ustar", "application/x-tar"),
    (0, b"{\\rtf", "application/rtf"),
    (0, b"%!PS", "application/postscript"),
    (0, b"\x7fELF", "application/x-executable"),
    (0, b"\x00asm", "application/wasm"),
    (0, b"wOFF", "font/woff"),
    (0, b"wOF2", "font/woff2"),
    (0, b"SQLite format 3\x00", "application/vnd.sqlite3"),
]
_RIFF = {b"WEBP": "image/webp", b"WAVE": "audio/wav", b"AVI ": "video/x-msvideo"}
_FTYP = {b"qt  ": "video/quicktime", b"M4A ": "audio/mp4", b"heic": "image/heic",
         b"heix": "image/heic", b"avif": "image/avif"}
_OOXML = (("word/", "docx"), ("xl/", "xlsx"), ("ppt/", "pptx"))
_OLE_STREAMS = (("WordDocument", "doc"), ("Workbook", "xls"), ("Book", "xls"),
                ("PowerPoint Document", "ppt"), ("__substg1.0_", "msg"))
_HTML_START = re.compile(r"^(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html|head|body)[\s>]",
                         re.I | re.S)
_HTML_ANYWHERE = re.compile(r"<(?:html|head|body|title|p|div|br|table|a\s+href)[\s>/]", re.I)
_XML_ROOT = re.compile(r"<([A-Za-z_][\w.:-]*)")
_XML_ROOTS = {"svg": "image/svg+xml", "html": "application/xhtml+xml",
              "rss": "application/rss+xml", "feed": "application/atom+xml",
              "xsl:stylesheet": "application/xslt+xml", "xsl:transform": "application/xslt+xml"}
_CONTENT_TYPE = re.compile(r"content-type\s*[:=]\s*\"?([\w.+-]+/[\w.+-]+)", re.I)
_BARE_TYPE = re.compile(r"^\s*([\w.+-]+/[\w.+-]+)\s*(?:;.*)?$")

#: Types from content that only say "some text"/"some container": names may refine them.
WEAK = {"text/plain", "application/xml", "application/zip", "application/x-ole-storage",
        "application/octet-stream", "text/html"}


def _decode_head(head: bytes) -> str | None:
    """The start of the content as text, or None when it looks binary."""
    for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16-le"),
                       (codecs.BOM_UTF16_BE, "utf-16-be")):
        if head.startswith(bom):
            return head[len(bom):].decode(codec.replace("-sig", ""), errors="ignore")
    if b"\x00" in head:
        return None
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(head) - 4:   # a character cut at the sniffing limit
            return head[:e.start].decode("utf-8")
    text = head.decode("cp1252", errors="replace")
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f")
    return None if controls > len(text) / 100 else text


def sniff(head: bytes, complete: bool = True) -> str | None:
    """The MIME type the content's first bytes show, or None for empty content.

    ``complete`` says ``head`` is the whole content (JSON is only recognised
    then).  Types in :data:`WEAK` are guesses names may refine.
    """
    if not head:
        return None
    for offset, magic, mime in _MAGIC:
        if head.startswith(magic, offset):
            return mime
    if head[:4] == b"RIFF" and head[8:12] in _RIFF:
        return _RIFF[head[8:12]]
    if head[4:8] == b"ftyp":
        return _FTYP.get(head[8:12], "video/mp4")
    if head[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio/mpeg"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _zip_type(head)
    if head[:8] == b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1":
        for stream, ext in _OLE_STREAMS:
            if stream.encode("utf-16-le") in head:
                return EXTENSIONS[ext]
        return "application/x-ole-storage"
    if head[:2] == b"MZ" and b"\x00" in head[:64]:
        return "application/vnd.microsoft.portable-executable"
    if head[:2] == b"BM" and head[6:10] == b"\x00\x00\x00\x00":
        return "image/bmp"
    text = _decode_head(head)
    if text is None:
        return "application/octet-stream"
    return _text_type(text, complete)


def _zip_type(head: bytes) -> str:
    if head[30:38] == b"mimetype":   # ODF and EPUB: the first entry, stored uncompressed
        mime = head[38:38 + 80].split(b"PK\x03\x04")[0].decode("ascii", errors="ignore").strip()
        if mime.startswith("application/"):
            return mime
    if b"[Content_Types].xml" in head:
        for folder, ext in _OOXML:
            if folder.encode() in head:
                return EXTENSIONS[ext]
    if b"META-INF/MANIFEST.MF" in head[:200]:
        return "application/java-archive"
    return "application/zip"


def _text_type(text: str, complete: bool) -> str:
    start = text.lstrip()[:2048]
    lower = start.lower()
    if lower.startswith("<?xml"):
        body = re.sub(r"<\?.*?\?>|<!--.*?-->|<!doctype[^>]*>", "", start, flags=re.S | re.I)
        match = _XML_ROOT.search(body)
        return _XML_ROOTS.get(match.group(1).lower(), "application/xml") if match \
            else "application/xml"
    if _HTML_START.match(start):
        return "text/html"
    if lower.startswith("<svg"):
        return "image/svg+xml"
    if lower.startswith("<") and len(_HTML_ANYWHERE.findall(start)) >= 2:
        return "text/html"   # a fragment: <p>…</p><div>…
    if complete and start[:1] in "{[":
        try:
            json.loads(text)
            return "application/json"
        except ValueError:
            pass
    return "text/plain"


def extension_of(name: str) -> str | None:
    """The lowercase extension of a file name, path or URL (``None`` when it has none)."""
    name = name.strip()
    if not name:
        return None
    bare = name[1:] if name.startswith(".") else name
    if "." not in bare and "/" not in bare and "\\" not in bare:
        return bare.lower() or None  # a bare extension: "html" or ".html"
    name = re.split(r"[?#]", name, maxsplit=1)[0]
    base = re.split(r"[/\\]", name)[-1]
    if "." not in base.strip("."):
        return None
    return base.rsplit(".", 1)[1].lower() or None


def _textual(mime: str) -> bool:
    return (mime.startswith("text/") or bool(_XML_FAMILY_HINT.search(mime))
            or mime in {"application/json", "application/jsonl", "application/yaml",
                        "application/toml", "application/x-sh", "application/sql",
                        "application/x-tex", "application/rtf", "message/rfc822",
                        "application/postscript"})


def _refines(content: str, named: str) -> bool:
    """May a type from a name replace a weak type from content?"""
    if content == "application/octet-stream":
        return not _textual(named)
    if content == "text/plain":
        return _textual(named)
    if content in ("application/xml", "text/html"):
        return bool(_XML_FAMILY_HINT.search(named)) or named in ("text/html",
                                                                 "application/xhtml+xml")
    if content == "application/zip":
        return named in _ZIP_FAMILY
    if content == "application/x-ole-storage":
        return named in _OLE_FAMILY
    return False


def decide(content: str | None, declared: str | None, named: str | None) -> str | None:
    """Combine the three sources: strong content > declared > name > weak content."""
    if content is not None and content not in WEAK:
        return content
    if declared is not None and (content is None or content == declared
                                 or _refines(content, declared)):
        return declared
    if named is not None and (content is None or _refines(content, named)):
        return named
    return content


class MimeTypeIdentify(Pipelet):
    """Write a record's MIME type, from its content and its file name or extension.

    SMILA's ``MimeTypeIdentifyPipelet`` configurations load unchanged.

    Parameters:
        contentAttachment / ContentAttachment: the attachment with the content (default ``Content``).
        contentAttribute: or an attribute holding the content as text (default: none).
        extensionAttribute / FileExtensionAttribute: attribute with a file
            extension, file name, path or URL (default ``FileExtension``).
        filenameAttribute / FileNameAttribute: another attribute with a file
            name, path or URL (default: none).
        metaDataAttribute / MetaDataAttribute: attribute with protocol
            metadata such as ``Content-Type: text/html; charset=utf-8``
            (default: none).
        output / MimeTypeAttribute: the attribute written (default ``MimeType``).

    Decision: a specific magic number in the content (PDF, PNG, ZIP-based
    Office formats…) wins; then a declared Content-Type; then the extension;
    then what the content only hints at (plain text, XML, ZIP,
    binary).  Names refine hints when they agree (text + ``.csv`` →
    ``text/csv``; ZIP + ``.jar``); they never turn text into a PDF.  Only the
    first 64 KB of an attachment are read.  A record with nothing to go on
    is left unchanged.
    """

    runs_in_service = True
    parameters = frozenset({"contentAttachment", "ContentAttachment", "contentAttribute",
                            "extensionAttribute", "FileExtensionAttribute", "filenameAttribute",
                            "FileNameAttribute", "metaDataAttribute", "MetaDataAttribute",
                            "output", "MimeTypeAttribute"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attachment: str = s.name("contentAttachment", "ContentAttachment", default="Content")
        self.content_attribute: str | None = s.name("contentAttribute", default=None)
        self.extension: str = s.name("extensionAttribute", "FileExtensionAttribute",
                                     default="FileExtension")
        self.filename: str | None = s.name("filenameAttribute", "FileNameAttribute", default=None)
        self.metadata: str | None = s.name("metaDataAttribute", "MetaDataAttribute", default=None)
        self.output: str = s.name("output", "MimeTypeAttribute", default="MimeType")

    def _strings(self, bb: Blackboard, rid: str, attribute: str | None) -> list[str]:
        if attribute is None or not bb.has_attribute(rid, attribute):
            return []
        return [lit.value for lit in bb.get_literals(rid, attribute) if isinstance(lit.value, str)]

    def _content(self, bb: Blackboard, rid: str) -> str | None:
        if bb.has_attachment(rid, self.attachment):
            with bb.get_attachment_stream(rid, self.attachment) as stream:
                head = stream.read(SNIFF_BYTES + 1)
            return sniff(head[:SNIFF_BYTES], complete=len(head) <= SNIFF_BYTES)
        for text in self._strings(bb, rid, self.content_attribute):
            data = text.encode("utf-8")
            return sniff(data[:SNIFF_BYTES], complete=len(data) <= SNIFF_BYTES)
        return None

    def _declared(self, bb: Blackboard, rid: str) -> str | None:
        for value in self._strings(bb, rid, self.metadata):
            match = _CONTENT_TYPE.search(value) or _BARE_TYPE.match(value)
            if match and match.group(1).lower() != "application/octet-stream":
                return match.group(1).lower()
        return None

    def _named(self, bb: Blackboard, rid: str) -> str | None:
        for attribute in (self.extension, self.filename):
            for value in self._strings(bb, rid, attribute):
                ext = extension_of(value)
                if ext in EXTENSIONS:
                    return EXTENSIONS[ext]
        return None

    def identify(self, bb: Blackboard, rid: str) -> str | None:
        """The MIME type of record ``rid``, or None when nothing tells."""
        return decide(self._content(bb, rid), self._declared(bb, rid), self._named(bb, rid))

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        mime = self.identify(blackboard, rid)
        if mime is not None:
            blackboard.set_literal(rid, self.output, mime)
