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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from engine._errors import WorkflowFault
from engine._specs import Scope
from engine._variables import Frame

__all__ = ["Completed", "Instance", "ScopeFrame", "State"]


class State(enum.Enum):
    RUNNING = "running"
    FAULTED = "faulted"
    EXITED = "exited"
    COMPLETED = "completed"
    TAINTED = "tainted"


_DONE_OK = {State.EXITED, State.COMPLETED}


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
    links: dict[str, bool] = field(default_factory=dict)
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
