"""Invoking what is outside the workflow: pipelets, services and sub-workflows.

``invokePipelet`` calls its pipelet **once** per cohort, with every record ID
of every instance that got there, and maps the IDs it returns back to the
instances: an ID that was an input of instance *i*, or a fragment whose
parent chain leads to one, belongs to *i*.  A call that raises taints the
instances in it (their caller reruns them apart, see ``engine._worker``),
except the one whose record a ``PipeletError`` names: that one faults
(``pipeletError``).

An instance whose records were cancelled while it ran (``engine._progress.
stopped``: ``chalk jobs cancel``) ends before its next pipelet or service
call with a ``cancelled`` fault: the call does not get its records.

``invoke`` of a partner service runs once per instance, its input variable's
parts in and its reply into the output variable.  ``invokeWorkflow`` runs the
sub-workflow as a process of its own for the cohort; an ``exit`` there ends
the sub-workflow only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from engine import _variables
from engine._errors import WorkflowFault
from engine._instances import Instance, State
from engine._interpreter import Interpreter
from engine._progress import starting, stopped
from engine._specs import InvokePipelet, InvokeService, InvokeWorkflow, Workflow
from engine._structured import process

__all__ = ["invoke_pipelet", "invoke_service", "invoke_workflow"]

log = logging.getLogger(__name__)


# -- pipelets ---------------------------------------------------------------------
def invoke_pipelet(it: Interpreter, wf: Workflow, act: InvokePipelet, cohort: list[Instance]) -> None:
    all_ids = [rid for inst in cohort for rid in inst.ids]
    if not all_ids:
        return
    where = f"{wf.path}:{act.line}: {act.label()}"
    gone = stopped(all_ids)
    if gone:
        cohort = _stop(cohort, gone, where)
        all_ids = [rid for inst in cohort for rid in inst.ids]
        if not all_ids:
            return
    starting("pipelet", act.pipelet_class, wf, act, all_ids)
    try:
        pipelet = it.pipelet_for(wf, act)
    except Exception as e:
        for inst in cohort:
            inst.fail(WorkflowFault("pipeletError", f"{where}: cannot make the pipelet: {type(e).__name__}: {e}"))
        return
    try:
        result = pipelet.process(it.bb, list(all_ids))
    except Exception as e:
        _pipelet_failed(where, cohort, e)
        return
    if result is not None and result == all_ids:  # the common case: same records, same order
        return
    try:
        _map_back(it.bb, cohort, list(result or []))
    except ValueError as e:
        _pipelet_failed(where, cohort, e)


def _stop(cohort: list[Instance], gone: set[str], where: str) -> list[Instance]:
    """End the instances with a cancelled record (a ``cancelled`` fault); the others."""
    going = []
    for inst in cohort:
        if gone.isdisjoint(inst.ids):
            going.append(inst)
        else:
            inst.fail(WorkflowFault("cancelled", f"{where}: not run: the message was cancelled "
                                                 "while it ran (chalk jobs cancel)"))
    return going


def _pipelet_record_id(exc: BaseException) -> str | None:
    rid = getattr(exc, "record_id", None)
    return rid if isinstance(rid, str) else None


def _root(inst: Instance) -> Instance:
    while inst.parent is not None:
        inst = inst.parent
    return inst


def _pipelet_failed(where: str, cohort: list[Instance], exc: Exception) -> None:
    message = f"{where}: {type(exc).__name__}: {exc}"
    if len({id(_root(i)) for i in cohort}) == 1:  # one message (or its parts): alone it fails the same
        for inst in cohort:
            inst.fail(WorkflowFault("pipeletError", message))
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


def _map_back(bb: Any, cohort: list[Instance], result: Iterable[str]) -> None:
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
            found = _owner_by_parent(bb, rid, owner)
        if found is None:
            same = by_key.get(bb.instance_of(rid)) if rid in bb else None
            if same and len(same) == 1:
                found = same[0]
            elif len(cohort) == 1:
                found = cohort[0]
        if found is None:
            raise ValueError(f"returned record {rid!r}, which belongs to none of the instances it was given")
        out[id(found)].append(rid)
    for inst in cohort:
        inst.ids = out[id(inst)]


def _owner_by_parent(bb: Any, rid: str, owner: dict[str, Instance]) -> Instance | None:
    seen = 0
    current: str | None = rid
    while current is not None and current in bb and seen < 64:
        parent = bb.document(current).get("parent")
        if parent in owner:
            return owner[parent]
        current = parent
        seen += 1
    return None


# -- services -----------------------------------------------------------------------
def invoke_service(it: Interpreter, wf: Workflow, act: InvokeService, cohort: list[Instance]) -> None:
    """BPEL ``invoke`` of a partner service: once per instance, variables in and out."""
    where = f"{wf.path}:{act.line}: {act.label()}"
    try:
        assert it.service_for is not None, "no service factory"
        service = it.service_for(wf, act)
    except Exception as e:
        for inst in cohort:
            inst.fail(WorkflowFault("serviceError", f"{where}: cannot make the service: {type(e).__name__}: {e}"))
        return
    for inst in cohort:
        frame = inst.frame
        assert frame is not None
        if stopped(inst.ids):
            _stop([inst], set(inst.ids), where)
            continue
        starting("service", act.service_class, wf, act, inst.ids)
        try:
            parts = frame.copy_parts(act.input_variable) if act.input_variable else {}
            reply = service.invoke(act.operation, parts)
            if act.output_variable is not None:
                _store_reply(frame, act.output_variable, reply if reply is not None else {}, where)
        except WorkflowFault as f:
            inst.fail(f)
        except Exception as e:
            inst.fail(WorkflowFault("serviceError", f"{where}: {type(e).__name__}: {e}"))


def _store_reply(frame: _variables.Frame, name: str, reply: Any, where: str) -> None:
    """A message service's answer (part -> element or text) into the output variable."""
    if not isinstance(reply, dict):
        raise WorkflowFault("serviceError", f"{where}: the service returned {type(reply).__name__}, "
                            "not a mapping of part names to values")
    kind = frame.kind(name)
    for part, value in reply.items():
        target = ("variable", (name, part if kind == "message" else None, None))
        _variables.write_target(target, value, frame, [], False, where)


# -- sub-workflows ------------------------------------------------------------------
def invoke_workflow(it: Interpreter, wf: Workflow, act: InvokeWorkflow, cohort: list[Instance]) -> None:
    try:
        sub = wf.subworkflow(act.workflow)
    except KeyError:
        for inst in cohort:
            inst.fail(WorkflowFault(
                "invalidWorkflow", f"{wf.path}:{act.line}: sub-workflow {act.workflow!r} is not attached"))
        return
    running = [i for i in cohort if i.running]
    process(it, sub, running)
    for inst in running:
        if inst.state is State.EXITED:  # <exit> ends the invoked process; the invoker goes on
            inst.state = State.RUNNING
