"""Workflows that run as DataFrame transformations in the JVM.

When every pipelet of a workflow has a DataFrame form for its configuration
(``Pipelet.frame_io``/``transform``) and the workflow uses only ``sequence``,
``empty`` and ``if`` with a simple comparison (``$record/Val[@key='k'] =
'v'``, ``!=``, presence), the Spark runner does not ship records to Python
workers at all: the touched attributes become columns of a DataFrame, the
pipelets' forms and the ``if`` (each arm on its own rows, the arms unioned)
are one plan that Spark runs with generated code on every core, and only the
written columns come back.  :func:`frame_plan` decides once per workflow
version; :meth:`FramePlan.split` decides per record, sending to the frame
only single-record instances whose touched attributes are absent or hold
one plain portable string (``pipelets.frames``), so both paths compute the
same records.  (The interpreter decides per record too, so a row's arm is
the branch its record takes there; with one record ``$record``,
``$records`` and ``$request.records/rec:Record[1]`` are the same record.)
Everything else runs through the interpreter as before.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from engine._conditions import Comparison, comparison
from engine._pipelets import configured_pipelet
from engine._specs import Activity, Empty, If, InvokePipelet, Sequence, Workflow
from pipelets.frames import DECLINED, INT, STRING, column, portable

__all__ = ["ID_COLUMN", "FramePlan", "frame_plan"]

log = logging.getLogger(__name__)

ID_COLUMN = "_record_id"


class _Declined(Exception):
    pass


@dataclass(frozen=True)
class _Arm:
    test: Comparison | None  # None: the else arm
    key_type: str
    steps: tuple[Any, ...]


@dataclass(frozen=True)
class _IfStep:
    arms: tuple[_Arm, ...]


@dataclass(frozen=True)
class FramePlan:
    """A workflow compiled to DataFrame steps.

    ``columns`` are the attributes the frame carries (every one touched);
    ``types`` the column type of each attribute written, at the end;
    ``declines``: some step may decline rows (they run in the interpreter).
    """

    workflow: Workflow
    steps: tuple[Any, ...]
    columns: tuple[str, ...]
    types: tuple[tuple[str, str], ...]
    declines: bool = False

    def split(self, blackboard: Any, instances: list[tuple[int, list[str]]]) -> tuple[
            list[tuple[int, str, list[str | None]]], list[tuple[int, list[str]]]]:
        """``(frame rows, the rest)``: which instances the frame can carry exactly.

        A frame row is ``(index, record ID, original values of columns)``.
        """
        rows: list[tuple[int, str, list[str | None]]] = []
        rest: list[tuple[int, list[str]]] = []
        columns = self.columns
        uses = Counter(rid for _, ids in instances for rid in ids)
        twice = {rid for rid, n in uses.items() if n > 1}  # in two instances: the interpreter decides
        for index, ids in instances:
            values = None if twice and twice.intersection(ids) else _plain_values(blackboard, ids, columns)
            if values is None:
                rest.append((index, ids))
            else:
                rows.append((index, ids[0], values))
        return rows, rest

    def to_arrow(self, rows: list[tuple[int, str, list[str | None]]]) -> Any:
        import pyarrow as pa

        data = {ID_COLUMN: pa.array([r[1] for r in rows], pa.string())}
        for n, name in enumerate(self.columns):
            data[name] = pa.array([r[2][n] for r in rows], pa.string())
        if self.declines:
            data[DECLINED] = pa.repeat(pa.scalar(False), len(rows))
        return pa.table(data)

    def apply(self, frame: Any) -> Any:
        """``frame`` (from :meth:`to_arrow`) with the workflow's written columns computed."""
        frame = _run(self.workflow, self.steps, frame)
        return frame.select(column(ID_COLUMN), *(column(name) for name, _ in self.types),
                            *((column(DECLINED),) if self.declines else ()))

    def write_back(self, blackboard: Any, table: Any, rows: list[tuple[int, str, list[str | None]]]
                   ) -> set[str]:
        """Put the written columns of the job's ``table`` on the records; return the IDs
        of the records a step declined (left as they were, for the interpreter).

        What changed goes on with one ``set_attributes`` per record (the
        touched attributes hold no sub-objects, so replacing their values is
        what ``set_literals`` would do); an attribute left without values is
        removed.
        """
        originals = {rid: values for _, rid, values in rows}
        ids = table.column(ID_COLUMN).to_pylist()
        where = [self.columns.index(name) for name, _ in self.types]
        columns = [table.column(name).to_pylist() for name, _ in self.types]
        names = [name for name, _ in self.types]
        declined: set[str] = set()
        if self.declines:
            flags = table.column(DECLINED).to_pylist()
            declined = {rid for rid, flag in zip(ids, flags, strict=True) if flag}
        for row, rid in enumerate(ids):
            if rid in declined:
                continue
            old = originals[rid]
            changes: dict[str, Any] = {}
            for name, at, values in zip(names, where, columns, strict=True):
                new = values[row]
                before = old[at]
                if new == before and type(new) is type(before):
                    continue
                if new is None or new == []:
                    if before is not None:
                        blackboard.remove_attribute(rid, name)
                    continue
                changes[name] = new
            if changes:
                blackboard.set_attributes(rid, changes)
        return declined


def _plain_values(blackboard: Any, ids: list[str], columns: tuple[str, ...]) -> list[str | None] | None:
    """The record's values of ``columns`` when the frame can carry them exactly, else None."""
    if len(ids) != 1 or ids[0] not in blackboard:
        return None
    attrs = blackboard.document(ids[0])["meta"].get("attrs") or {}
    out: list[str | None] = []
    for name in columns:
        values = attrs.get(name)
        if not values:
            out.append(None)
            continue
        if len(values) != 1:
            return None
        value = values[0]
        if type(value) is not str or not portable(value):
            return None  # a number, a dict (typed literal, sub-object), or text Java reads otherwise
        out.append(value)
    return out


def frame_plan(workflow: Workflow) -> tuple[FramePlan | None, str]:
    """The workflow as a :class:`FramePlan`, or ``(None, why not)``."""
    compiler = _Compiler(workflow)
    types: dict[str, str] = {}
    if any(v.init is not None for v in workflow.variables):
        return None, "it initializes BPEL variables (which may fault)"
    try:
        steps, _ = compiler.block(workflow.body, types)
        if not steps:
            raise _Declined("it calls no pipelet")
        for reserved in (ID_COLUMN, DECLINED):
            if reserved in compiler.touched:
                raise _Declined(f"it uses an attribute named {reserved!r}")
    except _Declined as e:
        return None, str(e)
    written = tuple((name, types[name]) for name in sorted(compiler.written))
    return FramePlan(workflow, tuple(steps), tuple(sorted(compiler.touched)), written,
                     compiler.declines), ""


class _Compiler:
    def __init__(self, workflow: Workflow) -> None:
        self.workflow = workflow
        self.touched: set[str] = set()
        self.written: set[str] = set()
        self.declines = False

    def block(self, act: Activity, types: dict[str, str]) -> tuple[list[Any], set[str]]:
        """Steps for ``act`` and the attributes they write; ``types`` is updated."""
        if act.targets or act.sources or act.join_condition is not None:
            raise _Declined(f"{act.label()} at line {act.line} has links")
        if isinstance(act, Empty):
            return [], set()
        if isinstance(act, Sequence):
            steps: list[Any] = []
            writes: set[str] = set()
            for child in act.body:
                s, w = self.block(child, types)
                steps += s
                writes |= w
            return steps, writes
        if isinstance(act, InvokePipelet):
            return self.pipelet(act, types)
        if isinstance(act, If):
            return self.branch(act, types)
        raise _Declined(f"{act.label()} at line {act.line} has no DataFrame form")

    def pipelet(self, act: InvokePipelet, types: dict[str, str]) -> tuple[list[Any], set[str]]:
        try:
            pipelet = configured_pipelet(self.workflow, act)
        except Exception as e:  # reported when the interpreter makes it
            raise _Declined(f"{act.label()}: {e}") from None
        io = pipelet.frame_io() if hasattr(pipelet, "frame_io") else None
        if io is None:
            raise _Declined(f"{act.label()} at line {act.line} has no DataFrame form for its configuration")
        for name in io.reads:
            if types.get(name, STRING) != STRING:
                raise _Declined(f"{act.label()} reads {name!r}, a {types[name]} column here")
            self.touched.add(name)
        writes = set()
        for name, kind in io.writes:
            types[name] = kind
            writes.add(name)
        self.touched |= writes
        self.written |= writes
        self.declines |= io.declines
        return [act], writes

    def branch(self, act: If, types: dict[str, str]) -> tuple[list[Any], set[str]]:
        before = dict(types)
        arms: list[_Arm] = []
        ends: list[dict[str, str]] = []
        writes: set[str] = set()
        for cond, activity in act.branches:
            test = comparison(cond.expression, dict(cond.namespaces))
            if test is None:
                raise _Declined(f"the condition at line {cond.line} is not a simple comparison")
            key_type = before.get(test.key, STRING)
            if key_type not in (STRING, INT):
                raise _Declined(f"the condition at line {cond.line} tests a {key_type} column")
            self.touched.add(test.key)
            arm_types = dict(before)
            steps, w = self.block(activity, arm_types)
            arms.append(_Arm(test, key_type, tuple(steps)))
            ends.append(arm_types)
            writes |= w
        arm_types = dict(before)
        steps, w = self.block(act.otherwise, arm_types) if act.otherwise is not None else ([], set())
        arms.append(_Arm(None, STRING, tuple(steps)))
        ends.append(arm_types)
        writes |= w
        for name in writes:
            kinds = {end.get(name, STRING) for end in ends}
            if len(kinds) > 1:
                raise _Declined(f"the arms of {act.label()} at line {act.line} leave {name!r} "
                                f"as different types ({', '.join(sorted(kinds))})")
            types[name] = kinds.pop()
        return [_IfStep(tuple(arms))], writes


def _run(workflow: Workflow, steps: tuple[Any, ...], frame: Any) -> Any:
    for step in steps:
        if isinstance(step, InvokePipelet):
            frame = configured_pipelet(workflow, step).transform(frame)
        else:
            frame = _run_if(workflow, step, frame)
    return frame


def _test_column(arm: _Arm) -> Any:
    from pyspark.sql import functions as F

    assert arm.test is not None
    value = column(arm.test.key)
    if arm.key_type == INT:
        value = value.cast("string")
    if arm.test.op is None:
        test = value.isNotNull()
    elif arm.test.op == "=":
        test = value == F.lit(arm.test.literal)
    else:
        test = value != F.lit(arm.test.literal)
    return F.coalesce(test, F.lit(False))  # an absent attribute: no node, so false (XPath 1.0)


def _run_if(workflow: Workflow, step: _IfStep, frame: Any) -> Any:
    """Each arm runs on the rows whose first true condition is its own; the arms are unioned.

    Spark pushes the filters below the earlier projections, so every row is
    computed once, by its own arm only.
    """
    from functools import reduce

    from pyspark.sql import functions as F

    arms = []
    earlier = F.lit(False)
    for arm in step.arms:
        if arm.test is None:
            mine = ~earlier
        else:
            test = _test_column(arm)
            mine = test & ~earlier
            earlier = earlier | test
        arms.append(_run(workflow, arm.steps, frame.filter(mine)))
    return reduce(lambda a, b: a.unionByName(b), arms)
