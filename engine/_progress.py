"""Which pipelet call a run is in, told to whoever watches the run.

A run that hangs or takes its process down cannot say where it was; its
watcher can, if the interpreter told it before each call.  Before it calls a
pipelet (or a service), ``invoke_pipelet`` hands :func:`starting` the
activity and its records; whoever runs the interpreter may watch
(:func:`watched`, per thread): the local runner keeps the last call in a
variable, a warm worker's run process writes it into memory it shares with the
task that supervises it (:class:`CallSlot`: no system call, no message per
call), and the task hands it to the driver with its answer when the run
timed out or died.  A timeout
or a crash is then blamed on that call: the pipelet class, the workflow's
``file:line`` of its ``invokePipelet`` and its name, and the records
(:func:`timeout_reason`, :func:`died_reason`).

Nobody watching costs one context-variable read per call.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["NAMED", "CallSlot", "PipeletCall", "StopSlot", "broke_its_run", "stoppable", "stopped", "died_reason", "not_run_reason", "on_records", "starting",
           "timeout_reason", "watched"]

NAMED = 5  # record IDs a call names at most (the rest are counted)


@dataclass(frozen=True, slots=True)
class PipeletCall:
    """One call of a pipelet (or a service) as a run's watcher hears of it.

    ``kind`` is ``pipelet`` or ``service``; ``cls`` the dotted class;
    ``where`` the workflow file and line of the activity; ``tag`` and
    ``name`` the activity's element and name; ``records`` the first
    :data:`NAMED` record IDs of the call and ``count`` how many it has.
    """

    kind: str
    cls: str
    where: str
    tag: str
    name: str
    records: tuple[str, ...]
    count: int

    def text(self) -> str:
        """``pipelet mod.Class (file.xml:14, invokePipelet 's2')``"""
        return f"{self.kind} {self.cls} ({self.where}, {self.tag} {self.name!r})"

    def on(self) -> str:
        """``record 'a'``, ``records 'a', 'b' and 3 more``: the records it was called with."""
        return on_records(self.records, self.count)

    def to_json(self) -> bytes:
        return orjson.dumps([self.kind, self.cls, self.where, self.tag, self.name,
                             list(self.records), self.count])

    @classmethod
    def from_json(cls, data: bytes) -> PipeletCall:
        kind, klass, where, tag, name, records, count = orjson.loads(data)
        return cls(str(kind), str(klass), str(where), str(tag), str(name),
                   tuple(map(str, records)), int(count))


class CallSlot:
    """The last call a run process made, in memory its forked parent shares.

    Made before the fork (an anonymous shared mapping); the run process
    :meth:`tell` s each call, the parent :meth:`read` s it once the run
    process is gone (killed at its limit, or dead).  Two halves: a call is
    written into the half not in use and the index byte flipped after it, so
    a process killed in the middle of a write leaves the previous call whole.
    """

    SIZE = 16384
    _HALF = (SIZE - 8) // 2
    _LEN = struct.Struct("!I")

    def __init__(self, path: str | None = None) -> None:
        self._map = _shared(self.SIZE, path)

    def tell(self, call: PipeletCall | None) -> None:
        """``call`` is the run's current call (None: it is between calls, or starts)."""
        data = b"" if call is None else call.to_json()
        if len(data) > self._HALF - self._LEN.size:  # IDs or names too long: keep the call
            data = PipeletCall(call.kind, call.cls[:200], call.where[:400],  # type: ignore[union-attr]
                               call.tag, call.name[:200], (), call.count).to_json()  # type: ignore[union-attr]
        half = 1 - self._map[0]
        at = 8 + half * self._HALF
        self._LEN.pack_into(self._map, at, len(data))
        self._map[at + self._LEN.size:at + self._LEN.size + len(data)] = data
        self._map[0] = half

    def read(self) -> bytes:
        """The last call told, as :meth:`PipeletCall.to_json` bytes (empty: none)."""
        at = 8 + self._map[0] * self._HALF
        (n,) = self._LEN.unpack_from(self._map, at)
        return bytes(self._map[at + self._LEN.size:at + self._LEN.size + min(n, self._HALF)])

    def close(self) -> None:
        self._map.close()


def on_records(records: Sequence[str], count: int | None = None) -> str:
    """``record 'a'``, ``records 'a', 'b'``, ``records 'a', ... and 7 more``."""
    count = len(records) if count is None else count
    named = ", ".join(repr(r) for r in records[:NAMED])
    if count == 1:
        return f"record {named}"
    more = count - min(len(records), NAMED)
    return f"records {named}" + (f" and {more} more" if more > 0 else "")


def _culprit(call: PipeletCall | None, records: Sequence[str]) -> str:
    """Where a run was: in a call (its pipelet and records), or only its records (before
    its first call, or where nobody could tell)."""
    if call is None:
        return f"on {on_records(records)}"
    return f"in {call.text()} on {call.on()}"


def timeout_reason(call: PipeletCall | None, seconds: float, records: Sequence[str]) -> str:
    """``timeout: pipelet X (file:line, invokePipelet 'n') ran longer than 30 s on record 'r'``"""
    if call is None:
        return f"timeout: the run of {on_records(records)} ran longer than {seconds:g} s"
    return f"timeout: {call.text()} ran longer than {seconds:g} s on {call.on()}"


def died_reason(how: str, call: PipeletCall | None, records: Sequence[str]) -> str:
    """``the worker process died (exit 3) in pipelet X (file:line, ...) on record 'r'``"""
    return f"the worker process died{f' ({how})' if how else ''} {_culprit(call, records)}"


_BROKE = ("timeout: ", "the worker process died", "Spark task failed: ")


def broke_its_run(reason: str | None) -> bool:
    """Whether an instance's failure ``reason`` is one of a run it broke: it ran past its
    deadline or its process died (:func:`timeout_reason`, :func:`died_reason`, a Spark task
    that failed) — not a pipelet that raised."""
    return bool(reason) and reason.startswith(_BROKE)  # type: ignore[union-attr]


def not_run_reason(seconds: float) -> str:
    return f"not run: isolating a failure in this batch took longer than {seconds:g} s"


_watcher: ContextVar[Callable[[PipeletCall], None] | None] = ContextVar("chalk_watcher",
                                                                         default=None)


@contextmanager
def watched(tell: Callable[[PipeletCall], None]) -> Iterator[None]:
    """Within the block, on this thread, ``tell`` hears of each call before it is made."""
    token = _watcher.set(tell)
    try:
        yield
    finally:
        _watcher.reset(token)


_stops: ContextVar[Callable[[Sequence[str]], set[str]] | None] = ContextVar("chalk_stops",
                                                                           default=None)


@contextmanager
def stoppable(among: Callable[[Sequence[str]], set[str]]) -> Iterator[None]:
    """Within the block, on this thread, ``among(ids)`` says which of the records a call
    is about to get were cancelled meanwhile (``chalk jobs cancel``): their instances end
    there, before the call (:func:`stopped`)."""
    token = _stops.set(among)
    try:
        yield
    finally:
        _stops.reset(token)


def stopped(ids: Sequence[str]) -> set[str]:
    """The records among ``ids`` whose messages were cancelled while they ran (none when
    nobody can say)."""
    among = _stops.get()
    return set() if among is None else among(ids)


class StopSlot:
    """The records cancelled now, in memory a supervisor shares with the workers it forked:
    the supervisor :meth:`replace` s it with what the driver sends (the whole set, with its version),
    a worker asks :meth:`among` before each pipelet call.

    One writer.  The set is written into the half not in use, then the header (version,
    half) is written in one go, with a sequence number made odd around the write, so a
    reader never takes half a set: it reads again when the sequence moved.  A set too
    large for a half is cut (the service then stops the message at its commit instead).
    """

    SIZE = 65536
    _HEAD = struct.Struct("!IIIB")   # sequence, version, length, half
    _HALF = (SIZE - 64) // 2

    def __init__(self, path: str | None = None) -> None:
        self._map = _shared(self.SIZE, path)
        self._version = -1
        self._ids: frozenset[str] = frozenset()

    def replace(self, version: int, ids: Sequence[str]) -> None:
        """(the writer) The cancelled set is now ``ids`` (``version`` grows with each)."""
        seq, _v, _n, half = self._HEAD.unpack_from(self._map, 0)
        data = "\n".join(ids).encode("utf-8")[:self._HALF]
        if len(data) == self._HALF:  # cut: keep whole IDs only
            data = data[:data.rfind(b"\n") + 1 or 0]
        other = 1 - half
        at = 64 + other * self._HALF
        self._map[at:at + len(data)] = data
        self._HEAD.pack_into(self._map, 0, (seq + 1) & 0xFFFFFFFF, version, len(data), other)
        self._HEAD.pack_into(self._map, 0, (seq + 2) & 0xFFFFFFFF, version, len(data), other)

    def version(self) -> int:
        return int(self._HEAD.unpack_from(self._map, 0)[1])

    def current(self) -> tuple[int, frozenset[str]]:
        """(a reader) The version and the set."""
        for _ in range(100):
            seq, version, n, half = self._HEAD.unpack_from(self._map, 0)
            if seq & 1:
                continue
            if version == self._version:
                return version, self._ids
            at = 64 + half * self._HALF
            data = bytes(self._map[at:at + n])
            if self._HEAD.unpack_from(self._map, 0)[0] == seq:
                self._version = version
                self._ids = frozenset(data.decode("utf-8", "replace").split("\n")) if data \
                    else frozenset()
                return version, self._ids
        return self._version, self._ids

    def among(self, ids: Sequence[str]) -> set[str]:
        _version, cancelled = self.current()
        return set(cancelled.intersection(ids)) if cancelled else set()

    def close(self) -> None:
        self._map.close()


def _shared(size: int, path: str | None) -> mmap.mmap:
    """Memory shared with processes forked after it (anonymous), or with any process that
    maps the same file (``path``: where workers are spawned, not forked)."""
    if path is None:
        return mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
    with open(path, "a+b") as f:
        if os.fstat(f.fileno()).st_size < size:
            f.truncate(size)
        return mmap.mmap(f.fileno(), size)


def starting(kind: str, cls: str, wf: Any, act: Any, ids: Sequence[str]) -> None:
    """The interpreter is about to call ``cls`` for activity ``act`` of ``wf`` on ``ids``."""
    tell = _watcher.get()
    if tell is None:
        return
    tag = "invokeService" if getattr(act, "service", False) else act.kind
    tell(PipeletCall(kind, cls, f"{wf.path}:{act.line}", tag,
                     act.name or getattr(act, "requested", "") or cls,
                     tuple(ids[:NAMED]), len(ids)))
