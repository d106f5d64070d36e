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

Decisions are per record.  A condition that names ``$record`` is decided for
each record of an instance (:meth:`Interpreter.verdicts`, ``$record`` that
record, ``$records`` all of the instance's); one that does not is decided
once.  Where the records disagree, the construct splits the instance into
parts and rejoins them after it (``engine._instances.Splits``).  With one
record, or when they agree, it is one answer and nothing is split.  A link
whose transition condition holds for some records only holds for those (a
frozenset of their IDs); an activity it leads to runs for the records whose
join holds, the others take the dead path, and the instance is whole again
after the activity.

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
from engine._instances import Instance, Splits, State
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
        running = State.RUNNING
        cohort = [i for i in cohort if i.state is running]
        if not cohort:
            return
        splits = None
        if act.targets:
            cohort, splits = self._join(act, cohort)
            if not cohort:
                return
        self.steps[type(act)](self, wf, act, cohort)
        if act.sources:
            for inst in cohort:
                if inst.running:
                    self._set_sources(act, inst)
        if splits is not None:
            splits.rejoin()

    # -- links ------------------------------------------------------------------
    def _join(self, act: Activity, cohort: list[Instance]) -> tuple[list[Instance], Splits | None]:
        go: list[Instance] = []
        splits: Splits | None = None
        for inst in cohort:
            statuses = {name: inst.links.get(name, False) for name in act.targets}
            ok = self._joins(act, inst, statuses)
            if ok is None:
                continue
            if not isinstance(ok, bool):  # the records whose join holds run it, the others take the dead path
                splits = splits or Splits()
                ids = [[rid for rid, k in zip(inst.ids, ok, strict=True) if k],
                       [rid for rid, k in zip(inst.ids, ok, strict=True) if not k]]
                yes, no = splits.parts(inst, ids)
                self._dead_path(act, no)
                go.append(yes)
            elif ok:
                go.append(inst)
            elif act.suppress_join_failure:
                self._dead_path(act, inst)
            else:
                inst.fail(WorkflowFault(
                    "joinFailure",
                    f"{self.workflow.path}:{act.line}: {act.label()}: join condition is false "
                    f"(links: {statuses}); set suppressJoinFailure=\"yes\" to skip it instead"))
        return go, splits

    def _joins(self, act: Activity, inst: Instance, statuses: dict[str, Any]) -> bool | list[bool] | None:
        """Whether ``act``'s join holds for ``inst``: once, or per record when a link holds for
        some records only and they disagree (a join failure of some faults the whole); None: faulted."""
        if not any(isinstance(v, frozenset) for v in statuses.values()):
            return self._join_holds(act, inst, statuses)
        answers: list[bool] = []
        for rid in inst.ids:
            ok = self._join_holds(act, inst, {n: self._holds(v, rid) for n, v in statuses.items()})
            if ok is None:
                return None
            answers.append(ok)
        if all(answers) or not any(answers) or not act.suppress_join_failure:
            return all(answers)
        return answers

    def _join_holds(self, act: Activity, inst: Instance, statuses: dict[str, Any]) -> bool | None:
        if act.join_condition is None:
            return any(statuses.values())
        ok = self.test(act.join_condition, inst, statuses)
        return ok if inst.running else None

    def _holds(self, status: Any, rid: str) -> bool:
        """A link's status for one record (a fragment made since: its parent's)."""
        if not isinstance(status, frozenset):
            return bool(status)
        for _ in range(64):
            if rid in status:
                return True
            parent = self.bb.document(rid).get("parent") if rid in self.bb else None
            if parent is None:
                return False
            rid = parent
        return False

    @staticmethod
    def _dead_path(act: Activity, inst: Instance) -> None:
        for a in walk(act):
            for s in a.sources:
                inst.links[s.link] = False

    def _set_sources(self, act: Activity, inst: Instance) -> None:
        for s in act.sources:
            status: Any = True if s.condition is None else self.verdicts(s.condition, inst)
            if not inst.running:
                return
            if not isinstance(status, bool):  # holds for some records only
                status = frozenset(rid for rid, ok in zip(inst.ids, status, strict=True) if ok)
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

    def record_documents(self, inst: Instance) -> list[dict[str, Any]]:
        """One document per record of the instance, in order (a record not here: just its ID)."""
        bb = self.bb
        return [bb.document(rid) if rid in bb else {"id": rid, "meta": {}} for rid in inst.ids]

    def test(self, cond: Condition, inst: Instance, extra: dict[str, Any] | None = None) -> bool:
        """``cond`` once for ``inst`` (``$record`` its first record); a condition that fails
        faults the instance (and is false)."""
        try:
            compiled = _conditions.compiled(cond)
            if compiled.bound and inst.frame is not None:
                extra = self._bindings(compiled, cond, inst, extra)
            return compiled.test(self.documents(inst), extra)
        except (WorkflowFault, etree.XPathError, ValueError, TypeError) as e:
            self._failed(cond, inst, e)
            return False

    def verdicts(self, cond: Condition, inst: Instance, among: list[int] | None = None) -> bool | list[bool]:
        """``cond`` for each record of ``inst`` when it names ``$record``, else once.

        One answer when the records agree (those at the positions ``among``,
        if given), else one per record, in order.  A one-record instance
        costs what :meth:`test` does.
        """
        if len(inst.ids) < 2:
            return self.test(cond, inst)
        try:
            compiled = _conditions.compiled(cond)
            if not compiled.per_record:
                return self.test(cond, inst)
            extra = self._bindings(compiled, cond, inst, None) if compiled.bound and inst.frame is not None \
                else None
            answers = compiled.test_each(self.record_documents(inst), extra)
        except (WorkflowFault, etree.XPathError, ValueError, TypeError) as e:
            self._failed(cond, inst, e)
            return False
        chosen = answers if among is None else [answers[p] for p in among]
        if all(chosen):
            return True
        if not any(chosen):
            return False
        return answers

    def _bindings(self, compiled: Any, cond: Condition, inst: Instance, extra: dict[str, Any] | None
                  ) -> dict[str, Any]:
        names = compiled.bound - set(extra or ())
        return {**_variables.bindings(inst.frame, names, f"{self.workflow.path}:{cond.line}"), **(extra or {})}

    def _failed(self, cond: Condition, inst: Instance, e: Exception) -> None:
        if isinstance(e, WorkflowFault):
            inst.fail(e)
        else:
            inst.fail(WorkflowFault(
                "conditionError",
                f"{self.workflow.path}:{cond.line}: condition {cond.expression.strip()!r} failed: {e}"))


#: What runs one kind of activity for a cohort: ``step(interpreter, workflow, activity, cohort)``.
Step = Callable[[Interpreter, Workflow, Any, list[Instance]], None]
