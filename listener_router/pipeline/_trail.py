"""The pipelet call each run in the service's process is in, where a crash leaves it behind.

A pipelet that ends the process (``os._exit``, a segfault) leaves no
exception to log; its run's record in the store says which messages it ran,
not where.  So before each pipelet call of a run here, the call
(``engine.PipeletCall``) is written into that run's slot of a small file:
the kernel keeps what was written when the process dies, and the next
incarnation of this member reads it (:meth:`Trail.left`) to say which call
the crashed run was in.  A write is one ``pwrite`` of a few hundred bytes
(no ``fsync``: it has to outlive the process, not the machine).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import tempfile
import threading
from collections.abc import Callable

from engine import PipeletCall

__all__ = ["Trail"]

log = logging.getLogger(__name__)

SLOTS = 32         # runs here at once that leave a trail (more run without)
SLOT = 1024        # bytes a slot holds: its length, the run's ID, the call
_HEAD = struct.Struct("!HH")   # length of the run's ID, of the call's JSON


def _ignore(call: PipeletCall) -> None:
    pass


class Trail:
    """One member's file of slots (module doc); ``folder``: where (the temporary folder)."""

    def __init__(self, member: str, folder: str | None = None):
        name = hashlib.sha1(member.encode()).hexdigest()[:16]
        self.path = os.path.join(folder or tempfile.gettempdir(), f"chalk-trail-{name}")
        self._lock = threading.Lock()
        self._free = list(range(SLOTS))
        self._slots: dict[str, int] = {}
        self._fd: int | None = None

    def left(self) -> dict[str, PipeletCall]:
        """The calls an earlier incarnation's runs were last in, by run ID; the file is
        cleared for this one."""
        found: dict[str, PipeletCall] = {}
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            return found
        for at in range(0, len(data) - _HEAD.size, SLOT):
            with contextlib.suppress(ValueError, TypeError, struct.error, UnicodeDecodeError):
                size, length = _HEAD.unpack_from(data, at)
                run = data[at + _HEAD.size:at + _HEAD.size + size].decode()
                body = data[at + _HEAD.size + size:at + _HEAD.size + size + length]
                if run and length:
                    found[run] = PipeletCall.from_json(body)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        return found

    def watch(self, run_id: str) -> Callable[[PipeletCall], None]:
        """What a run here tells its calls to (a no-op when every slot is taken or the file
        cannot be written)."""
        with self._lock:
            if not self._free or not self._open():
                return _ignore
            slot = self._slots[run_id] = self._free.pop()
        fd = self._fd
        assert fd is not None
        ident = run_id.encode()

        def tell(call: PipeletCall) -> None:
            body = call.to_json()
            if _HEAD.size + len(ident) + len(body) > SLOT:  # long record IDs: name one
                body = PipeletCall(call.kind, call.cls, call.where, call.tag, call.name,
                                   call.records[:1], call.count).to_json()
                if _HEAD.size + len(ident) + len(body) > SLOT:
                    return
            with contextlib.suppress(OSError):
                os.pwrite(fd, _HEAD.pack(len(ident), len(body)) + ident + body, slot * SLOT)

        return tell

    def end(self, run_id: str) -> None:
        """The run is over: its slot is cleared and free again."""
        with self._lock:
            slot = self._slots.pop(run_id, None)
            if slot is None or self._fd is None:
                return
            with contextlib.suppress(OSError):
                os.pwrite(self._fd, _HEAD.pack(0, 0), slot * SLOT)
            self._free.append(slot)

    def _open(self) -> bool:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:
                log.warning("cannot keep the trail of runs in this process (%s): a crash "
                            "will not say which pipelet it was in", e)
                self._free = []
                return False
        return True
