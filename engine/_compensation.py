"""Scopes' compensation and termination, for the interpreter.

Theory of operation (BPEL 2.0, chapter 12, on cohorts of instances).  Each
instance keeps a stack of *scope frames*, one per scope it is inside (the
process is the bottom one).  When a scope completes normally, a
:class:`Completed` record of it -- the records it ran on, its variables, and
the completed scopes inside it -- is appended to the enclosing frame: its
compensation handler is "installed".  A scope whose fault handler ran is not
compensatable, and neither is anything inside it.

``<compensate/>`` (in a fault, compensation or termination handler) runs the
compensation of every completed scope directly inside the handler's scope,
in the reverse order of completion; ``<compensateScope target="S"/>`` only of
those named S.  Each runs once.  A compensation handler runs on the records
and with the variables the scope completed with; inside it, ``<compensate/>``
reaches that scope's own inner scopes.  A scope without a compensation
handler compensates its inner scopes (the default handler); a scope without
a matching fault handler compensates its inner scopes and rethrows (the
default fault handler), and so does the process.

Termination.  Branches of a ``flow`` and of a parallel ``forEach`` run one
after another here (a legal order for concurrent branches), so when one
faults -- or a parallel ``forEach``'s completion condition is met -- the
branches not yet run are, in BPEL's terms, still running and are
terminated: every scope they have started (a branch's own scope, the first
of a sequence, every branch of a nested flow; a branch waiting on a link has
started nothing) runs its termination handler, innermost first.  Faults
inside a termination handler are not propagated; the default handler
compensates the scope's completed inner scopes (there are none in a branch
that never ran).

To keep pipelet calls batched, instances that compensate the same scope in
the same round run its handler as one cohort.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine._errors import WorkflowFault
from engine._instances import Completed, Instance, ScopeFrame, State
from engine._interpreter import Interpreter
from engine._specs import Activity, Compensate, Flow, Scope, Sequence, Workflow
from engine._variables import Frame

__all__ = ["Completed", "ScopeFrame", "compensate", "default_fault_handler", "started_scopes", "terminate"]

log = logging.getLogger(__name__)


def started_scopes(act: Activity) -> list[Scope]:
    """Scopes that have started the moment ``act`` starts, innermost first."""
    if act.targets:
        return []  # waiting for its links: nothing started
    if isinstance(act, Scope):
        inner = started_scopes(act.body) if act.body is not None else []
        return [*inner, act]
    if isinstance(act, Sequence):
        return started_scopes(act.body[0]) if act.body else []
    if isinstance(act, Flow):
        return [s for child in act.body for s in started_scopes(child)]
    return []


_DEFAULT = Compensate(aid=-1, line=0, name=None)


# -- compensate / compensateScope ---------------------------------------------------
def compensate(it: Interpreter, wf: Workflow, act: Compensate, cohort: list[Instance]) -> None:
    work: list[tuple[Instance, list[Completed]]] = []
    for inst in cohort:
        frame = inst.scopes[-1]
        chosen = [c for c in frame.completed if act.target is None or c.spec.name == act.target]
        if chosen:
            frame.completed = [c for c in frame.completed if c not in chosen]
            work.append((inst, list(reversed(chosen))))
    _compensate_each(it, wf, work)


def _compensate_each(it: Interpreter, wf: Workflow, work: list[tuple[Instance, list[Completed]]]) -> None:
    """Run each instance's compensations in order; one cohort per scope per round."""
    queues = [(inst, list(items)) for inst, items in work]
    while True:
        round_: dict[int, list[tuple[Instance, Completed]]] = {}
        for inst, items in queues:
            if items and inst.running:
                done = items.pop(0)
                round_.setdefault(done.spec.aid, []).append((inst, done))
        if not round_:
            return
        for _, group in sorted(round_.items()):
            _compensation_handler(it, wf, group)


def _compensation_handler(it: Interpreter, wf: Workflow, group: list[tuple[Instance, Completed]]) -> None:
    spec = group[0][1].spec
    saved = [(inst, inst.ids, inst.frame, inst.scopes) for inst, _ in group]
    for inst, done in group:
        inst.ids = list(done.ids)
        inst.frame = done.frame
        inst.scopes = [*inst.scopes, ScopeFrame(spec, list(done.children))]
    insts = [inst for inst, _ in group]
    log.debug("compensating %s for %d instance(s)", spec.label(), len(insts))
    if spec.compensation is not None:
        it.step(wf, spec.compensation, insts)
    else:
        compensate(it, wf, _DEFAULT, insts)
    for inst, ids, frame, scopes in saved:
        inst.ids, inst.frame, inst.scopes = ids, frame, scopes


def default_fault_handler(it: Interpreter, wf: Workflow, faulted: list[Instance]) -> None:
    """Compensate the top frame's completed scopes of faulted instances; the fault stays."""
    pending = [i for i in faulted if i.scopes[-1].completed]
    if not pending:
        return
    with _running(pending) as restore:
        compensate(it, wf, _DEFAULT, pending)
        restore(keep_new_faults=True)


# -- termination -------------------------------------------------------------------
def terminate(it: Interpreter, wf: Workflow, act: Activity, cohort: list[Instance],
              frame_for: Callable[[Instance], Frame | None] | None = None) -> None:
    """Terminate the scopes ``act`` would have started (its branch never ran here)."""
    insts = [i for i in cohort if i.state is State.RUNNING or i.state is State.FAULTED]
    if not insts:
        return
    for scope in started_scopes(act):
        saved = [(inst, inst.frame, inst.scopes) for inst in insts]
        for inst in insts:
            base = frame_for(inst) if frame_for is not None else inst.frame
            inst.frame = Frame(scope.variables, base) if scope.variables else base
            inst.scopes = [*inst.scopes, ScopeFrame(scope)]
        with _running(insts) as restore:
            if scope.termination is not None:
                log.debug("terminating %s for %d instance(s)", scope.label(), len(insts))
                it.step(wf, scope.termination, insts)
            restore(keep_new_faults=False)
        for inst, frame, scopes in saved:
            inst.frame, inst.scopes = frame, scopes


class _running:
    """Run handlers for instances that may be faulted: they run as RUNNING, then get their state back.

    ``restore(keep_new_faults=True)``: a fault raised meanwhile replaces the
    old one (compensation in a default fault handler); False: it is dropped
    and logged (termination handlers).  A tainted instance stays tainted.
    """

    def __init__(self, insts: list[Instance]) -> None:
        self.insts = insts
        self.before: list[tuple[Any, WorkflowFault | None]] = []

    def __enter__(self) -> Callable[..., None]:
        self.before = [(i.state, i.fault) for i in self.insts]
        for inst in self.insts:
            if inst.state is State.FAULTED:
                inst.state, inst.fault = State.RUNNING, None
        return self.restore

    def restore(self, keep_new_faults: bool) -> None:
        for inst, (state, fault) in zip(self.insts, self.before, strict=True):
            if inst.state is State.TAINTED:
                continue
            if inst.state is State.FAULTED and keep_new_faults:
                continue
            if inst.state is State.FAULTED:
                log.warning("instance %s: fault in a termination handler ignored: %s", inst.key, inst.fault)
            inst.state, inst.fault = state, fault
        self.before = []

    def __exit__(self, *exc: object) -> None:
        if self.before:  # restore was not called (an exception): put states back as they were
            self.restore(keep_new_faults=False)
