"""The interpreter: runs a workflow over many instances at once.

Theory of operation.  An *instance* is one message's records.  The
interpreter walks the activity tree once for a whole cohort of instances and
keeps each instance's state (its current record IDs, link statuses, fault,
exit) in :class:`Instance`.  Control flow splits the cohort (an ``if`` runs
each branch for the instances that chose it; a ``while`` runs its body for
those whose condition still holds), so every ``invokePipelet`` is reached
once per cohort and calls its pipelet **once** with every ID of every
instance that got there.  Results map back to instances by record: an ID that
was an input of instance *i*, or a fragment whose parent chain leads to one,
belongs to *i*.

States (a table, not scattered flags)::

    RUNNING --fault--> FAULTED --caught by a scope--> RUNNING
    RUNNING --exit---> EXITED            (done, success)
    RUNNING --end----> COMPLETED         (done, success)
    RUNNING --batched pipelet call raised--> TAINTED (rerun by the caller)

A batched pipelet call that raises cannot say whose records it already
changed, so instances in that call are *tainted*: the caller reruns them from
their original records (see ``_worker``).  When the exception is a
``PipeletError`` naming a record, that record's instance faults in place
(``pipeletError``, catchable) -- running alone it would have failed the same
way at the same record -- and only the others are rerun.

``flow`` branches run one after the other in an order that respects links
(a legal BPEL serialization); a link not (yet) set reads as false, which is
dead-path elimination in that order.

Each instance also carries its BPEL variables (``frame``, see
``engine._variables``) and the scopes it is inside (``scopes``, for
compensation, see ``engine._compensation``); ``forEach`` is in
``engine._loops`` and ``assign`` in ``engine._assign``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from engine import _conditions, _variables
from engine._assign import AssignMixin
from engine._compensation import CompensationMixin, Completed, ScopeFrame
from engine._errors import WorkflowFault
from engine._loops import LoopMixin
from engine._specs import (
    Activity,
    Assign,
    Compensate,
    Condition,
    Empty,
    Exit,
    Flow,
    ForEach,
    If,
    InvokePipelet,
    InvokeService,
    InvokeWorkflow,
    RepeatUntil,
    Rethrow,
    Scope,
    Sequence,
    Throw,
    Variable,
    While,
    Workflow,
    walk,
)

__all__ = ["Instance", "Interpreter", "State"]

log = logging.getLogger(__name__)


class State(enum.Enum):
    RUNNING = "running"
    FAULTED = "faulted"
    EXITED = "exited"
    COMPLETED = "completed"
    TAINTED = "tainted"


_DONE_OK = {State.EXITED, State.COMPLETED}


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
    frame: _variables.Frame | None = None  # BPEL variables
    scopes: list[ScopeFrame] = field(default_factory=list)  # scopes it is inside (the process first)
    scope_ok: bool | None = None  # how the last scope it ran ended: normally, or by its fault handler

    @property
    def running(self) -> bool:
        return self.state is State.RUNNING

    @property
    def ok(self) -> bool:
        return self.state in _DONE_OK

    def fail(self, fault: WorkflowFault) -> None:
        self.state = State.FAULTED
        self.fault = fault


PipeletFactory = Callable[[Workflow, InvokePipelet], Any]
ServiceFactory = Callable[[Workflow, InvokeService], Any]


def _pipelet_record_id(exc: BaseException) -> str | None:
    rid = getattr(exc, "record_id", None)
    return rid if isinstance(rid, str) else None


class Interpreter(CompensationMixin, LoopMixin, AssignMixin):
    """Runs ``workflow`` over cohorts of instances on ``blackboard``."""

    def __init__(self, blackboard: Any, workflow: Workflow, pipelet_for: PipeletFactory,
                 service_for: ServiceFactory | None = None) -> None:
        self.bb = blackboard
        self.workflow = workflow
        self.pipelet_for = pipelet_for
        self.service_for = service_for
        self._loop_links: dict[int, frozenset[str]] = {}

    # -- entry ------------------------------------------------------------------
    def run(self, instances: list[Instance]) -> list[Instance]:
        """Run the workflow for ``instances``; on return none is RUNNING."""
        self._process(self.workflow, instances)
        for inst in instances:
            if inst.running:
                inst.state = State.COMPLETED
        return instances

    def _process(self, wf: Workflow, cohort: list[Instance]) -> None:
        """A process (or sub-workflow) as the implicit scope of its instances."""
        saved = [(inst, inst.frame, inst.scopes) for inst in cohort]
        for inst in cohort:
            inst.frame = _variables.Frame(wf.variables)
            inst.scopes = [*inst.scopes, ScopeFrame(None)]
        self._initialize(wf, wf.variables, cohort)
        self._run(wf, wf.body, cohort)
        self._default_fault_handler(wf, [i for i in cohort if i.state is State.FAULTED])
        for inst, frame, scopes in saved:
            inst.frame, inst.scopes = frame, scopes

    def _initialize(self, wf: Workflow, variables: tuple[Variable, ...], cohort: list[Instance]) -> None:
        """Inline ``<from>`` initializers of ``variables`` (just declared in each instance's frame)."""
        for var in variables:
            if var.init is None:
                continue
            where = f"{wf.path}:{var.line}: variable {var.name!r}"
            for inst in cohort:
                if not inst.running:
                    continue
                try:
                    value = _variables.read_source(var.init, inst.frame, self._documents(inst), where)
                    _variables.write_target(("variable", (var.name, None, None)), value, inst.frame,
                                            [], False, where)
                except WorkflowFault as f:
                    inst.fail(f)

    def _run(self, wf: Workflow, act: Activity, cohort: list[Instance]) -> None:
        cohort = [i for i in cohort if i.running]
        if not cohort:
            return
        if act.targets:
            cohort = self._join(act, cohort)
            if not cohort:
                return
        _RUNNERS[type(act)](self, wf, act, cohort)
        if act.sources:
            for inst in cohort:
                if inst.running:
                    self._set_sources(act, inst)

    # -- links ------------------------------------------------------------------
    def _join(self, act: Activity, cohort: list[Instance]) -> list[Instance]:
        go: list[Instance] = []
        for inst in cohort:
            statuses = {name: inst.links.get(name, False) for name in act.targets}
            if act.join_condition is None:
                ok = any(statuses.values())
            else:
                ok = self._test(act.join_condition, inst, statuses)
                if not inst.running:
                    continue
            if ok:
                go.append(inst)
            elif act.suppress_join_failure:
                self._dead_path(act, inst)
            else:
                inst.fail(WorkflowFault(
                    "joinFailure",
                    f"{self.workflow.path}:{act.line}: {act.label()}: join condition is false "
                    f"(links: {statuses}); set suppressJoinFailure=\"yes\" to skip it instead"))
        return go

    def _dead_path(self, act: Activity, inst: Instance) -> None:
        for a in walk(act):
            for s in a.sources:
                inst.links[s.link] = False

    def _set_sources(self, act: Activity, inst: Instance) -> None:
        for s in act.sources:
            status = True if s.condition is None else self._test(s.condition, inst)
            if not inst.running:
                return
            inst.links[s.link] = status

    def _clear_loop_links(self, loop: Activity, cohort: list[Instance]) -> None:
        names = self._loop_links.get(loop.aid)
        if names is None:
            names = frozenset(s.link for a in walk(loop) for s in a.sources)
            self._loop_links[loop.aid] = names
        if names:
            for inst in cohort:
                for n in names:
                    inst.links.pop(n, None)

    # -- conditions ---------------------------------------------------------------
    def _documents(self, inst: Instance) -> list[dict[str, Any]]:
        return [self.bb.document(rid) for rid in inst.ids if rid in self.bb]

    def _test(self, cond: Condition, inst: Instance, extra: dict[str, Any] | None = None) -> bool:
        try:
            compiled = _conditions.compiled(cond)
            if compiled.bound and inst.frame is not None:
                names = compiled.bound - set(extra or ())
                extra = {**_variables.bindings(inst.frame, names, f"{self.workflow.path}:{cond.line}"),
                         **(extra or {})}
            return compiled.test(self._documents(inst), extra)
        except WorkflowFault as f:
            inst.fail(f)
            return False
        except (etree.XPathError, ValueError, TypeError) as e:
            inst.fail(WorkflowFault(
                "conditionError",
                f"{self.workflow.path}:{cond.line}: condition {cond.expression.strip()!r} failed: {e}"))
            return False

    # -- structured activities ---------------------------------------------------
    def _sequence(self, wf: Workflow, act: Sequence, cohort: list[Instance]) -> None:
        for child in act.body:
            self._run(wf, child, cohort)

    def _flow(self, wf: Workflow, act: Flow, cohort: list[Instance]) -> None:
        for position, index in enumerate(act.order):
            before = [i for i in cohort if i.running]
            self._run(wf, act.body[index], cohort)
            faulted = [i for i in before if i.state is State.FAULTED]
            if faulted:  # the branches not run yet were running, in BPEL's terms: terminate them
                for later in act.order[position + 1:]:
                    self._terminate(wf, act.body[later], faulted)

    def _if(self, wf: Workflow, act: If, cohort: list[Instance]) -> None:
        remaining = cohort
        for cond, branch in act.branches:
            taken = [i for i in remaining if self._test(cond, i)]
            chosen = {id(i) for i in taken}
            remaining = [i for i in remaining if i.running and id(i) not in chosen]
            self._run(wf, branch, taken)
        if act.otherwise is not None:
            self._run(wf, act.otherwise, remaining)

    def _while(self, wf: Workflow, act: While, cohort: list[Instance]) -> None:
        assert act.condition is not None and act.body is not None
        active = cohort
        while active:
            active = [i for i in active if i.running and self._test(act.condition, i)]
            if not active:
                return
            self._clear_loop_links(act.body, active)
            self._run(wf, act.body, active)

    def _repeat_until(self, wf: Workflow, act: RepeatUntil, cohort: list[Instance]) -> None:
        assert act.condition is not None and act.body is not None
        active = cohort
        while active:
            self._clear_loop_links(act.body, active)
            self._run(wf, act.body, active)
            active = [i for i in active if i.running and not self._test(act.condition, i)]

    def _scope(self, wf: Workflow, act: Scope, cohort: list[Instance]) -> None:
        saved = {id(inst): inst.frame for inst in cohort}
        for inst in cohort:
            inst.scopes.append(ScopeFrame(act))
            if act.variables:
                inst.frame = _variables.Frame(act.variables, inst.frame)
        if act.variables:
            self._initialize(wf, act.variables, cohort)
        if act.body is not None:
            self._run(wf, act.body, cohort)
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
        self._default_fault_handler(wf, unhandled)
        for index, insts in sorted(groups.items()):
            for inst in insts:
                assert inst.fault is not None
                inst.handling.append(inst.fault)
                inst.state, inst.fault = State.RUNNING, None
                log.debug("instance %s: fault caught by %s", inst.key, act.label())
            self._run(wf, act.handlers[index].activity, insts)
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

    # -- basic activities ------------------------------------------------------------
    def _throw(self, wf: Workflow, act: Throw, cohort: list[Instance]) -> None:
        for inst in cohort:
            inst.fail(WorkflowFault(act.fault_name, f"thrown at {wf.path}:{act.line}"))

    def _rethrow(self, wf: Workflow, act: Rethrow, cohort: list[Instance]) -> None:
        for inst in cohort:
            fault = inst.handling[-1] if inst.handling else WorkflowFault("rethrow", "nothing to rethrow")
            inst.fail(fault)

    def _exit(self, wf: Workflow, act: Exit, cohort: list[Instance]) -> None:
        for inst in cohort:
            inst.state = State.EXITED

    def _invoke_workflow(self, wf: Workflow, act: InvokeWorkflow, cohort: list[Instance]) -> None:
        try:
            sub = wf.subworkflow(act.workflow)
        except KeyError:
            for inst in cohort:
                inst.fail(WorkflowFault(
                    "invalidWorkflow", f"{wf.path}:{act.line}: sub-workflow {act.workflow!r} is not attached"))
            return
        running = [i for i in cohort if i.running]
        self._process(sub, running)
        for inst in running:
            if inst.state is State.EXITED:  # <exit> ends the invoked process; the invoker goes on
                inst.state = State.RUNNING

    def _invoke_service(self, wf: Workflow, act: InvokeService, cohort: list[Instance]) -> None:
        """BPEL ``invoke`` of a partner service: once per instance, variables in and out."""
        where = f"{wf.path}:{act.line}: {act.label()}"
        try:
            assert self.service_for is not None, "no service factory"
            service = self.service_for(wf, act)
        except Exception as e:
            for inst in cohort:
                inst.fail(WorkflowFault("serviceError", f"{where}: cannot make the service: {type(e).__name__}: {e}"))
            return
        for inst in cohort:
            frame = inst.frame
            assert frame is not None
            try:
                parts = frame.copy_parts(act.input_variable) if act.input_variable else {}
                reply = service.invoke(act.operation, parts)
                if act.output_variable is not None:
                    _store_reply(frame, act.output_variable, reply if reply is not None else {}, where)
            except WorkflowFault as f:
                inst.fail(f)
            except Exception as e:
                inst.fail(WorkflowFault("serviceError", f"{where}: {type(e).__name__}: {e}"))

    # -- pipelets ---------------------------------------------------------------------
    def _invoke_pipelet(self, wf: Workflow, act: InvokePipelet, cohort: list[Instance]) -> None:
        all_ids = [rid for inst in cohort for rid in inst.ids]
        if not all_ids:
            return
        where = f"{wf.path}:{act.line}: {act.label()}"
        try:
            pipelet = self.pipelet_for(wf, act)
        except Exception as e:
            for inst in cohort:
                inst.fail(WorkflowFault("pipeletError", f"{where}: cannot make the pipelet: {type(e).__name__}: {e}"))
            return
        try:
            result = pipelet.process(self.bb, list(all_ids))
        except Exception as e:
            self._pipelet_failed(where, cohort, e)
            return
        if result is not None and result == all_ids:  # the common case: same records, same order
            return
        try:
            self._map_back(cohort, list(result or []))
        except ValueError as e:
            self._pipelet_failed(where, cohort, e)

    def _pipelet_failed(self, where: str, cohort: list[Instance], exc: Exception) -> None:
        message = f"{where}: {type(exc).__name__}: {exc}"
        if len(cohort) == 1:
            cohort[0].fail(WorkflowFault("pipeletError", message))
            return
        culprit: Instance | None = None
        rid = _pipelet_record_id(exc)
        if rid is not None:
            culprit = next((i for i in cohort if rid in i.ids), None)
        for inst in cohort:
            if inst is culprit:
                inst.fail(WorkflowFault("pipeletError", message))
            else:
                root = inst
                while root.parent is not None:
                    root = root.parent
                inst.state = root.state = State.TAINTED
                inst.taint = root.taint = message
        log.info("%s failed in a batched call of %d instances; rerunning the others", where, len(cohort))

    def _map_back(self, cohort: list[Instance], result: Iterable[str]) -> None:
        owner: dict[str, Instance] = {}
        for inst in cohort:
            for rid in inst.ids:
                owner.setdefault(rid, inst)
        out: dict[int, list[str]] = {id(i): [] for i in cohort}
        by_key: dict[Any, list[Instance]] = {}
        for inst in cohort:
            by_key.setdefault(inst.key, []).append(inst)
        for rid in result:
            found: Instance | None = owner.get(rid)
            if found is None:
                found = self._owner_by_parent(rid, owner)
            if found is None:
                same = by_key.get(self.bb.instance_of(rid)) if rid in self.bb else None
                if same and len(same) == 1:
                    found = same[0]
                elif len(cohort) == 1:
                    found = cohort[0]
            if found is None:
                raise ValueError(f"returned record {rid!r}, which belongs to none of the instances it was given")
            out[id(found)].append(rid)
        for inst in cohort:
            inst.ids = out[id(inst)]

    def _owner_by_parent(self, rid: str, owner: dict[str, Instance]) -> Instance | None:
        seen = 0
        current: str | None = rid
        while current is not None and current in self.bb and seen < 64:
            parent = self.bb.document(current).get("parent")
            if parent in owner:
                return owner[parent]
            current = parent
            seen += 1
        return None


def _store_reply(frame: _variables.Frame, name: str, reply: Any, where: str) -> None:
    """A message service's answer (part -> element or text) into the output variable."""
    if not isinstance(reply, dict):
        raise WorkflowFault("serviceError", f"{where}: the service returned {type(reply).__name__}, "
                            "not a mapping of part names to values")
    kind = frame.kind(name)
    for part, value in reply.items():
        target = ("variable", (name, part if kind == "message" else None, None))
        _variables.write_target(target, value, frame, [], False, where)


def _empty(_self: Interpreter, _wf: Workflow, _act: Any, _cohort: list[Instance]) -> None:
    return None


# Activity class -> what runs it.  A table of the class's functions, not of an object's bound
# methods: those would make every interpreter a reference cycle (itself, the table, its
# methods), and with it its blackboard and every record on it, which only the cyclic
# collector frees (a service runs with it off most of the time).
_RUNNERS: dict[type, Callable[[Interpreter, Workflow, Any, list[Instance]], None]] = {
    Sequence: Interpreter._sequence,
    Flow: Interpreter._flow,
    If: Interpreter._if,
    While: Interpreter._while,
    RepeatUntil: Interpreter._repeat_until,
    ForEach: Interpreter._for_each,
    Scope: Interpreter._scope,
    Throw: Interpreter._throw,
    Rethrow: Interpreter._rethrow,
    Exit: Interpreter._exit,
    Empty: _empty,
    Assign: Interpreter._assign,
    InvokePipelet: Interpreter._invoke_pipelet,
    InvokeService: Interpreter._invoke_service,
    InvokeWorkflow: Interpreter._invoke_workflow,
    Compensate: Interpreter._compensate,
}
