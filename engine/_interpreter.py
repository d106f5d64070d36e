"""The interpreter: runs a workflow over many instances at once.

Theory of operation.  An *instance* is one message's records.  The
interpreter walks the activity tree once for a whole cohort of instances and
keeps each instance's state (its current record IDs, link statuses, fault,
exit) in :class:`~engine._instances.Instance`.  Control flow splits the
cohort (an ``if`` runs each branch for the instances that chose it; a
``while`` runs its body for those whose condition still holds), so every
``invokePipelet`` is reached once per cohort and calls its pipelet **once**
with every ID of every instance that got there.  Results map back to
instances by record: an ID that was an input of instance *i*, or a fragment
whose parent chain leads to one, belongs to *i*.

A batched pipelet call that raises cannot say whose records it already
changed, so instances in that call are *tainted*: the caller reruns them from
their original records (see ``_worker``).  When the exception is a
``PipeletError`` naming a record, that record's instance faults in place
(``pipeletError``, catchable) -- running alone it would have failed the same
way at the same record -- and only the others are rerun.

``flow`` branches run one after the other in an order that respects links
(a legal BPEL serialization); a link not (yet) set reads as false, which is
dead-path elimination in that order.

What runs each kind of activity is a table of plain functions,
``engine._activities.RUNNERS`` (the parser's ``PARSERS`` table's twin), each
``step(interpreter, workflow, activity, cohort)``.  The interpreter is given
the table and knows none of them; :meth:`Interpreter.step` does what every
activity shares: join its incoming links, look its function up, set its
outgoing links.  The table is module data, never an interpreter's own bound
methods: those would make every interpreter a reference cycle (itself, the
table, its methods), and with it its blackboard and every record on it,
which only the cyclic collector frees (a service runs with it off most of
the time).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lxml import etree

from engine import _conditions, _variables
from engine._errors import WorkflowFault
from engine._instances import Instance, State
from engine._specs import Activity, Condition, InvokePipelet, InvokeService, Workflow, walk

__all__ = ["Instance", "Interpreter", "PipeletFactory", "ServiceFactory", "State", "Step"]

PipeletFactory = Callable[[Workflow, InvokePipelet], Any]
ServiceFactory = Callable[[Workflow, InvokeService], Any]


class Interpreter:
    """Runs activities of ``workflow`` for cohorts of instances on ``blackboard``.

    ``steps`` maps each activity class to the function that runs it (see the
    module docstring); ``pipelet_for``/``service_for`` make the configured
    pipelet or service of an activity.
    """

    __slots__ = ("_loop_links", "bb", "pipelet_for", "service_for", "steps", "workflow")

    def __init__(self, blackboard: Any, workflow: Workflow, pipelet_for: PipeletFactory,
                 service_for: ServiceFactory | None = None, *,
                 steps: Mapping[type[Activity], Step]) -> None:
        self.bb = blackboard
        self.workflow = workflow
        self.pipelet_for = pipelet_for
        self.service_for = service_for
        self.steps = steps
        self._loop_links: dict[int, frozenset[str]] = {}

    def step(self, wf: Workflow, act: Activity, cohort: list[Instance]) -> None:
        """Run ``act`` for the instances of ``cohort`` still running (its links joined and set)."""
        cohort = [i for i in cohort if i.running]
        if not cohort:
            return
        if act.targets:
            cohort = self._join(act, cohort)
            if not cohort:
                return
        self.steps[type(act)](self, wf, act, cohort)
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
                ok = self.test(act.join_condition, inst, statuses)
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

    @staticmethod
    def _dead_path(act: Activity, inst: Instance) -> None:
        for a in walk(act):
            for s in a.sources:
                inst.links[s.link] = False

    def _set_sources(self, act: Activity, inst: Instance) -> None:
        for s in act.sources:
            status = True if s.condition is None else self.test(s.condition, inst)
            if not inst.running:
                return
            inst.links[s.link] = status

    def clear_loop_links(self, loop: Activity, cohort: list[Instance]) -> None:
        """Forget the links set inside ``loop`` (before each of its iterations)."""
        names = self._loop_links.get(loop.aid)
        if names is None:
            names = frozenset(s.link for a in walk(loop) for s in a.sources)
            self._loop_links[loop.aid] = names
        if names:
            for inst in cohort:
                for n in names:
                    inst.links.pop(n, None)

    # -- conditions ---------------------------------------------------------------
    def documents(self, inst: Instance) -> list[dict[str, Any]]:
        """The documents of the instance's records (what conditions and copies read)."""
        return [self.bb.document(rid) for rid in inst.ids if rid in self.bb]

    def test(self, cond: Condition, inst: Instance, extra: dict[str, Any] | None = None) -> bool:
        """``cond`` for ``inst``; a condition that fails faults the instance (and is false)."""
        try:
            compiled = _conditions.compiled(cond)
            if compiled.bound and inst.frame is not None:
                names = compiled.bound - set(extra or ())
                extra = {**_variables.bindings(inst.frame, names, f"{self.workflow.path}:{cond.line}"),
                         **(extra or {})}
            return compiled.test(self.documents(inst), extra)
        except WorkflowFault as f:
            inst.fail(f)
            return False
        except (etree.XPathError, ValueError, TypeError) as e:
            inst.fail(WorkflowFault(
                "conditionError",
                f"{self.workflow.path}:{cond.line}: condition {cond.expression.strip()!r} failed: {e}"))
            return False


#: What runs one kind of activity for a cohort: ``step(interpreter, workflow, activity, cohort)``.
Step = Callable[[Interpreter, Workflow, Any, list[Instance]], None]
