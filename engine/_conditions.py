"""XPath conditions over the workflow object.

Theory of operation: conditions never see the blackboard.  For each
evaluation the instance's records are rendered as a small XML *workflow
object* (the SMILA concept's term)::

    <Record id="doc-1"><Val key="lang">de</Val><Seq key="tags"><Val>a</Val>
    <Val>b</Val></Seq><Map key="author"><Val key="name">X</Val></Map></Record>

and the compiled expression runs over it with these variables bound:
``$record`` (the record the decision is about), ``$records`` (all of them)
and SMILA's ``$request.records`` (a wrapper element whose children are the
records, so ``$request.records/rec:Record[1]/rec:Val[@key="x"]`` works
unchanged).  A condition that names ``$record`` is *per record*
(``CompiledCondition.per_record``): :meth:`~CompiledCondition.test_each`
renders the records once and answers for each of them, ``$record`` bound to
it in turn; :meth:`~CompiledCondition.test` answers once, ``$record`` the
first record (or the one ``current`` names).  When
the expression uses a prefix bound to SMILA's record namespace, the object is
built in that namespace; otherwise without one.  BPEL variables and
``forEach`` counters come in as extra bindings (``engine._variables``).

SMILA's older record form is rendered too when an expression uses it
(``rec:A``, ``rec:L``, ``rec:V``, ``rec:O``, ``rec:An``)::

    <Record id="doc-1"><A n="lang"><L><V>de</V></L></A>
      <A n="author"><O><A n="name"><L><V>X</V></L></A></O></A>
      <An n="source"><V>crawler</V><V n="run">7</V></An><Attachment>Content</Attachment></Record>

so ``$request.records/rec:Record[1]/rec:A[@n="x"]/rec:L/rec:V`` and
``rec:An[@n="x"]/rec:V`` work as in SMILA 0.9; an expression that navigates
generically (``*``, ``//``...) gets both forms.

Only the attributes an expression can see are rendered: when every
``@key``/``@n`` test compares with a string literal and nothing navigates
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
    "RECORDS",
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

_LITERAL_KEY = re.compile(r"""@(?:key|n)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_ANY_KEY = re.compile(r"@(?:key|n)\b")
_GENERIC = re.compile(r"\*|node\(\)|name\(|local-name\(|\.\.|following|preceding|descendant|ancestor|//|@\*")
_VARIABLE = re.compile(r"\$([A-Za-z_][\w.\-]*)")
# element names of SMILA's older record form as steps of a path (rec:A[...], /L/, /V)
_OLD_FORM = re.compile(r"(?:^|[/\[(,:|\s])(?:A|An|L|V|O|Attachment)(?=\s*(?:[\[/\]),|=!<>]|$))")
_NEW_FORM = re.compile(r"(?:^|[/\[(,:|\s])(?:Val|Seq|Map)(?=\s*(?:[\[/\]),|=!<>]|$))")
_BUILTIN = frozenset({"record", "records", "request.records", "request"})


class _Records:
    """Sentinel binding: "the records element" (for SMILA's other records variables)."""

    def __repr__(self) -> str:
        return "RECORDS"


#: Bind a variable to this to have it stand for the workflow object's records element.
RECORDS: Any = _Records()


@dataclass(frozen=True)
class CompiledCondition:
    """A condition compiled for this process."""

    xpath: etree.XPath
    namespaced: bool
    keys: frozenset[str] | None  # None: render every attribute
    variables: frozenset[str]
    fast: Callable[[Sequence[Mapping[str, Any]]], bool] | None = None  # same answer as ``test``, no XML
    old: bool = False  # render SMILA's older record form
    new: bool = True  # render the newer one
    bound: frozenset[str] = frozenset()  # variables that are not the records (BPEL variables, counters, links)
    per_record: bool = False  # names $record: decided for each record, not once for all of them

    def evaluate(self, documents: Sequence[Mapping[str, Any]], extra: Mapping[str, Any] | None = None,
                 current: int = 0) -> Any:
        """Evaluate over the records ``documents``; ``$record`` is ``documents[current]``."""
        records = render_records(documents, namespaced=self.namespaced, keys=self.keys, old=self.old,
                                 new=self.new)
        return self.xpath(records, **_variables(records, extra, current))

    def evaluate_each(self, documents: Sequence[Mapping[str, Any]],
                      extra: Mapping[str, Any] | None = None) -> list[Any]:
        """One value per record of ``documents``, ``$record`` bound to it (the records rendered once)."""
        records = render_records(documents, namespaced=self.namespaced, keys=self.keys, old=self.old,
                                 new=self.new)
        variables = _variables(records, extra, 0)
        out = []
        for item in records:
            variables["record"] = [item]
            out.append(self.xpath(records, **variables))
        return out

    def test(self, documents: Sequence[Mapping[str, Any]], extra: Mapping[str, Any] | None = None) -> bool:
        """Evaluate and convert to boolean by XPath 1.0 rules (``$record``: the first record)."""
        if self.fast is not None:
            return self.fast(documents)
        return _boolean(self.evaluate(documents, extra))

    def test_each(self, documents: Sequence[Mapping[str, Any]],
                  extra: Mapping[str, Any] | None = None) -> list[bool]:
        """:meth:`test` for each record of ``documents`` in turn as ``$record``."""
        if self.fast is not None and self.per_record:  # $record alone: the other records do not matter
            return [self.fast((doc,)) for doc in documents]
        return [_boolean(value) for value in self.evaluate_each(documents, extra)]


def _variables(records: etree._Element, extra: Mapping[str, Any] | None, current: int = 0) -> dict[str, Any]:
    items = list(records)
    variables: dict[str, Any] = {
        "record": items[current:current + 1],
        "records": items,
        "request.records": records,
        "request": records,
    }
    if extra:
        for name, value in extra.items():
            variables[name] = records if value is RECORDS else value
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


def _forms(expression: str) -> tuple[bool, bool]:
    """``(new, old)``: which record forms the expression can see."""
    if _GENERIC.search(expression):
        return True, True
    old = bool(_OLD_FORM.search(expression))
    return bool(_NEW_FORM.search(expression)) or not old, old


@functools.lru_cache(maxsize=4096)
def _compile(expression: str, namespaces: tuple[tuple[str, str], ...]) -> CompiledCondition:
    ns = {p: u for p, u in namespaces if p}
    xpath = etree.XPath(expression, namespaces=ns, smart_strings=False)
    variables = frozenset(_VARIABLE.findall(expression))
    new, old = _forms(expression)
    return CompiledCondition(
        xpath=xpath,
        namespaced=_namespaced(expression, ns),
        keys=_needed_keys(expression),
        variables=variables,
        fast=_fast_test(expression, ns),
        old=old,
        new=new,
        bound=variables - _BUILTIN,
        per_record="record" in variables,
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


# SMILA's older form of the same shape: ``$request.records/rec:Record[1]/rec:A[@n="x"]/rec:L/rec:V = 'v'``.
# There every literal value of the attribute is a ``V`` node (one ``A`` per attribute).
_FAST_OLD = re.compile(
    r"""\s*\$(record|records|request\.records/(?:(\w+):)?Record\[1\])"""
    r"""/(?:(\w+):)?A\[\s*@n\s*=\s*""" + _STR + r"""\s*\]/(?:(\w+):)?L/(?:(\w+):)?V"""
    r"""(?:\s*(!=|=)\s*""" + _STR + r""")?\s*""")


@dataclass(frozen=True)
class Comparison:
    """A condition of the common shape: attribute ``key`` compared with ``literal``.

    ``op`` is ``"="``, ``"!="`` or None (presence); ``every`` is True for
    ``$records`` (any record), False for the first record.  ``old``: written
    in SMILA's older record form, where every literal value of the attribute
    is a node (in the newer form only a single value is a ``Val``).  Both
    forms agree on attributes with at most one value.
    """

    every: bool
    key: str
    op: str | None
    literal: str | None
    old: bool = False


def comparison(expression: str, ns: Mapping[str, str]) -> Comparison | None:
    """The condition as a :class:`Comparison`, or None when it has another shape."""
    old = False
    m = _FAST.fullmatch(expression)
    if m is None:
        m = _FAST_OLD.fullmatch(expression)
        if m is None:
            return None
        start, record_prefix, a_prefix, k1, k2, l_prefix, v_prefix, op, l1, l2 = m.groups()
        steps = [a_prefix, l_prefix, v_prefix]
        old = True
    else:
        start, record_prefix, val_prefix, k1, k2, op, l1, l2 = m.groups()
        steps = [val_prefix]
    prefixes = {p for p in (record_prefix, *steps) if p}
    if start.startswith("request") and any(bool(record_prefix) != bool(p) for p in steps):
        return None
    if any(bool(p) != bool(steps[0]) for p in steps):
        return None
    if prefixes:
        if len(prefixes) > 1 or ns.get(next(iter(prefixes))) != RECORD_NS:
            return None
    elif _namespaced(expression, ns):
        return None
    return Comparison(start == "records", k1 if k1 is not None else k2, op, l1 if l1 is not None else l2, old)


def _fast_test(expression: str, ns: Mapping[str, str]) -> Callable[[Sequence[Mapping[str, Any]]], bool] | None:
    c = comparison(expression, ns)
    if c is None:
        return None
    key, op, literal, every, old = c.key, c.op, c.literal, c.every, c.old

    def texts(documents: Sequence[Mapping[str, Any]]) -> Iterator[str]:
        for doc in documents if every else documents[:1]:
            values = doc.get("meta", {}).get("attrs", {}).get(key)
            if values and (old or len(values) == 1):
                for value in values:
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
        return f"condition is not valid XPath 1.0 ({e}): {condition.expression.strip()!r}{_hint(condition)}"
    except etree.XPathError as e:
        return f"condition cannot be compiled ({e}): {condition.expression.strip()!r}"
    extra: dict[str, Any] = {name: False for name in extra_variables}
    declared = set(condition.variables)
    for name in compiled_condition.bound:
        if name.split(".", 1)[0] in declared and name not in extra:
            extra[name] = etree.Element("value")  # a stand-in: navigable, with a string value
    try:
        compiled_condition.evaluate([{"id": "check", "meta": {}}], extra)
    except etree.XPathEvalError as e:
        known = ", ".join("$" + v for v in ["record", "records", "request.records", *extra_variables,
                                            *sorted(declared - {"request"})])
        return (
            f"condition cannot be evaluated ({e}): {condition.expression.strip()!r}; "
            f"variables available here: {known}"
        )
    return None


# A step whose predicate lost its "[" (``rec:Val@key="x"]``): a typo real SMILA files carry.
_LOST_BRACKET = re.compile(r"((?:\w+:)?(?:Val|Seq|Map|A|An))@(key|n)\s*=")


def _hint(condition: Condition) -> str:
    m = _LOST_BRACKET.search(condition.expression)
    if m is None:
        return ""
    return f"; the predicate after {m.group(1)} lacks its '[': write {m.group(1)}[@{m.group(2)}=...]"


def compile_condition(expression: str, *, namespaces: Mapping[str, str] | None = None,
                      variables: Sequence[str] = ()) -> CompiledCondition:
    """Check and compile an XPath condition over records (for callers outside workflows).

    ``namespaces`` defaults to ``rec`` bound to SMILA's record namespace, so
    ``$request.records/rec:Record[1]/rec:A[@n='x']/rec:L/rec:V`` works as in a
    workflow file.  Raises :class:`WorkflowDefinitionError` with what is
    wrong, e.g. for the router's conditions in the configuration.
    """
    from engine._errors import WorkflowDefinitionError

    bound = {"rec": RECORD_NS} if namespaces is None else dict(namespaces)
    condition = Condition(expression, 0, tuple(sorted(bound.items())))
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


# -- SMILA's older record form -----------------------------------------------------------

_OLD_TYPES = {bool: "bool", int: "int", float: "fp"}


def _old_annotations(parent: etree._Element, annmap: Mapping[str, Any], keys: frozenset[str] | None,
                     ns: str) -> None:
    for name, entries in annmap.items():
        if keys is not None and name not in keys:
            continue
        for ann in entries:
            an = etree.SubElement(parent, ns + "An", n=name)
            for value in ann.get("values", ()):
                etree.SubElement(an, ns + "V").text = _scalar_text(value)
            for key, value in ann.get("named", {}).items():
                etree.SubElement(an, ns + "V", n=key).text = _scalar_text(value)
            _old_annotations(an, ann.get("ann", {}), None, ns)


def _old_value(parent: etree._Element, value: Any, ns: str) -> None:
    v = etree.SubElement(parent, ns + "V")
    if isinstance(value, dict):
        if value.get("dt"):
            v.set("type", value["dt"])
        if value.get("type"):
            v.set("st", str(value["type"]))
        value = value.get("lit")
    kind = _OLD_TYPES.get(type(value))
    if kind:
        v.set("type", kind)
    v.text = _scalar_text(value)


def _render_old(parent: etree._Element, obj: Mapping[str, Any], keys: frozenset[str] | None, ns: str) -> None:
    """``A``/``L``/``V``/``O``/``An`` elements of SMILA's older record XML for ``obj``."""
    attr_ann = obj.get("attr_ann", {})
    for name, values in obj.get("attrs", {}).items():
        if keys is not None and name not in keys:
            continue
        a = etree.SubElement(parent, ns + "A", n=name)
        if name in attr_ann:
            _old_annotations(a, attr_ann[name], None, ns)
        plain: etree._Element | None = None
        for value in values:
            if isinstance(value, dict) and "obj" in value:
                o = etree.SubElement(a, ns + "O")
                if value["obj"].get("type"):
                    o.set("st", str(value["obj"]["type"]))
                _render_old(o, value["obj"], None, ns)
            elif isinstance(value, dict) and value.get("ann"):
                # an annotated literal gets its own L, with its annotations after the V
                lit = etree.SubElement(a, ns + "L")
                _old_value(lit, value, ns)
                _old_annotations(lit, value["ann"], None, ns)
            else:
                if plain is None:
                    plain = etree.SubElement(a, ns + "L")
                _old_value(plain, value, ns)
    _old_annotations(parent, obj.get("ann", {}), keys, ns)


def render_records(
    documents: Sequence[Mapping[str, Any]], *, namespaced: bool = False, keys: frozenset[str] | None = None,
    old: bool = False, new: bool = True,
) -> etree._Element:
    """The workflow object: a ``records`` element holding one ``Record`` per document.

    ``new``/``old`` choose the record forms rendered (both may be).
    """
    ns = "{%s}" % RECORD_NS if namespaced else ""
    root = etree.Element(ns + "records", nsmap={"rec": RECORD_NS} if namespaced else None)
    for doc in documents:
        rec = etree.SubElement(root, ns + "Record", id=str(doc.get("id", "")))
        meta = doc.get("meta", {})
        if new:
            _render_object(rec, meta, keys, ns)
        if old:
            _render_old(rec, meta, keys, ns)
            for name in doc.get("attachments", ()):
                etree.SubElement(rec, ns + "Attachment").text = str(name)
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
