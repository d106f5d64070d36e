"""BPEL variables of a running instance, and what ``<copy>`` does with them.

Theory of operation.  Variables live in *frames*: the process has one, each
scope that declares variables pushes one, each ``forEach`` iteration pushes
one holding its counter.  A frame points at its parent; a name resolves to
the innermost frame declaring it, and an assignment changes that frame (an
outer variable assigned in a loop body changes for everyone).

Values are XML, as in BPEL: an element variable holds an lxml element, a
message variable one element per part, a simple-typed variable its text, a
counter an int.  SMILA's ``proc:ProcessorMessage`` variables (``$request``)
hold nothing: they *are* the instance's records, bound to the workflow
object when an expression uses them.  Values never leave the worker
process; frames belong to one run of one instance.

A copy's source is evaluated to one value (an element, or text); BPEL's rules
apply: an expression or query must select exactly one node (else the
``selectionFailure`` fault), an unassigned variable read is
``uninitializedVariable``.  Copying an element into an element replaces the
target's content (children and attributes) and keeps its name, unless
``keepSrcElementName="yes"``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from lxml import etree

from engine import _conditions
from engine._conditions import RECORDS
from engine._errors import WorkflowFault
from engine._specs import Condition, Variable

__all__ = ["Frame", "as_texts", "bindings", "evaluate", "evaluate_each", "read_source", "write_target"]

_UNSET: Any = object()


class Frame:
    """One level of variables (a process, a scope, a forEach iteration)."""

    __slots__ = ("kinds", "parent", "values")

    def __init__(self, declared: Iterable[Variable] = (), parent: Frame | None = None,
                 counters: Mapping[str, int] | None = None) -> None:
        self.parent = parent
        self.kinds: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        for var in declared:
            self.kinds[var.name] = var.kind
            self.values[var.name] = {} if var.kind == "message" else _UNSET
        for name, value in (counters or {}).items():
            self.kinds[name] = "counter"
            self.values[name] = value

    def find(self, name: str) -> Frame | None:
        frame: Frame | None = self
        while frame is not None:
            if name in frame.kinds:
                return frame
            frame = frame.parent
        return None

    def kind(self, name: str) -> str | None:
        frame = self.find(name)
        return frame.kinds[name] if frame is not None else None

    def get(self, name: str, part: str | None, where: str) -> Any:
        """The value of ``$name`` or ``$name.part``; faults when it was never assigned."""
        frame = self.find(name)
        if frame is None:
            raise WorkflowFault("uninitializedVariable", f"{where}: variable ${name} is not declared here")
        value = frame.values[name]
        if frame.kinds[name] == "message":
            if part is None:
                parts = list(value.values())
                if not parts:
                    raise WorkflowFault("uninitializedVariable", f"{where}: ${name} has no value yet")
                return parts[0] if len(parts) == 1 else parts
            value = value.get(part, _UNSET)
        if value is _UNSET:
            label = f"${name}.{part}" if part else f"${name}"
            raise WorkflowFault("uninitializedVariable", f"{where}: {label} has no value yet; assign it first")
        return value

    def set(self, name: str, part: str | None, value: Any) -> None:
        frame = self.find(name)
        assert frame is not None, name
        if frame.kinds[name] == "message":
            frame.values[name][part or ""] = value
        else:
            frame.values[name] = value

    def copy_parts(self, name: str) -> dict[str, Any]:
        """A message variable's parts (element variables: one part named ``""``), deep-copied."""
        frame = self.find(name)
        assert frame is not None, name
        value = frame.values[name]
        if frame.kinds[name] != "message":
            value = {} if value is _UNSET else {"": value}
        return {k: _clone(v) for k, v in value.items()}


def _clone(value: Any) -> Any:
    return _copy_element(value) if isinstance(value, etree._Element) else value


def _copy_element(el: etree._Element) -> etree._Element:
    return etree.fromstring(etree.tostring(el, with_tail=False))


@functools.lru_cache(maxsize=1024)
def _literal(xml: str) -> etree._Element:
    return etree.fromstring(xml)


def bindings(frame: Frame | None, names: Iterable[str], where: str) -> dict[str, Any]:
    """XPath bindings for the variables ``names`` an expression uses (records variables -> RECORDS)."""
    out: dict[str, Any] = {}
    if frame is None:
        return out
    for ref in names:
        name, _, part = ref.partition(".")
        kind = frame.kind(name)
        if kind is None:
            continue  # a link status or an unknown name: the caller's, or lxml reports it
        if kind == "records":
            out[ref] = RECORDS
            continue
        value = frame.get(name, part or None, where)
        if isinstance(value, list):
            out[ref] = value
        elif isinstance(value, etree._Element):
            out[ref] = [value]
        else:
            out[ref] = value
    return out


def evaluate(cond: Condition, documents: list[dict[str, Any]], frame: Frame | None, where: str,
             extra: Mapping[str, Any] | None = None, current: int = 0) -> Any:
    """``cond`` over the records ``documents`` with the variables of ``frame`` bound
    (``$record`` is ``documents[current]``)."""
    compiled = _conditions.compiled(cond)
    bound = dict(extra or {})
    if compiled.bound:
        bound.update(bindings(frame, compiled.bound - set(bound), where))
    return compiled.evaluate(documents, bound, current)


def evaluate_each(cond: Condition, documents: list[dict[str, Any]], frame: Frame | None, where: str) -> list[Any]:
    """``cond`` once per record of ``documents``, ``$record`` bound to it (rendered once)."""
    compiled = _conditions.compiled(cond)
    bound = bindings(frame, compiled.bound, where) if compiled.bound else None
    return compiled.evaluate_each(documents, bound)


def _one(result: Any, where: str, what: str) -> Any:
    """An XPath result as one value: an element, or text."""
    if isinstance(result, list):
        if len(result) != 1:
            raise WorkflowFault("selectionFailure", f"{where}: {what} selects {len(result)} nodes; it must "
                                "select exactly one")
        item = result[0]
        return item if isinstance(item, etree._Element) else str(item)
    return _conditions.xpath_value_strings(result)[0] if not isinstance(result, str) else result


def _query(value: Any, query: Condition, where: str) -> Any:
    if not isinstance(value, etree._Element):
        raise WorkflowFault("selectionFailure", f"{where}: <query> needs an element value to start from")
    ns = {p: u for p, u in query.namespaces if p}
    try:
        result = value.xpath(query.expression, namespaces=ns, smart_strings=True)
    except etree.XPathError as e:
        raise WorkflowFault("selectionFailure", f"{where}: <query> {query.expression!r} failed: {e}") from e
    return result


def read_source(source: tuple[str, Any], frame: Frame | None, documents: list[dict[str, Any]],
                where: str) -> Any:
    """The value of a copy source: an element (a fresh copy) or text."""
    kind, arg = source
    if kind == "literal":
        return str(arg)
    if kind == "xml":
        return _copy_element(_literal(arg))
    if kind == "variable":
        assert frame is not None
        name, part, query = arg
        value = frame.get(name, part, where)
        if isinstance(value, list):
            raise WorkflowFault("selectionFailure", f"{where}: ${name} has several parts; name one (part=)")
        if query is not None:
            value = _one(_query(value, query, where), where, f"<query> {query.expression!r}")
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return _clone(value)
    if kind == "expression":
        value = _one(evaluate(arg, documents, frame, where), where, f"<from>{arg.expression}</from>")
        return _clone(value)
    raise ValueError(f"not a variable source: {kind}")


def as_texts(value: Any) -> list[str]:
    """A source value as record values: an element's text, or the text itself."""
    if isinstance(value, etree._Element):
        return ["".join(value.itertext())]
    return [str(value)]


def _replace_content(target: etree._Element, value: Any, keep_name: bool) -> etree._Element:
    if isinstance(value, etree._Element):
        if keep_name:
            parent = target.getparent()
            if parent is not None:
                value.tail = target.tail
                parent.replace(target, value)
            return value
        for child in list(target):
            target.remove(child)
        target.attrib.clear()
        target.text = value.text
        for key, val in value.attrib.items():
            target.set(key, val)
        for child in value:
            target.append(child)
        return target
    for child in list(target):
        target.remove(child)
    target.text = str(value)
    return target


def _write_node(result: Any, value: Any, keep_name: bool, where: str, what: str) -> None:
    if not isinstance(result, list) or len(result) != 1:
        count = len(result) if isinstance(result, list) else 0
        raise WorkflowFault("selectionFailure", f"{where}: {what} selects {count} nodes; a <to> must select "
                            "exactly one")
    node = result[0]
    if isinstance(node, etree._Element):
        _replace_content(node, value, keep_name)
        return
    parent = node.getparent() if hasattr(node, "getparent") else None
    text = as_texts(value)[0]
    if parent is None:
        raise WorkflowFault("selectionFailure", f"{where}: {what} selects a value that cannot be written")
    if getattr(node, "is_attribute", False):
        parent.set(node.attrname, text)
    elif getattr(node, "is_tail", False):
        parent.tail = text
    else:
        for child in list(parent):
            parent.remove(child)
        parent.text = text


def write_target(target: tuple[str, Any], value: Any, frame: Frame | None, documents: list[dict[str, Any]],
                 keep_name: bool, where: str) -> None:
    """Put ``value`` (from :func:`read_source`) into a variable target ``("variable", (name, part, query))``.

    ``query`` (``<query>``, or the path of ``<to>$var.part/path</to>``) is
    evaluated from the variable's value and must select one node.
    """
    assert frame is not None
    _, (name, part, query) = target
    var_kind = frame.kind(name)
    if query is not None:
        current = frame.get(name, part, where)
        _write_node(_query(current, query, where), value, keep_name, where, f"<query> {query.expression!r}")
        return
    if var_kind == "simple" or var_kind == "counter":
        frame.set(name, part, as_texts(value)[0])
        return
    current = _current(frame, name, part)
    if isinstance(current, etree._Element) and not (keep_name and isinstance(value, etree._Element)):
        _replace_content(current, value, keep_name=False)  # an assigned element keeps its name
    elif isinstance(value, etree._Element):
        frame.set(name, part, value)
    else:
        frame.set(name, part, _text_element(name if part is None else part, str(value)))


def _current(frame: Frame, name: str, part: str | None) -> Any:
    try:
        return frame.get(name, part, "")
    except WorkflowFault:
        return None


def _text_element(name: str, text: str) -> etree._Element:
    el = etree.Element(name if name.isidentifier() else "value")
    el.text = text
    return el
