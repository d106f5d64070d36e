"""Structured activities: ``sequence``, ``flow``, ``if`` and ``scope``, and a process as a scope.

Each splits or orders the cohort and runs its children through
:meth:`Interpreter.step <engine._interpreter.Interpreter.step>`.  ``if``
decides per record: an instance whose records choose different branches
runs each branch as a part, whole again after the ``if``.  ``flow``
runs its branches one after the other in the order the checker fixed (see
``engine._validate``); when one faults, the branches not run yet are
terminated.  A ``scope`` pushes its variables and a scope frame, catches its
instances' faults with its handlers (the default handler compensates and
keeps the fault) and, when it completed normally, installs its compensation
handler in the scope around it (see ``engine._compensation``).  A process
(or an invoked sub-workflow) is the implicit scope of its instances.
"""

from __future__ import annotations

import logging

from engine import _variables
from engine._compensation import default_fault_handler, terminate
from engine._errors import WorkflowFault
from engine._instances import Completed, Instance, ScopeFrame, Splits, State
from engine._interpreter import Interpreter
from engine._specs import Flow, If, Scope, Sequence, Variable, Workflow

__all__ = ["flow", "if_", "initialize", "process", "scope", "sequence"]

log = logging.getLogger(__name__)


def process(it: Interpreter, wf: Workflow, cohort: list[Instance]) -> None:
    """A process (or sub-workflow) as the implicit scope of its instances."""
    saved = [(inst, inst.frame, inst.scopes) for inst in cohort]
    # A frame that declares nothing is never written (assignments go to the frame that
    # declares the name): the instances of a process without variables share one.
    shared = None if wf.variables else _variables.Frame()
    for inst in cohort:
        inst.frame = shared or _variables.Frame(wf.variables)
        inst.scopes = [*inst.scopes, ScopeFrame(None)]
    initialize(it, wf, wf.variables, cohort)
    it.step(wf, wf.body, cohort)
    default_fault_handler(it, wf, [i for i in cohort if i.state is State.FAULTED])
    for inst, frame, scopes in saved:
        inst.frame, inst.scopes = frame, scopes


def initialize(it: Interpreter, wf: Workflow, variables: tuple[Variable, ...], cohort: list[Instance]) -> None:
    """Inline ``<from>`` initializers of ``variables`` (just declared in each instance's frame)."""
    for var in variables:
        if var.init is None:
            continue
        where = f"{wf.path}:{var.line}: variable {var.name!r}"
        for inst in cohort:
            if not inst.running:
                continue
            try:
                value = _variables.read_source(var.init, inst.frame, it.documents(inst), where)
                _variables.write_target(("variable", (var.name, None, None)), value, inst.frame,
                                        [], False, where)
            except WorkflowFault as f:
                inst.fail(f)


def sequence(it: Interpreter, wf: Workflow, act: Sequence, cohort: list[Instance]) -> None:
    for child in act.body:
        it.step(wf, child, cohort)


def flow(it: Interpreter, wf: Workflow, act: Flow, cohort: list[Instance]) -> None:
    for position, index in enumerate(act.order):
        before = [i for i in cohort if i.running]
        it.step(wf, act.body[index], cohort)
        faulted = [i for i in before if i.state is State.FAULTED]
        if faulted:  # the branches not run yet were running, in BPEL's terms: terminate them
            for later in act.order[position + 1:]:
                terminate(it, wf, act.body[later], faulted)


def if_(it: Interpreter, wf: Workflow, act: If, cohort: list[Instance]) -> None:
    """Each instance takes the first branch whose condition holds; decided per record, so an
    instance whose records choose different branches runs as one part per branch (all decided
    before any branch runs, the branches in document order), whole again after the ``if``."""
    arms: list[list[Instance]] = [[] for _ in range(len(act.branches) + 1)]  # the last: else
    splits: Splits | None = None
    for inst in cohort:
        choice = _choose(it, act, inst)
        if isinstance(choice, int):
            if choice >= 0:
                arms[choice].append(inst)
            continue
        groups: dict[int, list[str]] = {}
        for rid, arm in zip(inst.ids, choice, strict=True):
            groups.setdefault(arm, []).append(rid)
        splits = splits or Splits()
        for arm, part in zip(groups, splits.parts(inst, list(groups.values())), strict=True):
            arms[arm].append(part)
    branches = [branch for _, branch in act.branches] + [act.otherwise]
    for branch, taken in zip(branches, arms, strict=True):
        if branch is not None and taken:
            it.step(wf, branch, taken if splits is None else splits.going(taken))
    if splits is not None:
        splits.rejoin()


def _choose(it: Interpreter, act: If, inst: Instance) -> int | list[int]:
    """The branch ``inst`` takes (``len(branches)``: else; -1: it faulted), or each record's."""
    otherwise = len(act.branches)
    choice: list[int] | None = None
    undecided: list[int] = []
    for arm, (cond, _) in enumerate(act.branches):
        verdict = it.verdicts(cond, inst, undecided if choice is not None else None)
        if not inst.running:
            return -1
        if verdict is False:
            continue
        if verdict is True:
            if choice is None:
                return arm
            for position in undecided:
                choice[position] = arm
            return choice
        if choice is None:
            choice = [otherwise] * len(inst.ids)
            undecided = list(range(len(inst.ids)))
        for position in undecided:
            if verdict[position]:
                choice[position] = arm
        undecided = [p for p in undecided if not verdict[p]]
    return otherwise if choice is None else choice


def scope(it: Interpreter, wf: Workflow, act: Scope, cohort: list[Instance]) -> None:
    saved = {id(inst): inst.frame for inst in cohort}
    for inst in cohort:
        inst.scopes.append(ScopeFrame(act))
        if act.variables:
            inst.frame = _variables.Frame(act.variables, inst.frame)
    if act.variables:
        initialize(it, wf, act.variables, cohort)
    if act.body is not None:
        it.step(wf, act.body, cohort)
    groups: dict[int, list[Instance]] = {}
    unhandled: list[Instance] = []
    for inst in cohort:
        if inst.state is not State.FAULTED or inst.fault is None:
            continue
        for index, handler in enumerate(act.handlers):
            if handler.fault_name is None or handler.fault_name == inst.fault.name:
                groups.setdefault(index, []).append(inst)
                break
        else:
            unhandled.append(inst)
    handled = {id(i) for insts in groups.values() for i in insts}
    default_fault_handler(it, wf, unhandled)
    for index, insts in sorted(groups.items()):
        for inst in insts:
            assert inst.fault is not None
            inst.handling.append(inst.fault)
            inst.state, inst.fault = State.RUNNING, None
            log.debug("instance %s: fault caught by %s", inst.key, act.label())
        it.step(wf, act.handlers[index].activity, insts)
        for inst in insts:
            inst.handling.pop()
    for inst in cohort:
        frame = inst.scopes.pop()
        assert frame.spec is act
        if inst.running:
            inst.scope_ok = id(inst) not in handled
            if inst.scope_ok:  # completed normally: its compensation handler is installed
                inst.scopes[-1].completed.append(Completed(act, list(inst.ids), inst.frame, frame.completed))
        inst.frame = saved[id(inst)]
