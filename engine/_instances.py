"""Workflow instances while they run: their state, and the scopes they are inside.

An *instance* is one message's records (or one ``forEach`` iteration of
them).  Everything that changes while it runs lives here, apart from the
frozen specs (``engine._specs``) and from the interpreter that moves it along
(``engine._interpreter``).

States (a table, not scattered flags)::

    RUNNING --fault--> FAULTED --caught by a scope--> RUNNING
    RUNNING --exit---> EXITED            (done, success)
    RUNNING --end----> COMPLETED         (done, success)
    RUNNING --batched pipelet call raised--> TAINTED (rerun by the caller)

Each instance also keeps a stack of *scope frames*, one per scope it is
inside (the process is the bottom one); a scope that completed normally
leaves a :class:`Completed` in the frame around it, which is what its
compensation handler needs (see ``engine._compensation``).

Parts.  Decisions are per record: where the records of one instance take
different ways through a construct (an ``if``'s branches, a loop they leave
at different times, a link that holds for some of them), the construct
splits the instance into *parts*, one per way, and :class:`Splits` rejoins
them when it ends.  A part is an :class:`Instance` whose ``parent`` is the
whole: it shares the whole's variables and scope frames (what it completes
is the whole's to compensate) and copies its links.  While it is split the
whole waits, RUNNING, in no cohort.  Rejoined, the whole holds every part's
records in their original order (a record a pipelet added after the record
it followed) and the links of every part; when a part faulted, exited or was
tainted, so is the whole -- the message is one, committed or not as a whole --
and the parts not yet run do not run (:meth:`Splits.going`).  Nothing of
this exists while every record of an instance decides the same way.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine._errors import WorkflowFault
from engine._specs import Scope
from engine._variables import Frame

__all__ = ["Completed", "Instance", "ScopeFrame", "Splits", "State"]


class State(enum.Enum):
    RUNNING = "running"
    FAULTED = "faulted"
    EXITED = "exited"
    COMPLETED = "completed"
    TAINTED = "tainted"


_DONE_OK = {State.EXITED, State.COMPLETED}

Links = dict[str, Any]  # link name -> True, False, or the frozenset of record IDs it holds for


@dataclass(eq=False, slots=True)
class Completed:
    """A scope that completed normally: what its compensation handler needs."""

    spec: Scope
    ids: list[str]
    frame: Frame | None
    children: list[Completed] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class ScopeFrame:
    """A scope an instance is inside: the completed scopes directly in it, in completion order."""

    spec: Scope | None
    completed: list[Completed] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class Instance:
    """Running state of one workflow instance (or one ``forEach`` iteration of it)."""

    key: Any
    ids: list[str]
    state: State = State.RUNNING
    fault: WorkflowFault | None = None
    handling: list[WorkflowFault] = field(default_factory=list)  # faults being handled (for rethrow)
    links: Links = field(default_factory=dict)  # a link's status: a bool, or the records it holds for
    parent: Instance | None = None
    taint: str | None = None
    frame: Frame | None = None  # BPEL variables
    scopes: list[ScopeFrame] = field(default_factory=list)  # scopes it is inside (the process first)
    scope_ok: bool | None = None  # how the last scope it ran ended: normally, or by its fault handler

    @property
    def running(self) -> bool:
        return self.state is State.RUNNING

    @property
    def ok(self) -> bool:
        return self.state in _DONE_OK

    def fail(self, fault: WorkflowFault) -> None:
        """Fault the instance with ``fault``, which it keeps without the frames it was raised
        in: they hold the interpreter, and with it the blackboard and every record on it (a
        reference cycle through the instance: garbage only the cyclic collector frees)."""
        self.state = State.FAULTED
        self.fault = fault
        cause: BaseException | None = fault
        for _ in range(16):  # the fault, and what it was raised from or while handling
            if cause is None:
                break
            cause.__traceback__ = None
            cause = cause.__cause__ or cause.__context__


# -- parts ------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Split:
    whole: Instance
    positions: dict[str, int]  # the whole's records when it split -> their order
    pieces: list[tuple[Instance | list[str], int]]  # a part, or records a loop set aside; first position

    def ended(self) -> bool:
        """A part or an instance around it ended: the rest of the whole's records go no further."""
        for piece, _ in self.pieces:
            if isinstance(piece, Instance) and piece.state is not State.RUNNING:
                return True
        inst: Instance | None = self.whole
        while inst is not None:
            if inst.state is not State.RUNNING:
                return True
            inst = inst.parent
        return False


class Splits:
    """The instances one construct split into parts, to rejoin when it ends (see the module doc).

    A construct makes one only when some instance's records decide differently.
    """

    __slots__ = ("_splits",)

    def __init__(self) -> None:
        self._splits: dict[int, _Split] = {}

    def _split_of(self, inst: Instance) -> tuple[_Split, Instance | None]:
        """The split ``inst`` is a part of here (and the part), or a new one of ``inst`` as a whole."""
        parent = inst.parent
        if parent is not None and id(parent) in self._splits:
            return self._splits[id(parent)], inst
        split = _Split(inst, {rid: n for n, rid in enumerate(inst.ids)}, [])
        self._splits[id(inst)] = split
        return split, None

    def _part(self, split: _Split, ids: list[str]) -> Instance:
        whole = split.whole
        part = Instance(key=whole.key, ids=ids, parent=whole, handling=list(whole.handling),
                        links=dict(whole.links), frame=whole.frame, scopes=list(whole.scopes))
        split.pieces.append((part, split.positions.get(ids[0], -1) if ids else -1))
        return part

    def parts(self, whole: Instance, groups: Sequence[list[str]]) -> list[Instance]:
        """``whole`` split into a part per group of its records (each in the records' order)."""
        split = self._splits[id(whole)] = _Split(whole, {rid: n for n, rid in enumerate(whole.ids)}, [])
        return [self._part(split, ids) for ids in groups]

    def narrow(self, inst: Instance, keep: Sequence[bool]) -> Instance:
        """The records of ``inst`` whose ``keep`` is true go on, as a part; the others wait for the rejoin."""
        split, part = self._split_of(inst)
        stay = [rid for rid, k in zip(inst.ids, keep, strict=True) if k]
        leave = [rid for rid, k in zip(inst.ids, keep, strict=True) if not k]
        split.pieces.append((leave, split.positions.get(leave[0], -1)))
        if part is None:
            return self._part(split, stay)
        part.ids = stay
        return part

    def going(self, cohort: list[Instance]) -> list[Instance]:
        """``cohort`` without the parts whose whole ended meanwhile."""
        splits = self._splits
        return [i for i in cohort if i.parent is None or id(i.parent) not in splits
                or not splits[id(i.parent)].ended()]

    def rejoin(self) -> None:
        """Every whole gets its parts' records, links and end back (see the module doc)."""
        for split in self._splits.values():
            whole = split.whole
            pieces = [(p.ids, p.links) if isinstance(p, Instance) else (p, whole.links) for p, _ in split.pieces]
            whole.ids = _in_order(split.positions, [(ids, first) for (ids, _), (_, first)
                                                     in zip(pieces, split.pieces, strict=True)])
            whole.links = _joined_links(pieces)
            if whole.state is State.RUNNING:  # (a part tainted it already when it is the root)
                parts = [p for p, _ in split.pieces if isinstance(p, Instance)]
                for state in (State.TAINTED, State.FAULTED, State.EXITED):
                    ended = next((p for p in parts if p.state is state), None)
                    if ended is not None:
                        whole.state, whole.fault, whole.taint = state, ended.fault, ended.taint
                        break
        self._splits = {}


def _in_order(positions: dict[str, int], pieces: list[tuple[list[str], int]]) -> list[str]:
    """The pieces' records in their original order; one a piece gained after the one it followed."""
    keyed: list[tuple[int, int, int, str]] = []
    seen: set[str] = set()
    seq = 0
    for ids, first in pieces:
        anchor, after = first, -1
        for rid in ids:
            if rid in seen:
                continue
            seen.add(rid)
            known = positions.get(rid)
            if known is not None:
                anchor, after = known, 1
                keyed.append((known, 0, seq, rid))
            else:
                keyed.append((anchor, after, seq, rid))
            seq += 1
    keyed.sort()
    return [k[3] for k in keyed]


def _joined_links(pieces: list[tuple[list[str], Links]]) -> Links:
    """Each link as the pieces left it: one status when they agree, else the records it holds for."""
    joined: Links = dict(pieces[0][1])
    names = {name for _, links in pieces for name in links}
    for name in names:
        values = [links.get(name) for _, links in pieces]
        if all(v == values[0] for v in values):
            if values[0] is None:
                joined.pop(name, None)
            else:
                joined[name] = values[0]
            continue
        true: set[str] = set()
        for (ids, _), value in zip(pieces, values, strict=True):
            if value is True:
                true.update(ids)
            elif isinstance(value, frozenset):
                true.update(value)
        joined[name] = frozenset(true) if true else False
    return joined
