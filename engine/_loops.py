"""Loops: ``while``, ``repeatUntil``, and ``forEach`` over counter values or over records.

``while`` tests its condition before each iteration, ``repeatUntil`` after;
each iteration runs for the instances whose condition still holds, as one
cohort, with the links set inside the loop forgotten first.  The condition
is decided per record: a record leaves the loop when its own condition says
so, the others go round again as a part of their instance, and the instance
is whole again after the loop (``engine._instances.Splits``).

A counted ``forEach`` (``startCounterValue``/``finalCounterValue``, BPEL's form): start,
final and the completion condition's ``branches`` are evaluated once, when
the loop starts, as unsigned integers (else ``invalidExpressionValue``);
per record when they name ``$record``: records with different values run
as one part each, side by side in the same iterations.
start > final runs nothing; ``branches`` = 0 completes at once; ``branches``
greater than the number of iterations is ``invalidBranchCondition``.  The
body runs over the instance's records once per counter value, the counter
bound as ``$name`` in its own frame.  Iteration k of every instance in the
cohort runs as one cohort (one batched pipelet call per activity).

``parallel="yes"`` runs the same iterations in the same order (a legal order
of concurrent branches); what differs is what stopping means: when a branch
faults, or the completion condition is met, the branches not yet run were
running in BPEL's terms and are terminated (their scopes' termination
handlers run, see ``engine._compensation``); sequentially they never started.

Over records (no counter values), the body runs once per record, ``$record``
bound to it and the counter (if named) to its position from 1; parallel runs
every record's branch as one cohort, sequential one position at a time.  A
sequential one may have a completion condition: after that many branches the
remaining records go on unchanged, without the body.  That condition counts
the instance's records: it is decided once (``$record`` the first record).

Branches count as completed when they end normally; a body that is a scope
whose fault handler ran counts too, unless ``successfulBranchesOnly="yes"``.
"""

from __future__ import annotations

from engine import _conditions, _variables
from engine._compensation import terminate
from engine._errors import WorkflowFault
from engine._instances import Instance, Splits, State
from engine._interpreter import Interpreter
from engine._specs import Condition, ForEach, RepeatUntil, Scope, While, Workflow

__all__ = ["for_each", "repeat_until", "while_"]


def while_(it: Interpreter, wf: Workflow, act: While, cohort: list[Instance]) -> None:
    assert act.condition is not None and act.body is not None
    splits: Splits | None = None
    active = cohort
    while active:
        active, splits = _still_in(it, act.condition, active, splits, True)
        if not active:
            break
        it.clear_loop_links(act.body, active)
        it.step(wf, act.body, active)
    if splits is not None:
        splits.rejoin()


def repeat_until(it: Interpreter, wf: Workflow, act: RepeatUntil, cohort: list[Instance]) -> None:
    assert act.condition is not None and act.body is not None
    splits: Splits | None = None
    active = cohort
    while active:
        it.clear_loop_links(act.body, active)
        it.step(wf, act.body, active)
        active, splits = _still_in(it, act.condition, active, splits, False)
    if splits is not None:
        splits.rejoin()


def _still_in(it: Interpreter, cond: Condition, active: list[Instance], splits: Splits | None, stay: bool
              ) -> tuple[list[Instance], Splits | None]:
    """The instances whose condition is ``stay`` go round again; per record, so when their records
    disagree, the records that stay go on as a part and the others leave the loop."""
    going: list[Instance] = []
    for inst in active:
        if not inst.running:
            continue
        verdict = it.verdicts(cond, inst)
        if verdict is stay:
            going.append(inst)
        elif not isinstance(verdict, bool):
            splits = splits or Splits()
            going.append(splits.narrow(inst, [v is stay for v in verdict]))
    return (going if splits is None else splits.going(going)), splits


def _unsigned(it: Interpreter, wf: Workflow, cond: Condition, inst: Instance, what: str,
              current: int | None = None) -> int | None:
    """``cond`` as an unsigned integer for ``inst`` (``$record``: its record at ``current``)."""
    where = f"{wf.path}:{cond.line}"
    try:
        if current is None:
            value = _variables.evaluate(cond, it.documents(inst), inst.frame, where)
        else:
            value = _variables.evaluate(cond, it.record_documents(inst), inst.frame, where, current=current)
    except WorkflowFault as f:
        inst.fail(f)
        return None
    except Exception as e:
        inst.fail(WorkflowFault("invalidExpressionValue", f"{where}: <{what}> failed: {e}"))
        return None
    if isinstance(value, list):
        value = "".join(value[0].itertext()) if value and hasattr(value[0], "itertext") else (
            str(value[0]) if value else "")
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if number != number or number < 0 or not number.is_integer():
        inst.fail(WorkflowFault("invalidExpressionValue",
                                f"{where}: <{what}> is {value!r}, not an unsigned integer"))
        return None
    return int(number)


def _counts(act: ForEach, inst: Instance) -> bool:
    """Whether the branch ``inst`` just ran counts for the completion condition: it ended
    normally, or by its scope's fault handler unless ``successfulBranchesOnly``."""
    return not act.successful_only or not isinstance(act.body, Scope) or inst.scope_ok is not False


def for_each(it: Interpreter, wf: Workflow, act: ForEach, cohort: list[Instance]) -> None:
    assert act.body is not None
    if act.counted:
        _for_each_counted(it, wf, act, cohort)
    else:
        _for_each_record(it, wf, act, cohort)


# -- forEach, counted ----------------------------------------------------------------
def _plan(it: Interpreter, wf: Workflow, act: ForEach, inst: Instance, current: int | None = None
          ) -> list[int] | None:
    """``[start, final, branches or -1, completed]`` for ``inst`` (its record at ``current``);
    None when no iteration runs (or it faulted)."""
    assert act.start is not None and act.final is not None
    start = _unsigned(it, wf, act.start, inst, "startCounterValue", current)
    final = _unsigned(it, wf, act.final, inst, "finalCounterValue", current) if start is not None else None
    branches = -1
    if final is not None and act.branches is not None:
        got = _unsigned(it, wf, act.branches, inst, "branches", current)
        if got is None:
            return None
        branches = got
    if start is None or final is None or start > final or branches == 0:
        return None
    if branches > final - start + 1:
        inst.fail(WorkflowFault(
            "invalidBranchCondition",
            f"{wf.path}:{act.line}: {act.label()}: <branches> is {branches} but there are only "
            f"{final - start + 1} iterations"))
        return None
    return [start, final, branches, 0]


def _per_record(act: ForEach) -> bool:
    return any(_conditions.compiled(c).per_record for c in (act.start, act.final, act.branches) if c is not None)


def _for_each_counted(it: Interpreter, wf: Workflow, act: ForEach, cohort: list[Instance]) -> None:
    """Start, final and branches are decided per record when they name ``$record``: records with
    different counter ranges run as one part per range (in the same iterations)."""
    assert act.start is not None and act.final is not None and act.body is not None
    plans: dict[int, list[int]] = {}  # id(inst) -> [next counter, final, branches or -1, completed]
    active: list[Instance] = []
    splits: Splits | None = None
    for inst in cohort:
        if len(inst.ids) > 1 and _per_record(act):
            each = [_plan(it, wf, act, inst, k) for k in range(len(inst.ids))]
            if not inst.running:
                continue
            if any(p != each[0] for p in each):
                groups: dict[tuple[int, ...] | None, list[str]] = {}
                for rid, p in zip(inst.ids, each, strict=True):
                    groups.setdefault(tuple(p) if p is not None else None, []).append(rid)
                splits = splits or Splits()
                for key, part in zip(groups, splits.parts(inst, list(groups.values())), strict=True):
                    if key is not None:
                        plans[id(part)] = list(key)
                        active.append(part)
                continue
            plan = each[0]
        else:
            plan = _plan(it, wf, act, inst)
        if plan is not None:
            plans[id(inst)] = plan
            active.append(inst)
    _iterate(it, wf, act, active, plans, splits)
    if splits is not None:
        splits.rejoin()


def _iterate(it: Interpreter, wf: Workflow, act: ForEach, active: list[Instance], plans: dict[int, list[int]],
             splits: Splits | None) -> None:
    assert act.body is not None
    counter = act.counter_name or ""
    while active:
        this = [i for i in active if i.running and plans[id(i)][0] <= plans[id(i)][1]]
        if splits is not None:
            this = splits.going(this)
        if not this:
            return
        saved = {id(i): i.frame for i in this}
        for inst in this:
            inst.frame = _variables.Frame(parent=inst.frame, counters={counter: plans[id(inst)][0]})
            inst.scope_ok = None
        it.clear_loop_links(act.body, this)
        it.step(wf, act.body, this)
        for inst in this:
            inst.frame = saved[id(inst)]
        stopped: list[Instance] = []
        for inst in this:
            plan = plans[id(inst)]
            plan[0] += 1
            if inst.running:
                if _counts(act, inst):
                    plan[3] += 1
                if plan[2] > 0 and plan[3] >= plan[2]:
                    stopped.append(inst)
            elif inst.state is State.FAULTED:
                stopped.append(inst)
        if act.parallel:
            _terminate_iterations(it, wf, act, [(i, plans[id(i)][0], plans[id(i)][1]) for i in stopped])
        gone = {id(i) for i in stopped}
        active = [i for i in this if i.running and id(i) not in gone]


def _terminate_iterations(it: Interpreter, wf: Workflow, act: ForEach,
                          pending: list[tuple[Instance, int, int]]) -> None:
    """Terminate the iterations ``first..last`` of each instance (never run: parallel branches)."""
    assert act.body is not None
    counter = act.counter_name or ""
    step = 0
    while True:
        group = [(inst, first + step) for inst, first, last in pending if first + step <= last]
        if not group:
            return
        values = {id(inst): value for inst, value in group}

        def frame_for(inst: Instance, values: dict[int, int] = values) -> _variables.Frame:
            return _variables.Frame(parent=inst.frame, counters={counter: values[id(inst)]})

        terminate(it, wf, act.body, [inst for inst, _ in group], frame_for=frame_for)
        step += 1


# -- forEach, over records -----------------------------------------------------------
def _for_each_record(it: Interpreter, wf: Workflow, act: ForEach, cohort: list[Instance]) -> None:
    assert act.body is not None
    records = {id(i): list(i.ids) for i in cohort}
    results: dict[int, list[str]] = {id(i): [] for i in cohort}
    limit: dict[int, int] = {}
    if act.branches is not None:
        for inst in cohort:
            got = _unsigned(it, wf, act.branches, inst, "branches")
            if got is None:
                continue
            if got > len(records[id(inst)]):
                inst.fail(WorkflowFault(
                    "invalidBranchCondition",
                    f"{wf.path}:{act.line}: {act.label()}: <branches> is {got} but the instance has "
                    f"{len(records[id(inst)])} record(s)"))
                continue
            limit[id(inst)] = got
    done: dict[int, int] = {id(i): 0 for i in cohort}
    position: dict[int, int] = {id(i): 0 for i in cohort}

    def iteration(subs: list[Instance]) -> None:
        for sub in subs:
            sub.scope_ok = None
        it.step(wf, act.body, subs)  # type: ignore[arg-type]
        for sub in subs:
            parent = sub.parent
            assert parent is not None
            if sub.state is State.RUNNING or sub.state is State.COMPLETED:
                results[id(parent)].extend(sub.ids)
                if _counts(act, sub):
                    done[id(parent)] += 1
            elif parent.running:
                parent.state, parent.fault, parent.taint = sub.state, sub.fault, sub.taint
                if sub.state is State.EXITED:
                    parent.ids = results[id(parent)] + sub.ids

    def sub_of(inst: Instance, rid: str, pos: int) -> Instance:
        counters = {act.counter_name: pos} if act.counter_name else None
        frame = _variables.Frame(parent=inst.frame, counters=counters) if counters else inst.frame
        return Instance(key=inst.key, ids=[rid], parent=inst, handling=list(inst.handling), frame=frame,
                        scopes=[inst.scopes[-1]])

    go = [i for i in cohort if i.running and limit.get(id(i)) != 0]
    if act.parallel:
        iteration([sub_of(i, rid, n + 1) for i in go for n, rid in enumerate(records[id(i)])])
        for inst in go:
            position[id(inst)] = len(records[id(inst)])
    else:
        longest = max((len(records[id(i)]) for i in go), default=0)
        for k in range(longest):
            this = [i for i in go if i.running and len(records[id(i)]) > k
                    and (id(i) not in limit or done[id(i)] < limit[id(i)])]
            if not this:
                break
            iteration([sub_of(i, records[id(i)][k], k + 1) for i in this])
            for inst in this:
                position[id(inst)] = k + 1
    for inst in cohort:
        if inst.running:
            inst.ids = results[id(inst)] + records[id(inst)][position[id(inst)]:]
