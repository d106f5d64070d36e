"""The data side of workflow XML: configuration, BPEL variables and copy ends.

Both SMILA syntaxes are read here with one meaning:

* configuration of a pipelet: ``<proc:configuration>`` holding ``rec:Val`` /
  ``rec:Seq`` / ``rec:Map`` or ``proc:param`` (newer), ``<proc:PipeletConfiguration>``
  (or ``proc:configuration``) holding ``<proc:Property name><proc:Value>``
  (older; several values make a list), and ``<proc:setAnnotations>`` holding
  ``<rec:An n="..."><rec:V>...</rec:V></rec:An>`` (older ``invokeService``;
  an annotation with both anonymous and named values becomes an
  ``Annotation``, see ``_annotation``); all become the one ``dict`` a
  pipelet's ``configure`` gets;
* ``<variables>`` declarations;
* ``<from>``/``<to>`` of ``<copy>``: literals, expressions, variables with
  parts and queries, and SMILA's record targets in both record forms.

Functions take the parser's context (``engine._parse_core._Context``) and
record errors there instead of raising.
"""

from __future__ import annotations

import re
from typing import Any

from lxml import etree

from blackboard import Annotation
from engine._conditions import RECORD_NS
from engine._parse_core import PROC_NS, _Context, _elements, _local, _ns
from engine._specs import Condition, Variable

__all__ = [
    "XSD_NS",
    "annotations_config",
    "config_map",
    "copy_end",
    "variable_decls",
]

XSD_NS = "http://www.w3.org/2001/XMLSchema"


def _text(el: etree._Element) -> str:
    return "".join(el.itertext()).strip()


# -- configuration ----------------------------------------------------------------

# Types of the older proc:Property (Java class names) and of rec:Val.
_INT_TYPES = {"long", "int", "integer", "java.lang.integer", "java.lang.long", "java.lang.short"}
_FLOAT_TYPES = {"double", "float", "java.lang.double", "java.lang.float"}
_BOOL_TYPES = {"boolean", "java.lang.boolean"}


def typed(ctx: _Context, text: str, kind: str, line: int | None) -> Any:
    """``text`` converted to the configuration type ``kind`` (an error is recorded when it does not fit)."""
    kind = kind.lower()
    try:
        if kind in _INT_TYPES:
            return int(text)
        if kind in _FLOAT_TYPES:
            return float(text)
        if kind in _BOOL_TYPES:
            if text.lower() not in {"true", "false"}:
                raise ValueError(f"not a boolean: {text!r}")
            return text.lower() == "true"
    except ValueError as e:
        ctx.error(line, f"configuration value of type {kind!r}: {e}")
    return text


def _config_value(ctx: _Context, el: etree._Element) -> Any:
    local = _local(el)
    if local == "Val":
        return typed(ctx, _text(el), el.get("type") or "string", el.sourceline)
    if local == "Seq":
        return [_config_value(ctx, c) for c in _elements(el)]
    if local == "Map":
        return config_map(ctx, _elements(el))
    ctx.error(el.sourceline, f"unexpected <{local}> in configuration; use rec:Val, rec:Seq, rec:Map or proc:param")
    return None


def _property(ctx: _Context, item: etree._Element) -> Any:
    """SMILA's older ``<proc:Property name= type= multiValued=><proc:Value>..</proc:Value>``."""
    kind = item.get("type") or "string"
    values = [typed(ctx, _text(v), kind, v.sourceline) for v in _elements(item) if _local(v) == "Value"]
    others = [v for v in _elements(item) if _local(v) != "Value"]
    for other in others:
        ctx.error(other.sourceline, f"<Property> holds <Value> elements, not <{_local(other)}>")
    if (item.get("multiValued") or "").strip().lower() == "true":
        return values
    if not values:
        return ""
    return values[0] if len(values) == 1 else values


def config_map(ctx: _Context, items: list[etree._Element]) -> dict[str, Any]:
    """A configuration from its items (``param``, ``Property``, ``rec:Val``/``Seq``/``Map``)."""
    config: dict[str, Any] = {}
    for item in items:
        local = _local(item)
        named = local in {"param", "Property"}
        key = item.get("name") if named else item.get("key")
        if key is None:
            ctx.error(item.sourceline, f"<{local}> in a configuration needs {'name' if named else 'key'}=")
            continue
        if key in config:
            ctx.error(item.sourceline, f"configuration key {key!r} is given twice")
        if local == "param":
            config[key] = _param(ctx, item)
        elif local == "Property":
            config[key] = _property(ctx, item)
        elif _ns(item) in {RECORD_NS, ""} or local in {"Val", "Seq", "Map"}:
            config[key] = _config_value(ctx, item)
        else:
            ctx.error(item.sourceline, f"unexpected <{local}> in configuration")
    return config


def _param(ctx: _Context, el: etree._Element) -> Any:
    kids = _elements(el)
    if kids:
        if len(kids) == 1:
            return _config_value(ctx, kids[0])
        return [_config_value(ctx, k) for k in kids]
    return typed(ctx, (el.text or "").strip(), el.get("type") or "string", el.sourceline)


def _annotation_parts(ctx: _Context, an: etree._Element) -> tuple[list[str], dict[str, etree._Element]]:
    """A ``rec:An``'s anonymous ``rec:V`` texts, and its named ``rec:V n=`` and nested
    ``rec:An n=`` elements by name (a name given twice is an error)."""
    anonymous: list[str] = []
    named: dict[str, etree._Element] = {}
    for child in _elements(an):
        local = _local(child)
        name = child.get("n")
        if local == "V" and name is None:
            anonymous.append(_text(child))
        elif local in {"V", "An"} and name:
            if name in named:
                ctx.error(child.sourceline, f"annotation value {name!r} is given twice")
            named[name] = child
        else:
            ctx.error(child.sourceline, f"<rec:An> holds <rec:V> and <rec:An n=...>, not <{local}>")
    return anonymous, named


def _annotation(ctx: _Context, an: etree._Element) -> Any:
    """One ``rec:An`` as a configuration value, by what it holds.

    * anonymous ``rec:V`` values only: the text (one value) or a list of texts;
    * named ``rec:V n=`` values and nested ``rec:An n=`` only: a map, name ->
      text (a named value) or the nested annotation's own configuration value;
    * both (valid in SMILA's data model, e.g. SMILA's ``SimplePipeline``): a
      :class:`blackboard.Annotation` -- ``values`` the anonymous texts,
      ``named`` the named ones, ``annotations`` each nested ``rec:An`` as an
      ``Annotation`` of its own -- which the pipelet may use as a setting or
      set on records as it is (``pipelets.values.SetAttributes`` does, as
      SMILA's ``setAnnotations`` did).
    """
    anonymous, named = _annotation_parts(ctx, an)
    if named and anonymous:
        return _as_annotation(ctx, anonymous, named)
    if named:
        return {name: _text(el) if _local(el) == "V" else _annotation(ctx, el) for name, el in named.items()}
    return anonymous[0] if len(anonymous) == 1 else anonymous


def _as_annotation(ctx: _Context, anonymous: list[str], named: dict[str, etree._Element]) -> Annotation:
    """A ``rec:An`` (its parts) as SMILA's data model has it: anonymous values, named values and
    nested annotations."""
    return Annotation(values=anonymous,
                      named={name: _text(el) for name, el in named.items() if _local(el) == "V"},
                      annotations={name: [_as_annotation(ctx, *_annotation_parts(ctx, el))]
                                   for name, el in named.items() if _local(el) == "An"})


def annotations_config(ctx: _Context, el: etree._Element) -> dict[str, Any]:
    """``<proc:setAnnotations>``: each ``rec:An n="name"`` becomes configuration key ``name``."""
    config: dict[str, Any] = {}
    for an in _elements(el):
        name = an.get("n")
        if _local(an) != "An" or not name:
            ctx.error(an.sourceline, f"<setAnnotations> holds <rec:An n=\"name\"> elements, not <{_local(an)}>")
            continue
        if name in config:
            ctx.error(an.sourceline, f"annotation {name!r} is set twice")
        config[name] = _annotation(ctx, an)
    return config


# -- variables --------------------------------------------------------------------

def _qname(el: etree._Element, value: str) -> tuple[str, str]:
    prefix, _, local = value.strip().rpartition(":")
    return (el.nsmap.get(prefix or None) or "", local)


def variable_decls(ctx: _Context, el: etree._Element) -> list[Variable]:
    """The ``<variable>`` elements of a ``<variables>`` block."""
    out: list[Variable] = []
    seen: set[str] = set()
    for v in _elements(el):
        name = (v.get("name") or "").strip()
        if _local(v) != "variable" or not name:
            ctx.error(v.sourceline, "<variables> holds <variable name=...> elements")
            continue
        if name in seen:
            ctx.error(v.sourceline, f"variable {name!r} is declared twice in the same <variables>")
        seen.add(name)
        if v.get("messageType"):
            ns, local = _qname(v, v.get("messageType", ""))
            kind = "records" if (ns, local) == (PROC_NS, "ProcessorMessage") else "message"
        elif v.get("element"):
            kind = "element"
        elif v.get("type"):
            kind = "simple" if _qname(v, v.get("type", ""))[0] == XSD_NS else "element"
        else:
            ctx.error(v.sourceline, f"variable {name!r} needs messageType=, element= or type=")
            kind = "simple"
        init = None
        froms = [c for c in _elements(v) if _local(c) == "from"]
        if froms:
            if kind == "records":
                ctx.error(froms[0].sourceline, f"variable {name!r} holds the instance's records; it takes no <from>")
            else:
                init = copy_end(ctx, froms[0], "from")
        out.append(Variable(name=name, kind=kind, line=v.sourceline or 0, init=init))
    return out


# -- copy ends --------------------------------------------------------------------

_STR = r"""(?:"([^"]+)"|'([^']+)')"""
_P = r"(?:\w+:)?"
# SMILA's record targets, both record forms:
#   $request.records/rec:Record[1]/rec:Val[@key="x"]/text()   (or $record/Val[@key='x'])
#   $request.records/rec:Record[1]/rec:A[@n="x"]/rec:L/rec:V   (older form)
#   $request.records/rec:Record[1]/rec:An[@n="x"]/rec:V        (a record annotation, older form)
_RECORD = r"""\$(?:([\w\-]+)\.records/""" + _P + r"""Record\[(\d+)\]|record)/"""
_RECORD_ATTRIBUTE = re.compile(
    _RECORD + r"""(?:""" + _P + r"""Val\[@key=""" + _STR + r"""\](?:/text\(\))?"""
    + r"""|""" + _P + r"""A\[@n=""" + _STR + r"""\](?:/""" + _P + r"""L(?:/""" + _P + r"""V(?:/text\(\))?)?)?)""")
_RECORD_ANNOTATION = re.compile(
    _RECORD + _P + r"""An\[@n=""" + _STR + r"""\](?:/""" + _P + r"""V(?:/text\(\))?)?""")
_VAR_ONLY = re.compile(r"\$([A-Za-z_][\w\-]*)(?:\.([A-Za-z_][\w\-]*))?")
_VAR_PATH = re.compile(r"\$([A-Za-z_][\w\-]*)(?:\.([A-Za-z_][\w\-]*))?(/.+)", re.S)


def _records_target(ctx: _Context, text: str) -> tuple[str, Any] | None:
    for kind, pattern in (("record_attribute", _RECORD_ATTRIBUTE), ("record_annotation", _RECORD_ANNOTATION)):
        m = pattern.fullmatch(text)
        if m is None:
            continue
        var, index = m.group(1), m.group(2)
        if var is not None and not ctx.is_records(var):
            return None
        key = next(g for g in m.groups()[2:] if g is not None)
        return (kind, (int(index) if index else 0, key))  # $record/...: 0, each record its own
    return None


def _query(ctx: _Context, el: etree._Element) -> Condition | None:
    queries = [c for c in _elements(el) if _local(c) == "query"]
    return ctx.condition(queries[0]) if queries else None


def copy_end(ctx: _Context, el: etree._Element, role: str) -> tuple[str, Any] | None:
    """One ``<from>`` or ``<to>`` as a copy source or target (see ``CopySpec``); None on error."""
    attribute = el.get("attribute")
    annotation = el.get("annotation")
    if annotation is not None:
        return ("annotation", (attribute or "", annotation))
    if attribute is not None:
        return ("attribute", attribute)
    for unsupported in ("partnerLink", "property", "endpointReference", "expressionLanguage"):
        if el.get(unsupported) is not None and not (unsupported == "expressionLanguage"
                                                    and "xpath1.0" in el.get(unsupported, "")):
            ctx.error(el.sourceline, f"<{role} {unsupported}=...> is not supported; copy from a variable, "
                      "an XPath 1.0 expression or a <literal>")
            return None
    variable = el.get("variable")
    if variable is not None:
        if not ctx.declared(variable):
            ctx.error(el.sourceline, f"<{role} variable={variable!r}>: the variable is not declared; declare it "
                      f"in the <variables> of the process or an enclosing scope (declared: {ctx.visible_text()})")
            return None
        if ctx.is_records(variable):
            return ("records", None)
        return ("variable", (variable, el.get("part"), _query(ctx, el)))
    literal = [c for c in _elements(el) if _local(c) == "literal"]
    if literal:
        if role == "to":
            ctx.error(el.sourceline, "<to> cannot be a <literal>")
            return None
        nodes = _elements(literal[0])
        if len(nodes) > 1:
            ctx.error(literal[0].sourceline, "a <literal> holds one element or text, not several elements")
            return None
        if nodes:
            return ("xml", etree.tostring(nodes[0], with_tail=False).decode())
        return ("literal", "".join(literal[0].itertext()))
    text = (el.text or "").strip()
    if not text:
        ctx.error(el.sourceline, f"<{role}> needs variable=\"name\", an XPath expression"
                  f"{' or a <literal>' if role == 'from' else ''} (or attribute=/annotation= for a record)")
        return None
    whole = _VAR_ONLY.fullmatch(text)
    if whole is not None and ctx.declared(whole.group(1)):
        name, part = whole.group(1), whole.group(2)
        if ctx.is_records(name):
            return ("records", None)
        return ("variable", (name, part, None))
    if role == "to":
        target = _records_target(ctx, text)
        if target is not None:
            return target
        path = _VAR_PATH.fullmatch(text)
        if path is None or not ctx.declared(path.group(1)):
            ctx.error(el.sourceline, f"<to>{text}</to>: a copy goes into a declared variable ($name, "
                      "$name.part/path) or an attribute of a record; declared variables: "
                      f"{ctx.visible_text()}")
            return None
        name, part, rest = path.group(1), path.group(2), path.group(3)
        if ctx.is_records(name):
            ctx.error(el.sourceline, f"<to>{text}</to>: records are written by attribute or annotation: "
                      "$request.records/rec:Record[n]/rec:Val[@key='x'], .../rec:A[@n='x']/rec:L/rec:V or "
                      ".../rec:An[@n='x'] (or <to attribute=\"x\"/>)")
            return None
        # the path is evaluated from the variable's value (an XPath over a bound
        # variable would see a copy of it, and the copy would go nowhere)
        relative = rest[1:] if not rest.startswith("//") else "." + rest
        query = ctx.condition(el)
        query = Condition(relative, query.line, query.namespaces, query.variables)
        return ("variable", (name, part, query))
    return ("expression", ctx.condition(el))
