"""Content fingerprints for finding duplicates."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig
from pipelets._frames import STRING, FrameIO, cached_column, column, decline, frame_name, java_regex

__all__ = ["ALGORITHMS", "Fingerprint"]

ALGORITHMS = tuple(sorted(a for a in hashlib.algorithms_guaranteed if not a.startswith("shake")))
_SPACE = re.compile(r"\s+")
_CHUNK = 1 << 20
# hashlib name -> (Spark function, bits) for the DataFrame form
_SPARK_HASHES = {"md5": ("md5", 0), "sha1": ("sha1", 0), "sha224": ("sha2", 224), "sha256": ("sha2", 256),
                 "sha384": ("sha2", 384), "sha512": ("sha2", 512)}
# What json.dumps writes for the characters it escapes in ASCII text, backslash
# first.  The DataFrame form replaces these; a value holding any other control
# character (rare in text) is declined, and process() computes its fingerprint.
_JSON_ESCAPES = [(c, json.dumps(c)[1:-1]) for c in ("\\", '"', "\t", "\n", "\r")]
_JAVA_RARE_CONTROL = r"[\x{0}-\x{8}\x{b}\x{c}\x{e}-\x{1f}]"  # the other 29 (Java regex)


def _normalized(value: Any) -> Any:
    if isinstance(value, str):
        return _SPACE.sub(" ", value).strip().lower()
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value


def _frame(h: Any, tag: bytes, *parts: bytes) -> None:
    # length-prefixed parts: ("ab", "c") and ("a", "bc") never hash alike
    h.update(tag)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)


class Fingerprint(Pipelet):
    """Write a hash of chosen attributes and attachments (hex), to find duplicates.

    Parameters:
        attributes: attribute names, a list or comma-separated (default: all
            attributes but the output, unless ``attachments`` is given).
        attachments: attachment names, a list or comma-separated (default: all
            attachments, unless ``attributes`` is given).
        output: the attribute written (default ``fingerprint``).
        algorithm: a hashlib algorithm (default ``sha256``).
        normalize: compare text loosely: lowercase, whitespace collapsed
            (default false).

    Two records get the same fingerprint exactly when the chosen attributes
    hold the same values (in order; an absent attribute differs from an
    empty one) and the chosen attachments the same bytes.  Attachments are
    read as streams.
    """

    runs_in_service = True
    parameters = frozenset({"attributes", "attribute", "attachments", "attachment", "output",
                            "algorithm", "normalize"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attributes: list[str] | None = s.names("attributes", "attribute", default=None)
        self.attachments: list[str] | None = s.names("attachments", "attachment", default=None)
        self.everything = self.attributes is None and self.attachments is None
        self.output: str = s.name("output", default="fingerprint")
        self.algorithm: str = s.choice("algorithm", ALGORITHMS, default="sha256")
        self.normalize: bool = s.boolean("normalize", default=False)

    def fingerprint(self, bb: Blackboard, rid: str) -> str:
        """The fingerprint of record ``rid``."""
        h = hashlib.new(self.algorithm)
        if self.everything:
            names = sorted(n for n in bb.attribute_names(rid) if n != self.output)
            attachments = sorted(bb.attachment_names(rid))
        else:
            names, attachments = self.attributes or [], self.attachments or []
        for name in names:
            if bb.has_attribute(rid, name):
                value = bb.get_attributes(rid, [name]).get(name)
                if self.normalize:
                    value = _normalized(value)
                encoded = json.dumps(value, sort_keys=True, ensure_ascii=False).encode("utf-8")
                _frame(h, b"A", name.encode("utf-8"), encoded)
            else:
                _frame(h, b"a", name.encode("utf-8"))
        for name in attachments:
            if not bb.has_attachment(rid, name):
                _frame(h, b"b", name.encode("utf-8"))
                continue
            inner = hashlib.new(self.algorithm)
            with bb.get_attachment_stream(rid, name) as stream:
                while chunk := stream.read(_CHUNK):
                    inner.update(chunk)
            _frame(h, b"B", name.encode("utf-8"), inner.digest())
        return h.hexdigest()

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        blackboard.set_literal(rid, self.output, self.fingerprint(blackboard, rid))

    def frame_io(self) -> FrameIO | None:
        names = [*(self.attributes or []), self.output]
        if self.everything or self.attachments or self.algorithm not in _SPARK_HASHES \
                or not all(frame_name(n) for n in names):
            return None
        return FrameIO(reads=tuple(self.attributes or ()), writes=((self.output, STRING),),
                       declines=True)

    def transform(self, frame: Any) -> Any:
        digest, rare = cached_column(self, self._digest)
        return decline(frame, rare).withColumn(self.output, digest)

    def _digest(self) -> tuple[Any, Any]:
        """The fingerprint column, and the test of values it leaves to ``process``."""
        from pyspark.sql import functions as F

        def framed(tag: bytes, *parts: bytes) -> bytes:
            return tag + b"".join(len(p).to_bytes(8, "big") + p for p in parts)

        pieces = []
        rare = F.lit(False)
        for name in self.attributes or []:
            key = name.encode("utf-8")
            value = column(name)
            if self.normalize:
                value = F.lower(F.trim(F.regexp_replace(value, F.lit(java_regex(_SPACE)), F.lit(" "))))
            rare = rare | value.rlike(_JAVA_RARE_CONTROL)
            for char, replacement in _JSON_ESCAPES:  # json.dumps of a str, on ASCII text
                value = F.replace(value, F.lit(char), F.lit(replacement))
            encoded = F.encode(F.concat(F.lit('"'), value, F.lit('"')), "UTF-8")
            size = F.unhex(F.lpad(F.hex(F.octet_length(encoded)), 16, "0"))
            present = F.concat(F.lit(framed(b"A", key)), size, encoded)
            pieces.append(F.when(column(name).isNull(), F.lit(framed(b"a", key))).otherwise(present))
        data = F.concat(*pieces) if pieces else F.lit(b"")
        function, bits = _SPARK_HASHES[self.algorithm]
        digest = F.sha2(data, bits) if function == "sha2" else getattr(F, function)(data)
        return digest, rare
