"""XPath conditions over the workflow object.

Theory of operation: conditions never see the blackboard.  For each
evaluation the instance's records are rendered as a small XML *workflow
object* (the SMILA concept's term)::

    <Record id="doc-1"><Val key="lang">de</Val><Seq key="tags"><Val>a</Val>
    <Val>b</Val></Seq><Map key="author"><Val key="name">X</Val></Map></Record>

and the compiled expression runs over it with these variables bound:
``$record`` (the first record), ``$records`` (all of them) and SMILA's
``$request.records`` (a wrapper element whose children are the records, so
``$request.records/rec:Record[1]/rec:Val[@key="x"]`` works unchanged).  When
the expression uses a prefix bound to SMILA's record namespace, the object is
built in that namespace; otherwise without one.

Only the attributes an expression can see are rendered: when every
``@key`` test compares with a string literal and nothing navigates
generically (``*``, ``node()``, ``name()``...), the object holds just those
keys.  Otherwise it holds everything.

Compiled ``XPath`` objects cannot be pickled, so specs keep the text and each
process compiles each expression once (``compiled``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lxml import etree

from engine._specs import Condition

__all__ = [
    "RECORD_NS",
    "CompiledCondition",
    "Comparison",
    "check",
    "comparison",
    "compile_condition",
    "compiled",
    "render_records",
    "xpath_value_strings",
]

log = logging.getLogger(__name__)

RECORD_NS = "http://www.eclipse.org/smila/record"

_LITERAL_KEY = re.compile(r"""@key\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_ANY_KEY = re.compile(r"@key")
_GENERIC = re.compile(r"\*|node\(\)|name\(|local-name\(|\.\.|following|preceding|descendant|ancestor|//|@\*")
_VARIABLE = re.compile(r"\$([A-Za-z_][\w.\-]*)")


@dataclass(frozen=True)
class CompiledCondition:
    """A condition compiled for this process."""

    xpath: etree.XPath
    namespaced: bool
    keys: frozenset[str] | None  # None: render every attribute
    variables: frozenset[str]
    fast: Callable[[Sequence[Mapping[str, Any]]], bool] | None = None  # same answer as ``test``, no XML

    def evaluate(self, documents: Sequence[Mapping[str, Any]], extra: Mapping[str, Any] | None = None) -> Any:
        """Evaluate over the records ``documents`` (first one is ``$record``)."""
        records = render_records(documents, namespaced=self.namespaced, keys=self.keys)
        return self.xpath(records, **_variables(records, extra))

    def test(self, documents: Sequence[Mapping[str, Any]], extra: Mapping[str, Any] | None = None) -> bool:
        """Evaluate and convert to boolean by XPath 1.0 rules."""
        if self.fast is not None:
            return self.fast(documents)
        return _boolean(self.evaluate(documents, extra))


def _variables(records: etree._Element, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    items = list(records)
    variables: dict[str, Any] = {
        "record": items[:1],
        "records": items,
        "request.records": records,
        "request": records,
    }
    if extra:
        variables.update(extra)
    return variables


def _boolean(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value)
    if isinstance(value, float):
        return value == value and value != 0.0  # NaN is false
    if isinstance(value, str):
        return value != ""
    return bool(value)


def _needed_keys(expression: str) -> frozenset[str] | None:
    uses = len(_ANY_KEY.findall(expression))
    literal = [a or b for a, b in _LITERAL_KEY.findall(expression)]
    if uses != len(literal) or _GENERIC.search(expression):
        return None
    return frozenset(literal)


def _namespaced(expression: str, namespaces: Mapping[str, str]) -> bool:
    return any(uri == RECORD_NS and f"{prefix}:" in expression for prefix, uri in namespaces.items() if prefix)


@functools.lru_cache(maxsize=4096)
def _compile(expression: str, namespaces: tuple[tuple[str, str], ...]) -> CompiledCondition:
    ns = {p: u for p, u in namespaces if p}
    xpath = etree.XPath(expression, namespaces=ns, smart_strings=False)
    return CompiledCondition(
        xpath=xpath,
        namespaced=_namespaced(expression, ns),
        keys=_needed_keys(expression),
        variables=frozenset(_VARIABLE.findall(expression)),
        fast=_fast_test(expression, ns),
    )


# The most common condition shape -- one attribute of the record compared with a
# string (``$record/Val[@key='lang'] = 'de'``, SMILA's
# ``$request.records/rec:Record[1]/rec:Val[@key="MimeType"] != 'text/html'``, or
# just the attribute's presence) -- is answered straight from the documents with
# XPath 1.0's rules for a node-set against a string: ``=`` is true when some node's
# string value equals it, ``!=`` when some node's differs, a bare path when the
# node-set is not empty.  A ``Val`` node exists when the attribute has exactly one
# value that is not a map (``_render_object``).  Everything else goes to lxml.
_STR = r"""(?:"([^"]*)"|'([^']*)')"""
_FAST = re.compile(
    r"""\s*\$(record|records|request\.records/(?:(\w+):)?Record\[1\])"""
    r"""/(?:(\w+):)?Val\[\s*@key\s*=\s*""" + _STR + r"""\s*\]"""
    r"""(?:\s*(!=|=)\s*""" + _STR + r""")?\s*""")


@dataclass(frozen=True)
class Comparison:
    """A condition of the common shape: attribute ``key`` compared with ``literal``.

    ``op`` is ``"="``, ``"!="`` or None (presence); ``every`` is True for
    ``$records`` (any record), False for the first record.
    """

    every: bool
    key: str
    op: str | None
    literal: str | None


def comparison(expression: str, ns: Mapping[str, str]) -> Comparison | None:
    """The condition as a :class:`Comparison`, or None when it has another shape."""
    m = _FAST.fullmatch(expression)
    if m is None:
        return None
    start, record_prefix, val_prefix, k1, k2, op, l1, l2 = m.groups()
    prefixes = {p for p in (record_prefix, val_prefix) if p}
    if start.startswith("request") and bool(record_prefix) != bool(val_prefix):
        return None
    if prefixes:
        if len(prefixes) > 1 or ns.get(next(iter(prefixes))) != RECORD_NS:
            return None
    elif _namespaced(expression, ns):
        return None
    return Comparison(start == "records", k1 if k1 is not None else k2, op, l1 if l1 is not None else l2)


def _fast_test(expression: str, ns: Mapping[str, str]) -> Callable[[Sequence[Mapping[str, Any]]], bool] | None:
    c = comparison(expression, ns)
    if c is None:
        return None
    key, op, literal, every = c.key, c.op, c.literal, c.every

    def texts(documents: Sequence[Mapping[str, Any]]) -> Iterator[str]:
        for doc in documents if every else documents[:1]:
            values = doc.get("meta", {}).get("attrs", {}).get(key)
            if values and len(values) == 1:
                value = values[0]
                if isinstance(value, dict):
                    if "obj" in value:
                        continue
                    value = value.get("lit")
                yield _scalar_text(value)

    if op is None:
        return lambda documents: any(True for _ in texts(documents))
    if op == "=":
        return lambda documents: any(t == literal for t in texts(documents))
    return lambda documents: any(t != literal for t in texts(documents))


def compiled(condition: Condition) -> CompiledCondition:
    """The condition compiled (once per process and expression)."""
    return _compile(condition.expression, condition.namespaces)


def check(condition: Condition, extra_variables: Sequence[str] = ()) -> str | None:
    """Return an error message when ``condition`` cannot run, else ``None``.

    Compiles the expression and evaluates it once over an empty record, so
    syntax errors, unknown functions and undefined variables show at load
    time, not in the first batch.
    """
    try:
        compiled_condition = compiled(condition)
    except etree.XPathSyntaxError as e:
        return f"condition is not valid XPath 1.0 ({e}): {condition.expression.strip()!r}"
    except etree.XPathError as e:
        return f"condition cannot be compiled ({e}): {condition.expression.strip()!r}"
    extra = {name: False for name in extra_variables}
    try:
        compiled_condition.evaluate([{"id": "check", "meta": {}}], extra)
    except etree.XPathEvalError as e:
        known = ", ".join("$" + v for v in ["record", "records", "request.records", *extra_variables])
        return (
            f"condition cannot be evaluated ({e}): {condition.expression.strip()!r}; "
            f"variables available here: {known}"
        )
    return None


def compile_condition(expression: str, *, namespaces: Mapping[str, str] | None = None,
                      variables: Sequence[str] = ()) -> CompiledCondition:
    """Check and compile an XPath condition over records (for callers outside workflows).

    Raises :class:`WorkflowDefinitionError` with what is wrong, e.g. for the
    router's conditions in the configuration.
    """
    from engine._errors import WorkflowDefinitionError

    condition = Condition(expression, 0, tuple((namespaces or {}).items()))
    problem = check(condition, variables)
    if problem:
        raise WorkflowDefinitionError([problem])
    return compiled(condition)


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return str(value)


def _value_element(tag: str, value: Any, key: str | None, ns: str) -> etree._Element:
    if isinstance(value, dict) and "obj" in value:
        el = etree.Element(ns + "Map")
        if key is not None:
            el.set("key", key)
        _render_object(el, value["obj"], None, ns)
        return el
    el = etree.Element(ns + tag)
    if key is not None:
        el.set("key", key)
    if isinstance(value, dict):
        if value.get("type"):
            el.set("type", str(value["type"]))
        value = value.get("lit")
    el.text = _scalar_text(value)
    return el


def _render_object(parent: etree._Element, obj: Mapping[str, Any], keys: frozenset[str] | None, ns: str) -> None:
    for name, values in obj.get("attrs", {}).items():
        if keys is not None and name not in keys:
            continue
        if len(values) == 1:
            parent.append(_value_element("Val", values[0], name, ns))
        elif values:
            seq = etree.SubElement(parent, ns + "Seq", key=name)
            for value in values:
                seq.append(_value_element("Val", value, None, ns))


def render_records(
    documents: Sequence[Mapping[str, Any]], *, namespaced: bool = False, keys: frozenset[str] | None = None
) -> etree._Element:
    """The workflow object: a ``records`` element holding one ``Record`` per document."""
    ns = "{%s}" % RECORD_NS if namespaced else ""
    root = etree.Element(ns + "records", nsmap={"rec": RECORD_NS} if namespaced else None)
    for doc in documents:
        rec = etree.SubElement(root, ns + "Record", id=str(doc.get("id", "")))
        _render_object(rec, doc.get("meta", {}), keys, ns)
    return root


def xpath_value_strings(value: Any) -> list[Any]:
    """An XPath result as values to store: node-sets become their texts."""
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            if isinstance(item, etree._Element):
                out.append("".join(item.itertext()))
            else:
                out.append(str(item))
        return out
    if isinstance(value, float) and value.is_integer():
        return [int(value)]
    return [value]
