"""Workflow XML -> frozen activity specs.

The whole dialect is the ``PARSERS`` table at the bottom: XML local name ->
parse function.  Parse functions collect errors (``file:line: message``) in
the context instead of raising, so one load reports every problem.

XML is parsed with entity resolution, DTD loading and network access off: a
workflow file cannot read other files or reach the network.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from engine._conditions import RECORD_NS
from engine._specs import (
    Activity,
    Assign,
    Catch,
    Condition,
    CopySpec,
    Empty,
    Exit,
    Flow,
    ForEach,
    If,
    InvokePipelet,
    InvokeWorkflow,
    LinkSource,
    RepeatUntil,
    Rethrow,
    Scope,
    Sequence,
    Throw,
    While,
)

__all__ = ["BPEL_NS", "PROC_NS", "ParsedFile", "parse_file", "parse_text"]

log = logging.getLogger(__name__)

BPEL_NS = "http://docs.oasis-open.org/wsbpel/2.0/process/executable"
PROC_NS = "http://www.eclipse.org/smila/processor"
_ACTIVITY_NS = {BPEL_NS, ""}
_EXT_NS = {PROC_NS, ""}

# Children of <process>/<scope> that declare things this engine has no use for.
_DECLARATIONS = {
    "import",
    "partnerLinks",
    "variables",
    "extensions",
    "correlationSets",
    "messageExchanges",
    "documentation",
}
_UNSUPPORTED_HANDLERS = {"eventHandlers", "compensationHandler", "terminationHandler"}
_STANDARD = {"targets", "sources", "documentation"}


def _local(el: etree._Element) -> str:
    return etree.QName(el).localname


def _ns(el: etree._Element) -> str:
    return etree.QName(el).namespace or ""


def _yes(value: str | None, default: bool = False) -> bool:
    if value is None:
        return default
    return value.strip().lower() in {"yes", "true"}


@dataclass
class _FlowFrame:
    links: dict[str, int]  # link name -> line of its declaration
    aid: int


@dataclass
class _Context:
    path: str
    aliases: Mapping[str, str]
    errors: list[str] = field(default_factory=list)
    next_aid: int = 0
    flows: list[_FlowFrame] = field(default_factory=list)
    loop_depth: int = 0
    handler_depth: int = 0
    suppress_join_failure: bool = False
    partner_links: dict[str, bool] = field(default_factory=dict)  # name -> has partnerRole
    # link name -> (flow aid, [(role, activity aid, line, loop depth, handler depth)])
    link_ends: dict[tuple[int, str], list[tuple[str, int, int, tuple[int, ...], tuple[int, ...]]]] = field(
        default_factory=dict
    )
    loop_stack: list[int] = field(default_factory=list)
    handler_stack: list[int] = field(default_factory=list)
    link_decl: dict[tuple[int, str], int] = field(default_factory=dict)
    invoked: list[tuple[str, int]] = field(default_factory=list)

    def error(self, line: int | None, message: str) -> None:
        self.errors.append(f"{self.path}:{line or 0}: {message}")

    def aid(self) -> int:
        self.next_aid += 1
        return self.next_aid


@dataclass
class ParsedFile:
    """What parsing one file gives: the process name, its body, and the errors."""

    name: str | None
    body: Activity | None
    version: str
    errors: list[str]
    invoked: list[tuple[str, int]]
    context: _Context | None = None


def _condition(ctx: _Context, el: etree._Element) -> Condition:
    text = (el.text or "").strip()
    if not text:
        ctx.error(el.sourceline, f"<{_local(el)}> is empty; write an XPath 1.0 expression")
    namespaces = tuple(sorted((p or "", u) for p, u in el.nsmap.items()))
    return Condition(expression=text or "false()", line=el.sourceline or 0, namespaces=namespaces)


def _elements(el: etree._Element) -> list[etree._Element]:
    return [c for c in el if isinstance(c.tag, str)]


def _standard(ctx: _Context, el: etree._Element, flow_aid: int | None = None) -> dict[str, Any]:
    """Name, link targets/sources and join settings of any activity."""
    targets: list[str] = []
    sources: list[LinkSource] = []
    join: Condition | None = None
    for child in _elements(el):
        local = _local(child)
        if local == "targets":
            for t in _elements(child):
                if _local(t) == "joinCondition":
                    join = _condition(ctx, t)
                elif _local(t) == "target":
                    name = t.get("linkName")
                    if not name:
                        ctx.error(t.sourceline, "<target> needs linkName")
                        continue
                    targets.append(name)
                    _link_end(ctx, name, "target", t.sourceline)
                else:
                    ctx.error(t.sourceline, f"<targets> may hold <target> and <joinCondition>, not <{_local(t)}>")
        elif local == "sources":
            for s in _elements(child):
                if _local(s) != "source" or not s.get("linkName"):
                    ctx.error(s.sourceline, "<sources> holds <source linkName=...> elements")
                    continue
                cond = None
                for sc in _elements(s):
                    if _local(sc) == "transitionCondition":
                        cond = _condition(ctx, sc)
                name = s.get("linkName", "")
                sources.append(LinkSource(link=name, condition=cond, line=s.sourceline or 0))
                _link_end(ctx, name, "source", s.sourceline)
    suppress = el.get("suppressJoinFailure")
    return {
        "line": el.sourceline or 0,
        "name": el.get("name"),
        "targets": tuple(targets),
        "sources": tuple(sources),
        "join_condition": join,
        "suppress_join_failure": _yes(suppress, ctx.suppress_join_failure),
    }


def _link_end(ctx: _Context, name: str, role: str, line: int | None) -> None:
    for frame in reversed(ctx.flows):
        if name in frame.links:
            ctx.link_ends.setdefault((frame.aid, name), []).append(
                (role, ctx.next_aid + 1, line or 0, tuple(ctx.loop_stack), tuple(ctx.handler_stack))
            )
            return
    ctx.error(line, f"link {name!r} is not declared in an enclosing <flow><links>; declare it there")


def _with_suppress(ctx: _Context, el: etree._Element, fn: Callable[[], Activity | None]) -> Activity | None:
    """Run ``fn`` with this element's ``suppressJoinFailure`` inherited by its children."""
    saved = ctx.suppress_join_failure
    ctx.suppress_join_failure = _yes(el.get("suppressJoinFailure"), saved)
    try:
        return fn()
    finally:
        ctx.suppress_join_failure = saved


def parse_activity(ctx: _Context, el: etree._Element) -> Activity | None:
    """Parse one activity element (``None`` when it is not one; error recorded)."""
    local = _local(el)
    ns = _ns(el)
    parser = PARSERS.get(local)
    if parser is None or (ns not in _ACTIVITY_NS and not (ns in _EXT_NS and local in _EXTENSION_TAGS)):
        ctx.error(
            el.sourceline,
            f"unknown element <{el.prefix + ':' if el.prefix else ''}{local}>; "
            f"expected one of: {', '.join(sorted(PARSERS))}",
        )
        return None
    return _with_suppress(ctx, el, lambda: parser(ctx, el))


def _activity_children(ctx: _Context, el: etree._Element, skip: set[str] = frozenset()) -> list[etree._Element]:  # type: ignore[assignment]
    return [c for c in _elements(el) if _local(c) not in _STANDARD and _local(c) not in skip]


def _one_activity(ctx: _Context, el: etree._Element, skip: set[str] = frozenset()) -> Activity | None:  # type: ignore[assignment]
    kids = _activity_children(ctx, el, skip)
    if len(kids) != 1:
        ctx.error(
            el.sourceline,
            f"<{_local(el)}> must contain exactly one activity, found {len(kids)}"
            + ("" if not kids else f" ({', '.join('<' + _local(k) + '>' for k in kids)}); wrap them in <sequence>"),
        )
        return parse_activity(ctx, kids[0]) if kids else None
    return parse_activity(ctx, kids[0])


def _parse_sequence(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    body = [a for c in _activity_children(ctx, el) if (a := parse_activity(ctx, c)) is not None]
    if not body:
        ctx.error(el.sourceline, "<sequence> is empty; add an activity or use <empty/>")
    return Sequence(aid=aid, body=tuple(body), **common)


def _parse_flow(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    links: dict[str, int] = {}
    for child in _elements(el):
        if _local(child) == "links":
            for link in _elements(child):
                name = link.get("name")
                if _local(link) != "link" or not name:
                    ctx.error(link.sourceline, "<links> holds <link name=...> elements")
                    continue
                if name in links:
                    ctx.error(link.sourceline, f"link {name!r} is declared twice in this <flow> (line {links[name]})")
                links[name] = link.sourceline or 0
                ctx.link_decl[(aid, name)] = link.sourceline or 0
    ctx.flows.append(_FlowFrame(links=links, aid=aid))
    try:
        body = [a for c in _activity_children(ctx, el, {"links"}) if (a := parse_activity(ctx, c)) is not None]
    finally:
        ctx.flows.pop()
    if not body:
        ctx.error(el.sourceline, "<flow> is empty; add branches")
    return Flow(aid=aid, body=tuple(body), links=tuple(links), order=tuple(range(len(body))), **common)


def _parse_if(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    branches: list[tuple[Condition, Activity]] = []
    otherwise: Activity | None = None
    condition: Condition | None = None
    for child in _activity_children(ctx, el):
        local = _local(child)
        if local == "condition":
            condition = _condition(ctx, child)
        elif local == "elseif":
            cond_el = [c for c in _elements(child) if _local(c) == "condition"]
            if not cond_el:
                ctx.error(child.sourceline, "<elseif> needs a <condition>")
                continue
            act = _one_activity(ctx, child, {"condition"})
            if act is not None:
                branches.append((_condition(ctx, cond_el[0]), act))
        elif local == "else":
            otherwise = _one_activity(ctx, child)
        elif condition is not None and not branches:
            act = parse_activity(ctx, child)
            if act is not None:
                branches.append((condition, act))
        else:
            ctx.error(child.sourceline, f"<if> expects <condition>, one activity, <elseif>..., <else>; not <{local}> here")
    if condition is None:
        ctx.error(el.sourceline, "<if> needs a <condition> as its first child")
    elif not branches or branches[0][0] is not condition:
        ctx.error(el.sourceline, "<if> needs one activity after its <condition>")
    return If(aid=aid, branches=tuple(branches), otherwise=otherwise, **common)


def _parse_loop(ctx: _Context, el: etree._Element, cls: type[While] | type[RepeatUntil]) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    conds = [c for c in _elements(el) if _local(c) == "condition"]
    if len(conds) != 1:
        ctx.error(el.sourceline, f"<{cls.kind}> needs exactly one <condition>")
    ctx.loop_depth += 1
    ctx.loop_stack.append(aid)
    try:
        body = _one_activity(ctx, el, {"condition"})
    finally:
        ctx.loop_depth -= 1
        ctx.loop_stack.pop()
    return cls(aid=aid, condition=_condition(ctx, conds[0]) if conds else None, body=body, **common)


def _parse_foreach(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    ignored = {"startCounterValue", "finalCounterValue", "completionCondition"}
    for c in _elements(el):
        if _local(c) in ignored:
            # Running the body for other iterations than the author wrote would be
            # worse than refusing the file.
            ctx.error(c.sourceline, f"<forEach> runs its body once per record of the instance; <{_local(c)}> "
                      "is not supported: remove it (select records with an <if> inside the body instead)")
    ctx.loop_depth += 1
    ctx.loop_stack.append(aid)
    try:
        body = _one_activity(ctx, el, ignored)
    finally:
        ctx.loop_depth -= 1
        ctx.loop_stack.pop()
    return ForEach(aid=aid, body=body, parallel=_yes(el.get("parallel")), counter_name=el.get("counterName"), **common)


def _fault_name(value: str | None) -> str | None:
    if value is None:
        return None
    return value.split(":", 1)[-1].strip()


def _parse_handlers(ctx: _Context, el: etree._Element) -> list[Catch]:
    handlers: list[Catch] = []
    seen: set[str | None] = set()
    ctx.handler_depth += 1
    try:
        for h in _elements(el):
            local = _local(h)
            if local not in {"catch", "catchAll"}:
                ctx.error(h.sourceline, f"<faultHandlers> holds <catch> and <catchAll>, not <{local}>")
                continue
            name = _fault_name(h.get("faultName")) if local == "catch" else None
            if local == "catch" and not name:
                ctx.error(h.sourceline, "<catch> needs faultName (use <catchAll> to catch every fault)")
                continue
            if name in seen:
                ctx.error(h.sourceline, f"a second handler for {name or 'catchAll'!r} in the same scope")
            seen.add(name)
            ctx.handler_stack.append(h.sourceline or 0)
            try:
                act = _one_activity(ctx, h)
            finally:
                ctx.handler_stack.pop()
            if act is not None:
                handlers.append(Catch(fault_name=name, activity=act, line=h.sourceline or 0))
    finally:
        ctx.handler_depth -= 1
    # catchAll goes last so specific catches win regardless of document order.
    return sorted(handlers, key=lambda c: c.fault_name is None)


def _parse_scope(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    handlers: list[Catch] = []
    for c in _elements(el):
        if _local(c) == "faultHandlers":
            handlers = _parse_handlers(ctx, c)
        elif _local(c) in _UNSUPPORTED_HANDLERS:
            ctx.error(c.sourceline, f"<{_local(c)}> is not supported; remove it (use <faultHandlers>)")
    skip = {"faultHandlers", *_DECLARATIONS, *_UNSUPPORTED_HANDLERS}
    body = _one_activity(ctx, el, skip)
    return Scope(aid=aid, body=body, handlers=tuple(handlers), **common)


def _parse_throw(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    name = _fault_name(el.get("faultName"))
    if not name:
        ctx.error(el.sourceline, "<throw> needs faultName")
    return Throw(aid=ctx.aid(), fault_name=name or "fault", **common)


def _parse_rethrow(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    if ctx.handler_depth == 0:
        ctx.error(el.sourceline, "<rethrow> is only allowed inside a <catch> or <catchAll>; use <throw faultName=...>")
    return Rethrow(aid=ctx.aid(), **common)


def _parse_simple(cls: type[Activity]) -> Callable[[_Context, etree._Element], Activity]:
    def parse(ctx: _Context, el: etree._Element) -> Activity:
        common = _standard(ctx, el)
        return cls(aid=ctx.aid(), **common)

    return parse


# SMILA writes record attributes with XPath targets:
# $request.records/rec:Record[1]/rec:Val[@key="x"]/text()  (or $record/Val[@key='x'])
_RECORD_TARGET = re.compile(
    r"""\$(?:request\.records/(?:\w+:)?Record\[(\d+)\]|record)/(?:\w+:)?Val\[@key=(?:"([^"]+)"|'([^']+)')\](?:/text\(\))?"""
)


def _copy_end(ctx: _Context, el: etree._Element, role: str) -> tuple[str, Any] | None:
    attribute = el.get("attribute")
    annotation = el.get("annotation")
    if annotation is not None:
        return ("annotation", (attribute or "", annotation))
    if attribute is not None:
        return ("attribute", attribute)
    if el.get("variable") is not None:
        return ("variable", el.get("variable"))
    literal = [c for c in _elements(el) if _local(c) == "literal"]
    if literal:
        if role == "to":
            ctx.error(el.sourceline, "<to> cannot be a <literal>")
            return None
        return ("literal", "".join(literal[0].itertext()))
    text = (el.text or "").strip()
    record_target = _RECORD_TARGET.fullmatch(text)
    if record_target and role == "to":
        index = int(record_target.group(1) or 1)
        return ("record_attribute", (index, record_target.group(2) or record_target.group(3)))
    if text.startswith("$") and text[1:].replace(".", "").replace("_", "").isalnum() and text not in {"$record", "$records"}:
        return ("variable", text[1:])
    if role == "from" and text:
        return ("expression", _condition(ctx, el))
    ctx.error(
        el.sourceline,
        f"<{role}> needs attribute=\"path\"{' or an XPath expression or <literal>' if role == 'from' else ''}"
        " (annotation=\"name\" addresses an annotation)",
    )
    return None


def _parse_assign(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    copies: list[CopySpec] = []
    for c in _activity_children(ctx, el):
        if _local(c) != "copy":
            ctx.error(c.sourceline, f"<assign> holds <copy> elements, not <{_local(c)}>")
            continue
        ends = {_local(x): x for x in _elements(c)}
        if set(ends) != {"from", "to"}:
            ctx.error(c.sourceline, "<copy> needs one <from> and one <to>")
            continue
        source = _copy_end(ctx, ends["from"], "from")
        target = _copy_end(ctx, ends["to"], "to")
        if source is None or target is None:
            continue
        if (source[0] == "variable") != (target[0] == "variable"):
            ctx.error(
                c.sourceline,
                "<copy> between a BPEL variable and a record is not supported; "
                "copy attributes with attribute=\"...\" on <from> and <to>",
            )
            continue
        copies.append(CopySpec(source=source, target=target, line=c.sourceline or 0))
    if not copies:
        ctx.error(el.sourceline, "<assign> needs at least one <copy>")
    return Assign(aid=aid, copies=tuple(copies), **common)


def _typed(ctx: _Context, text: str, kind: str, line: int | None) -> Any:
    kind = kind.lower()
    try:
        if kind in {"long", "int", "integer"}:
            return int(text)
        if kind in {"double", "float"}:
            return float(text)
        if kind == "boolean":
            if text.lower() not in {"true", "false"}:
                raise ValueError(f"not a boolean: {text!r}")
            return text.lower() == "true"
    except ValueError as e:
        ctx.error(line, f"configuration value of type {kind!r}: {e}")
    return text


def _config_value(ctx: _Context, el: etree._Element) -> Any:
    local = _local(el)
    if local == "Val":
        return _typed(ctx, "".join(el.itertext()).strip(), el.get("type") or "string", el.sourceline)
    if local == "Seq":
        return [_config_value(ctx, c) for c in _elements(el)]
    if local == "Map":
        return _config_map(ctx, _elements(el))
    ctx.error(el.sourceline, f"unexpected <{local}> in configuration; use rec:Val, rec:Seq, rec:Map or proc:param")
    return None


def _config_map(ctx: _Context, items: list[etree._Element]) -> dict[str, Any]:
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
        elif local == "Property":  # SMILA's older form: <proc:Property name=..><proc:Value>..</proc:Value>
            values = [_typed(ctx, "".join(v.itertext()).strip(), item.get("type") or "string", v.sourceline)
                      for v in _elements(item) if _local(v) == "Value"]
            config[key] = values[0] if len(values) == 1 else values
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
    return _typed(ctx, (el.text or "").strip(), el.get("type") or "string", el.sourceline)


def _parse_invoke_pipelet(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    cls_name = ""
    config: dict[str, Any] = {}
    for c in _elements(el):
        local = _local(c)
        if local == "pipelet":
            cls_name = (c.get("class") or "").strip()
            if not cls_name:
                ctx.error(c.sourceline, "<pipelet> needs class=\"package.module.Class\"")
        elif local == "configuration":
            config = _config_map(ctx, _elements(c))
        elif local in {"variables", "setAnnotations", "documentation"}:
            continue
        elif local not in _STANDARD:
            ctx.error(c.sourceline, f"<invokePipelet> does not take <{local}>; expected <pipelet>, <configuration>")
    if not cls_name and not any(_local(c) == "pipelet" for c in _elements(el)):
        ctx.error(el.sourceline, "<invokePipelet> needs <proc:pipelet class=\"package.module.Class\"/>")
    cls_name = ctx.aliases.get(cls_name, cls_name)
    return InvokePipelet(aid=aid, pipelet_class=cls_name, config=config, **common)


def _parse_invoke_workflow(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    name = (el.get("workflow") or "").strip()
    if not name:
        ctx.error(el.sourceline, "<invokeWorkflow> needs workflow=\"ProcessName\"")
    ctx.invoked.append((name, el.sourceline or 0))
    return InvokeWorkflow(aid=ctx.aid(), workflow=name, **common)


def _parse_invoke(ctx: _Context, el: etree._Element) -> Activity:
    """BPEL ``invoke`` of another pipeline through a partner link (SMILA's superpipeline)."""
    common = _standard(ctx, el)
    link = el.get("partnerLink") or ""
    if not ctx.partner_links.get(link):
        ctx.error(
            el.sourceline,
            f"<invoke partnerLink={link!r}>: only partner links with partnerRole name a sub-workflow; "
            "use <proc:invokeWorkflow workflow=\"Name\"/>",
        )
    ctx.invoked.append((link, el.sourceline or 0))
    return InvokeWorkflow(aid=ctx.aid(), workflow=link, **common)


def _parse_extension_activity(ctx: _Context, el: etree._Element) -> Activity | None:
    kids = _elements(el)
    if len(kids) != 1 or _local(kids[0]) not in _EXTENSION_TAGS:
        ctx.error(el.sourceline, "<extensionActivity> must hold one <proc:invokePipelet> or <proc:invokeWorkflow>")
        return None
    inner = kids[0]
    return _with_suppress(ctx, inner, lambda: PARSERS[_local(inner)](ctx, inner))


def _parse_ignored(ctx: _Context, el: etree._Element) -> Activity:
    """``receive``/``reply`` carry no meaning here: they run as ``empty``."""
    common = _standard(ctx, el)
    return Empty(aid=ctx.aid(), **common)


PARSERS: dict[str, Callable[[_Context, etree._Element], Activity | None]] = {
    "sequence": _parse_sequence,
    "flow": _parse_flow,
    "if": _parse_if,
    "while": lambda ctx, el: _parse_loop(ctx, el, While),
    "repeatUntil": lambda ctx, el: _parse_loop(ctx, el, RepeatUntil),
    "forEach": _parse_foreach,
    "scope": _parse_scope,
    "throw": _parse_throw,
    "rethrow": _parse_rethrow,
    "exit": _parse_simple(Exit),
    "empty": _parse_simple(Empty),
    "assign": _parse_assign,
    "invokePipelet": _parse_invoke_pipelet,
    "invokeWorkflow": _parse_invoke_workflow,
    "extensionActivity": _parse_extension_activity,
    "invoke": _parse_invoke,
    "receive": _parse_ignored,
    "reply": _parse_ignored,
}
_EXTENSION_TAGS = {"invokePipelet", "invokeWorkflow"}


def _xml_parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False, remove_comments=True
    )


def parse_text(text: bytes, path: str, aliases: Mapping[str, str] | None = None) -> ParsedFile:
    """Parse workflow XML ``text`` (read from ``path``) into specs; never raises for bad input."""
    version = hashlib.sha256(text).hexdigest()
    ctx = _Context(path=path, aliases=dict(aliases or {}))
    try:
        root = etree.fromstring(text, _xml_parser())
    except etree.XMLSyntaxError as e:
        line = e.lineno if getattr(e, "lineno", None) else 0
        msg = e.msg if getattr(e, "msg", None) else str(e)
        return ParsedFile(None, None, version, [f"{path}:{line}: malformed XML: {msg}"], [])
    for node in root.iter():
        if isinstance(node, etree._Entity):
            # resolve_entities=False leaves them in the tree; never expand them
            line = node.sourceline or (node.getparent().sourceline if node.getparent() is not None else 0)
            ctx.error(line, f"entity reference {node.text} is not allowed in workflow files; write the text itself")
    if _local(root) != "process" or _ns(root) not in _ACTIVITY_NS:
        ctx.error(root.sourceline, f"the root element must be BPEL <process>, not <{_local(root)}> ({_ns(root) or 'no namespace'})")
        return ParsedFile(None, None, version, ctx.errors, [], ctx)
    name = (root.get("name") or "").strip()
    if not name:
        ctx.error(root.sourceline, "<process> needs name=\"...\" (workflows are named by it)")
    ctx.suppress_join_failure = _yes(root.get("suppressJoinFailure"))
    for child in _elements(root):
        if _local(child) == "partnerLinks":
            for pl in _elements(child):
                if pl.get("name"):
                    ctx.partner_links[pl.get("name", "")] = pl.get("partnerRole") is not None
    handlers: list[Catch] = []
    body_elements: list[etree._Element] = []
    for child in _elements(root):
        local = _local(child)
        if local in _DECLARATIONS:
            continue
        if local == "faultHandlers":
            handlers = _parse_handlers(ctx, child)
        elif local in _UNSUPPORTED_HANDLERS:
            ctx.error(child.sourceline, f"<{local}> is not supported; remove it")
        else:
            body_elements.append(child)
    body: Activity | None = None
    if len(body_elements) != 1:
        ctx.error(root.sourceline, f"<process> must hold exactly one activity, found {len(body_elements)}")
    if body_elements:
        body = parse_activity(ctx, body_elements[0])
    if body is not None and handlers:
        body = Scope(aid=0, line=root.sourceline or 0, name=name, body=body, handlers=tuple(handlers))
    return ParsedFile(name or None, body, version, ctx.errors, ctx.invoked, ctx)


def parse_file(path: str | os.PathLike[str], aliases: Mapping[str, str] | None = None) -> ParsedFile:
    """Read and parse ``path``."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            text = f.read()
    except OSError as e:
        return ParsedFile(None, None, "", [f"{p}:0: cannot read the file: {e.strerror or e}"], [])
    return parse_text(text, p, aliases)
