"""An attachment's content on a blackboard, and streams over it.

An attachment is one of: bytes in memory, a spool (a temporary file, for
streams — never held whole in memory), or a reference to chunks in storage
(read lazily, one chunk at a time).  :class:`Attachment` holds which, and
whether commit must write it; the Blackboard's attachment methods are in
``blackboard._attachments``.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["COPY_BUFFER", "SPOOL_MEMORY", "Attachment", "ChunkReader", "SpoolView"]

SPOOL_MEMORY = 1 << 20   # bytes of a streamed attachment kept in memory before spilling to disk
COPY_BUFFER = 1 << 20


class Attachment:
    """One attachment's content: in memory, spooled, or stored chunks."""

    __slots__ = ("data", "spool", "dirty", "source")

    def __init__(self, data: bytes | None = None, spool: IO[bytes] | None = None,
                 dirty: bool = False, source: tuple[str, str] | None = None):
        self.data = data          # bytes held in memory
        self.spool = spool        # or a temporary file (streamed in)
        self.dirty = dirty        # must be written (or copied from ``source``) on commit
        self.source = source      # or (record id, name) of stored chunks

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()
            self.spool = None

    def copy(self) -> Attachment:
        """An independent copy (a spool is copied file to file, not into memory)."""
        if self.spool is not None:
            spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)
            self.spool.seek(0)
            shutil.copyfileobj(self.spool, spool, COPY_BUFFER)
            return Attachment(spool=spool, dirty=True)
        return Attachment(self.data, None, True, self.source)


class SpoolView(io.RawIOBase):
    """A reader over a spool that has its own position and never closes the spool."""

    def __init__(self, spool: IO[bytes]):
        self._spool = spool
        self._position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._spool.seek(self._position)
        data = self._spool.read(len(buffer))
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)


class ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            try:
                self._chunk = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._chunk))
        buffer[:size] = self._chunk[:size]
        self._chunk = self._chunk[size:]
        return size
