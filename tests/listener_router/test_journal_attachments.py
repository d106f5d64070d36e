"""Large attachments travel by reference: the entry stays small, the subscriber streams the
content from the publisher's store."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import orjson
import pytest
from journal_helpers import (  # noqa: F401  (journal_fixture: the journal fixture)
    Journal,
    journal_fixture,
    read_entries,
    record_apply,
    stream_bytes,
)

from blackboard import Blackboard
from listener_router.journal import AttachmentRef, AttachmentUnavailable

MB = 1 << 20


class _Pattern(io.RawIOBase):
    """``size`` bytes of a repeating, position-dependent pattern, produced as read."""

    def __init__(self, size: int):
        self.size = size
        self.pos = 0
        self.block = bytes(range(256)) * 4096        # 1 MiB

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self.pos, len(self.block))
        start = self.pos % len(self.block)
        chunk = (self.block[start:] + self.block[:start])[:n]
        buffer[:n] = chunk
        self.pos += n
        return n


def _digest(size: int) -> str:
    h = hashlib.sha256()
    stream = _Pattern(size)
    while chunk := stream.read(4 * MB):
        h.update(chunk)
    return h.hexdigest()


@pytest.mark.slow
def test_an_attachment_of_200_mb_travels_by_reference_not_inside_the_log(
        journal: Journal) -> None:
    size = 200 * MB
    with Blackboard.connect(journal.db) as bb:
        bb.create("big")
        bb.set_attachment_from_stream("big", "content", io.BufferedReader(_Pattern(size), MB))
        bb.set_attachment("big", "thumb", b"tiny")
        bb.commit("big")
    journal.publish([{"id": "big", "attributes": {"text": "a large one"}}])

    [(offset, body)] = read_entries(journal.settings.broker_url, journal.rule.stream)
    entry = orjson.loads(body)
    assert entry["attachments"]["content"] == {
        "ref": {"record": "big", "name": "content", "version": 2, "size": size}}
    assert entry["attachments"]["thumb"] == {"inline": "dGlueQ=="}
    assert len(body) < 600, len(body)                     # bytes per entry: small
    on_disk = stream_bytes(journal.rule.stream)
    if on_disk is not None:                               # the node's files are on this machine
        assert on_disk < 64 * 1024, on_disk

    seen: dict[str, Any] = {}

    def apply(entries: list[Any], conn: Any) -> None:
        [e] = entries
        ref = e.attachments["content"]
        assert isinstance(ref, AttachmentRef)
        h = hashlib.sha256()
        read = 0
        with e.open_attachment("content") as stream:
            while chunk := stream.read(4 * MB):
                h.update(chunk)
                read += len(chunk)
        seen.update(size=read, digest=h.hexdigest(), thumb=e.attachment("thumb"),
                    entry_size=e.size)
        record_apply(entries, conn)

    rule = journal.subscriber("s", source=journal.db)
    stats = journal.run(rule, until=lambda s: s.applied >= 1, apply=apply)
    assert stats.applied == 1
    assert seen == {"size": size, "digest": _digest(size), "thumb": b"tiny",
                    "entry_size": len(body)}


def test_a_reference_to_an_attachment_replaced_since_says_so_and_names_the_versions(
        journal: Journal) -> None:
    journal.with_journal(inline_below=16)
    with Blackboard.connect(journal.db) as bb:
        bb.create("doc")
        bb.set_attachment("doc", "content", b"first content, long enough for a reference")
        bb.commit("doc")
    journal.publish([{"id": "doc", "attributes": {"text": "one"}}])    # version 2
    journal.publish([{"id": "doc", "attributes": {"text": "two"}}])    # version 3
    outcomes: list[str] = []

    def apply(entries: list[Any], conn: Any) -> None:
        for e in entries:
            try:
                outcomes.append(e.attachment("content").decode())
            except AttachmentUnavailable as err:
                outcomes.append(f"unavailable superseded={err.superseded}: {err}")
        record_apply(entries, conn)

    journal.run(journal.subscriber("s", source=journal.db), until=lambda s: s.applied >= 2,
                apply=apply)
    assert outcomes[0].startswith("unavailable superseded=True: record 'doc' attachment "
                                  "'content': the source store has version 3, the entry "
                                  "version 2"), outcomes
    assert outcomes[1] == "first content, long enough for a reference"
