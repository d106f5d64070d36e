"""Attachments: named binary blobs of a record, streamed in and out.

An attachment on a blackboard is bytes in memory, a spool or stored chunks
(``blackboard._blobs``).  Commit writes only what changed; a fragment's copy
of a stored attachment is copied inside the database, never through Python.
"""

from __future__ import annotations

import io
import tempfile
from typing import IO, TYPE_CHECKING, Any

from blackboard._blobs import COPY_BUFFER, SPOOL_MEMORY, Attachment, ChunkReader, SpoolView
from blackboard._errors import BlackboardError, ValueTypeError, where

if TYPE_CHECKING:
    from blackboard._entry import Entry as _Entry
    from blackboard._storage import SqlStore

__all__ = ["Attachment", "AttachmentsMixin"]


class AttachmentsMixin:
    """Attachment methods of :class:`Blackboard`."""

    store: SqlStore | None

    if TYPE_CHECKING:  # provided by Blackboard; declared for type checkers only
        def _entry(self, record_id: str) -> _Entry:
            ...

    def attachment_names(self, record_id: str) -> list[str]:
        """Names of the record's attachments."""
        return list(self._entry(record_id).attachments)

    def has_attachment(self, record_id: str, name: str) -> bool:
        return name in self._entry(record_id).attachments

    def _attachment(self, record_id: str, name: str) -> Attachment:
        att = self._entry(record_id).attachments.get(name)
        if att is None:
            raise BlackboardError(f"{where(record_id)}: no attachment {name!r}",
                                  record_id=record_id)
        return att

    def _open(self, record_id: str, name: str, att: Attachment) -> IO[bytes]:
        if att.data is not None:
            return io.BytesIO(att.data)
        if att.spool is not None:
            return io.BufferedReader(SpoolView(att.spool), COPY_BUFFER)
        if att.source is not None and self.store is not None:
            return io.BufferedReader(ChunkReader(self.store.attachment_chunks(*att.source)),
                                     COPY_BUFFER)
        raise BlackboardError(f"{where(record_id)}: attachment {name!r}: its content is not "
                              "on this blackboard (it was not shipped to this worker)",
                              record_id=record_id)

    def get_attachment(self, record_id: str, name: str) -> bytes:
        """The attachment's bytes (use :meth:`get_attachment_stream` for large ones).

        Raises :class:`BlackboardError` when there is no such attachment.
        """
        att = self._attachment(record_id, name)
        if att.data is not None:
            return att.data
        if att.spool is None and att.source is not None and self.store is not None:
            # Whole: the stored chunks joined once, not read through a stream a buffer at a time.
            return b"".join(self.store.attachment_chunks(*att.source))
        with self._open(record_id, name, att) as stream:
            return stream.read()

    def get_attachment_stream(self, record_id: str, name: str) -> IO[bytes]:
        """A binary stream over the attachment; stored ones are read a chunk at a time."""
        return self._open(record_id, name, self._attachment(record_id, name))

    def set_attachment(self, record_id: str, name: str, data: bytes) -> None:
        """Set the attachment to ``data`` (bytes-like)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueTypeError(f"{where(record_id)}: attachment {name!r} must be bytes, got "
                                 f"{type(data).__name__}", record_id=record_id)
        self._put_attachment(record_id, name, Attachment(bytes(data), dirty=True))

    def set_attachment_from_stream(self, record_id: str, name: str, stream: IO[bytes]) -> None:
        """Copy a binary stream into the attachment, never holding it whole in memory.

        The bytes go to a temporary file now (the stream may be closed
        afterwards) and into storage, chunk by chunk, on commit.
        """
        self._check_attachment_name(record_id, name)
        self._entry(record_id)
        if not hasattr(stream, "read"):
            raise ValueTypeError(f"{where(record_id)}: attachment {name!r}: expected a binary "
                                 f"stream, got {type(stream).__name__}", record_id=record_id)
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)
        try:
            while True:
                chunk = stream.read(COPY_BUFFER)
                if not chunk:
                    break
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    raise ValueTypeError(f"{where(record_id)}: attachment {name!r}: the stream "
                                         "gives text; open it in binary mode",
                                         record_id=record_id)
                spool.write(chunk)
        except BaseException:
            spool.close()
            raise
        self._put_attachment(record_id, name, Attachment(spool=spool, dirty=True))

    @staticmethod
    def _check_attachment_name(record_id: str, name: Any) -> None:
        if not isinstance(name, str) or not name or len(name) > 512:
            raise BlackboardError(f"{where(record_id)}: bad attachment name {name!r} "
                                  "(a non-empty string of up to 512 characters)",
                                  record_id=record_id)

    def _put_attachment(self, record_id: str, name: str, att: Attachment) -> None:
        self._check_attachment_name(record_id, name)
        entry = self._entry(record_id)
        old = entry.attachments.get(name)
        if old is not None:
            old.close()
        entry.attachments[name] = att
        entry.changed = True

    def remove_attachment(self, record_id: str, name: str) -> None:
        """Remove the attachment (from storage on commit)."""
        entry = self._entry(record_id)
        self._attachment(record_id, name).close()
        del entry.attachments[name]
        entry.removed_attachments.add(name)
        entry.changed = True
