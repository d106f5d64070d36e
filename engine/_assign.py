"""``assign``/``copy`` for the interpreter: between records, annotations and BPEL variables.

Three kinds of target:

* Chalk's ``<to attribute="path"/>`` / ``annotation="name"``, and
  ``<to>$record/Val[@key=...]</to>``: written on every record of the
  instance, an expression source evaluated for each (``$record`` is that
  record, ``$records`` all of them);
* SMILA's record targets (``$request.records/rec:Record[n]/rec:Val[@key=...]``,
  ``.../rec:A[@n=...]/rec:L/rec:V``, ``.../rec:An[@n=...]``): the n-th record
  of the instance; an expression source is evaluated over all of them
  (``$record`` the n-th) and every node it selects becomes a value;
* BPEL variables (``variable=``/``part=``/``<query>``, ``$var.part/path``):
  BPEL's copy semantics, see ``engine._variables``.  A variable is the
  instance's, one value for all its records: ``$record`` in such a copy is
  the first record (of those at that point, inside a branch its part's).

A failing copy is the ``selectionFailure`` fault (``uninitializedVariable``
for a variable read before it was assigned); copies before it in the same
``assign`` stay done.
"""

from __future__ import annotations

from typing import Any

from engine import _conditions, _variables
from engine._errors import WorkflowFault
from engine._instances import Instance
from engine._interpreter import Interpreter
from engine._specs import Assign, Workflow

__all__ = ["assign"]


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def assign(it: Interpreter, wf: Workflow, act: Assign, cohort: list[Instance]) -> None:
    for inst in cohort:
        try:
            for copy in act.copies:
                where = f"{wf.path}:{copy.line}: {act.label()}"
                kind = copy.target[0]
                if copy.source[0] == "records":
                    continue  # records variable to records variable: the same records
                if kind in {"record_attribute", "record_annotation"}:
                    _copy_to_record(it, copy.source, copy.target, inst, where)
                elif kind == "variable":
                    value = _variables.read_source(copy.source, inst.frame, it.documents(inst), where)
                    _variables.write_target(copy.target, value, inst.frame, it.documents(inst),
                                            copy.keep_name, where)
                elif copy.source[0] == "expression" and len(inst.ids) > 1:
                    each = _variables.evaluate_each(copy.source[1], it.record_documents(inst), inst.frame, where)
                    for rid, value in zip(inst.ids, each, strict=True):
                        _write(it, copy.target, rid, _conditions.xpath_value_strings(value))
                else:
                    for rid in inst.ids:
                        _copy_one(it, copy.source, copy.target, rid, inst, where)
        except WorkflowFault as f:
            inst.fail(f)
        except Exception as e:
            inst.fail(WorkflowFault(
                "selectionFailure", f"{wf.path}:{act.line}: {act.label()}: {type(e).__name__}: {e}"))


def _source_values(source: tuple[str, Any], inst: Instance, documents: list[dict[str, Any]], where: str,
                   current: int = 0) -> list[Any]:
    kind, arg = source
    if kind == "expression":
        return _conditions.xpath_value_strings(_variables.evaluate(arg, documents, inst.frame, where,
                                                                   current=current))
    if kind == "literal":
        return [arg]
    return _variables.as_texts(_variables.read_source(source, inst.frame, documents, where))


def _copy_to_record(it: Interpreter, source: tuple[str, Any], target: tuple[str, Any], inst: Instance,
                    where: str) -> None:
    kind, (index, key) = target
    if index == 0:  # $record/...: each record its own
        if source[0] == "expression" and len(inst.ids) > 1:
            each = _variables.evaluate_each(source[1], it.record_documents(inst), inst.frame, where)
            for rid, value in zip(inst.ids, each, strict=True):
                _put(it, kind, rid, key, _conditions.xpath_value_strings(value))
        else:
            for position in range(len(inst.ids)):
                _copy_to_record(it, source, (kind, (position + 1, key)), inst, where)
        return
    if not 1 <= index <= len(inst.ids):
        raise ValueError(f"the instance has {len(inst.ids)} record(s); there is no record {index}")
    rid = inst.ids[index - 1]
    if source[0] in {"attribute", "annotation"}:
        values = _record_values(it, source, rid)
    elif len(inst.ids) == 1:
        values = _source_values(source, inst, it.documents(inst), where)
    else:
        values = _source_values(source, inst, it.record_documents(inst), where, current=index - 1)
    _put(it, kind, rid, key, values)


def _put(it: Interpreter, kind: str, rid: str, key: str, values: list[Any]) -> None:
    from blackboard import Annotation

    if kind == "record_annotation":
        it.bb.set_annotation(rid, None, key, Annotation(values=[_plain(v) for v in values]))
    elif values:
        it.bb.set_literals(rid, key, values)
    elif it.bb.has_attribute(rid, key):
        it.bb.remove_attribute(rid, key)


def _record_values(it: Interpreter, source: tuple[str, Any], rid: str) -> list[Any]:
    kind, arg = source
    if kind == "attribute":
        return list(it.bb.get_literals(rid, arg)) if it.bb.has_attribute(rid, arg) else []
    path, name = arg
    ann = it.bb.get_annotation(rid, path or None, name)
    return list(ann.values) if ann is not None else []


def _copy_one(it: Interpreter, source: tuple[str, Any], target: tuple[str, Any], rid: str, inst: Instance,
              where: str) -> None:
    kind = source[0]
    values: list[Any]
    if kind in {"attribute", "annotation"}:
        values = _record_values(it, source, rid)
    else:
        values = _source_values(source, inst, [it.bb.document(rid)], where)
    _write(it, target, rid, values)


def _write(it: Interpreter, target: tuple[str, Any], rid: str, values: list[Any]) -> None:
    """``values`` into Chalk's ``attribute=``/``annotation=`` target on record ``rid``."""
    from blackboard import Annotation

    tkind, targ = target
    if tkind == "attribute":
        if values:
            it.bb.set_literals(rid, targ, values)
        elif it.bb.has_attribute(rid, targ):
            it.bb.remove_attribute(rid, targ)
    else:
        path, name = targ
        plain = [getattr(v, "value", v) for v in values]
        it.bb.set_annotation(rid, path or None, name, Annotation(values=[_plain(v) for v in plain]))
