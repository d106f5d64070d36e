"""Workflow XML -> frozen activity specs.

The whole dialect is the ``PARSERS`` table at the bottom: XML local name ->
parse function.  Parse functions collect errors (``file:line: message``) in
the context instead of raising, so one load reports every problem.
Configuration, variables and copy ends (both SMILA syntaxes) are read by
``engine._parse_data``.

XML is parsed with entity resolution, DTD loading and network access off: a
workflow file cannot read other files or reach the network.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from engine._parse_data import PROC_NS, annotations_config, config_map, copy_end, variable_decls
from engine._specs import (
    Activity,
    Assign,
    Catch,
    Compensate,
    Condition,
    CopySpec,
    Empty,
    Exit,
    Flow,
    ForEach,
    If,
    InvokePipelet,
    InvokeService,
    InvokeWorkflow,
    LinkSource,
    RepeatUntil,
    Rethrow,
    Scope,
    Sequence,
    Throw,
    Variable,
    While,
    walk,
)

__all__ = ["BPEL_NS", "PROC_NS", "ParsedFile", "parse_file", "parse_text"]

log = logging.getLogger(__name__)

BPEL_NS = "http://docs.oasis-open.org/wsbpel/2.0/process/executable"
_ACTIVITY_NS = {BPEL_NS, ""}
_EXT_NS = {PROC_NS, ""}

# Children of <process>/<scope> that declare things this engine has no use for.
_DECLARATIONS = {
    "import",
    "partnerLinks",
    "extensions",
    "correlationSets",
    "messageExchanges",
    "documentation",
}
_SCOPE_PARTS = {"variables", "faultHandlers", "compensationHandler", "terminationHandler", "eventHandlers"}
_STANDARD = {"targets", "sources", "documentation"}
_EVENT_HANDLERS = (
    "<eventHandlers> is not supported: a Chalk workflow instance is one message's records, run to its end "
    "in a batch (on Spark); it cannot receive further messages or wait for alarms while it runs. Remove "
    "them: do that work in the process body, or in another workflow that a listener rule starts"
)
# implicit in every workflow: SMILA's $request and $result are the instance's records
_IMPLICIT = {name: Variable(name=name, kind="records", line=0) for name in ("request", "result")}

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
    services: Mapping[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    next_aid: int = 0
    flows: list[_FlowFrame] = field(default_factory=list)
    loop_depth: int = 0
    handler_depth: int = 0
    suppress_join_failure: bool = False
    partner_links: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # name -> (partnerRole, pipeline)
    # link name -> (flow aid, [(role, activity aid, line, loop depth, handler depth)])
    link_ends: dict[tuple[int, str], list[tuple[str, int, int, tuple[int, ...], tuple[int, ...]]]] = field(
        default_factory=dict
    )
    loop_stack: list[int] = field(default_factory=list)
    handler_stack: list[int] = field(default_factory=list)
    link_decl: dict[tuple[int, str], int] = field(default_factory=dict)
    invoked: list[tuple[str, int]] = field(default_factory=list)
    # variables in scope, innermost last (a forEach counter is a one-variable level)
    var_scopes: list[dict[str, Variable]] = field(default_factory=lambda: [dict(_IMPLICIT)])
    # where a <compensate> stands: "handler" (allowed) or "scope" (not), innermost last
    compensation_context: list[str] = field(default_factory=list)

    def error(self, line: int | None, message: str) -> None:
        self.errors.append(f"{self.path}:{line or 0}: {message}")

    def aid(self) -> int:
        self.next_aid += 1
        return self.next_aid

    def lookup(self, name: str) -> Variable | None:
        for level in reversed(self.var_scopes):
            if name in level:
                return level[name]
        return None

    def declared(self, name: str) -> bool:
        return self.lookup(name) is not None

    def is_records(self, name: str) -> bool:
        var = self.lookup(name)
        return var is not None and var.kind == "records"

    def visible(self) -> tuple[str, ...]:
        return tuple(sorted({n for level in self.var_scopes for n in level}))

    def visible_text(self) -> str:
        return ", ".join("$" + n for n in self.visible()) or "none"

    def condition(self, el: etree._Element) -> Condition:
        """The XPath expression in ``el`` with the namespaces and variables in scope there."""
        text = (el.text or "").strip()
        if not text:
            self.error(el.sourceline, f"<{_local(el)}> is empty; write an XPath 1.0 expression")
        namespaces = tuple(sorted((p or "", u) for p, u in el.nsmap.items()))
        return Condition(expression=text or "false()", line=el.sourceline or 0, namespaces=namespaces,
                         variables=self.visible())


@dataclass
class ParsedFile:
    """What parsing one file gives: the process name, its body, and the errors."""

    name: str | None
    body: Activity | None
    version: str
    errors: list[str]
    invoked: list[tuple[str, int]]
    context: _Context | None = None
    variables: tuple[Variable, ...] = ()


def _condition(ctx: _Context, el: etree._Element) -> Condition:
    return ctx.condition(el)


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
    parts = {_local(c): c for c in _elements(el) if _local(c) in _FOREACH_PARTS}
    start = _condition(ctx, parts["startCounterValue"]) if "startCounterValue" in parts else None
    final = _condition(ctx, parts["finalCounterValue"]) if "finalCounterValue" in parts else None
    if (start is None) != (final is None):
        ctx.error(el.sourceline, "<forEach> needs both <startCounterValue> and <finalCounterValue> "
                  "(or neither: then it runs once per record of the instance)")
        start = final = None
    counter = (el.get("counterName") or "").strip() or None
    if start is not None and counter is None:
        ctx.error(el.sourceline, "<forEach> with counter values needs counterName=\"name\" (the variable "
                  "that holds the counter in its body)")
    parallel = _yes(el.get("parallel"))
    branches: Condition | None = None
    successful_only = False
    if "completionCondition" in parts:
        inner = _elements(parts["completionCondition"])
        if len(inner) != 1 or _local(inner[0]) != "branches":
            ctx.error(parts["completionCondition"].sourceline,
                      "<completionCondition> holds one <branches> expression (the number of branches to wait for)")
        else:
            branches = _condition(ctx, inner[0])
            successful_only = _yes(inner[0].get("successfulBranchesOnly"))
            if start is None and parallel:
                ctx.error(inner[0].sourceline, "<completionCondition> on a parallel <forEach> over records: "
                          "its branches (one per record) run as one batched call, so none can be stopped "
                          "early; use parallel=\"no\", or a <forEach> with counter values")
    ctx.loop_depth += 1
    ctx.loop_stack.append(aid)
    ctx.var_scopes.append({counter: Variable(name=counter, kind="counter", line=el.sourceline or 0)}
                          if counter else {})
    try:
        body = _one_activity(ctx, el, set(_FOREACH_PARTS))
    finally:
        ctx.loop_depth -= 1
        ctx.loop_stack.pop()
        ctx.var_scopes.pop()
    return ForEach(aid=aid, body=body, parallel=parallel, counter_name=counter, start=start, final=final,
                   branches=branches, successful_only=successful_only, **common)


_FOREACH_PARTS = ("startCounterValue", "finalCounterValue", "completionCondition")


def _fault_name(value: str | None) -> str | None:
    if value is None:
        return None
    return value.split(":", 1)[-1].strip()


def _handler_activity(ctx: _Context, el: etree._Element) -> Activity | None:
    """The one activity of a fault, compensation or termination handler."""
    ctx.handler_stack.append(el.sourceline or 0)
    ctx.handler_depth += 1
    ctx.compensation_context.append("handler")
    try:
        return _one_activity(ctx, el)
    finally:
        ctx.handler_stack.pop()
        ctx.handler_depth -= 1
        ctx.compensation_context.pop()


def _parse_handlers(ctx: _Context, el: etree._Element) -> list[Catch]:
    handlers: list[Catch] = []
    seen: set[str | None] = set()
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
        if h.get("faultVariable") is not None:
            ctx.error(h.sourceline, "<catch faultVariable=...> is not supported: faults carry no data "
                      "here; remove the attribute")
        act = _handler_activity(ctx, h)
        if act is not None:
            handlers.append(Catch(fault_name=name, activity=act, line=h.sourceline or 0))
    # catchAll goes last so specific catches win regardless of document order.
    return sorted(handlers, key=lambda c: c.fault_name is None)


def _direct_scopes(act: Activity | None) -> list[Scope]:
    """Scopes directly inside ``act`` (not inside another scope): compensateScope targets."""
    if act is None:
        return []
    if isinstance(act, Scope):
        return [act]
    out: list[Scope] = []
    for child in act.children():
        out += _direct_scopes(child)
    return out


def _check_compensation_targets(ctx: _Context, owner: str, body: Activity | None,
                                handlers: Iterable[Activity | None]) -> None:
    names = [s.name for s in _direct_scopes(body) if s.name]
    for handler in handlers:
        if handler is None:
            continue
        for a in walk(handler):
            if isinstance(a, Scope) and a is not handler:
                continue
            if isinstance(a, Compensate) and a.target is not None:
                found = names.count(a.target)
                if found == 0:
                    ctx.error(a.line, f"{a.label()}: no scope named {a.target!r} directly inside {owner}; "
                              f"scopes there: {', '.join(repr(n) for n in sorted(set(names))) or 'none'}")
                elif found > 1:
                    ctx.error(a.line, f"{a.label()}: {found} scopes named {a.target!r} directly inside "
                              f"{owner}; give them distinct names")


def _parse_scope(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    handlers: list[Catch] = []
    parts = [c for c in _elements(el) if _local(c) in _SCOPE_PARTS]
    declared: list[Variable] = []
    for c in parts:
        if _local(c) == "variables":
            declared += variable_decls(ctx, c)
        elif _local(c) == "eventHandlers":
            ctx.error(c.sourceline, _EVENT_HANDLERS)
    ctx.var_scopes.append({v.name: v for v in declared})
    compensation: Activity | None = None
    termination: Activity | None = None
    try:
        for c in parts:
            local = _local(c)
            if local == "faultHandlers":
                handlers = _parse_handlers(ctx, c)
            elif local == "compensationHandler":
                compensation = _handler_activity(ctx, c)
            elif local == "terminationHandler":
                termination = _handler_activity(ctx, c)
        ctx.compensation_context.append("scope")
        try:
            body = _one_activity(ctx, el, {*_DECLARATIONS, *_SCOPE_PARTS})
        finally:
            ctx.compensation_context.pop()
    finally:
        ctx.var_scopes.pop()
    owner = f"<scope{' ' + repr(common['name']) if common['name'] else ''}> (line {el.sourceline})"
    _check_compensation_targets(ctx, owner, body, [h.activity for h in handlers] + [compensation, termination])
    return Scope(aid=aid, body=body, handlers=tuple(handlers), variables=tuple(declared),
                 compensation=compensation, termination=termination, **common)


def _parse_compensate(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    target: str | None = None
    if _local(el) == "compensateScope":
        target = (el.get("target") or "").strip()
        if not target:
            ctx.error(el.sourceline, "<compensateScope> needs target=\"scope name\"")
    if not ctx.compensation_context or ctx.compensation_context[-1] != "handler":
        ctx.error(el.sourceline, f"<{_local(el)}> is only allowed in a <faultHandlers>, <compensationHandler> "
                  "or <terminationHandler> (it undoes the completed scopes of the scope that handler belongs to)")
    return Compensate(aid=ctx.aid(), target=target, **common)


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
        source = copy_end(ctx, ends["from"], "from")
        target = copy_end(ctx, ends["to"], "to")
        if source is None or target is None:
            continue
        if (source[0] == "records") != (target[0] == "records"):
            ctx.error(c.sourceline, "<copy> between a records variable (proc:ProcessorMessage, such as $request) "
                      "and another value: copy single values, from $request.records/rec:Record[n]/... or "
                      "into $request.records/rec:Record[n]/rec:Val[@key='x']")
            continue
        copies.append(CopySpec(source=source, target=target, line=c.sourceline or 0,
                               keep_name=_yes(c.get("keepSrcElementName"))))
    if not copies:
        ctx.error(el.sourceline, "<assign> needs at least one <copy>")
    return Assign(aid=aid, copies=tuple(copies), **common)


def _merge_config(ctx: _Context, config: dict[str, Any], more: dict[str, Any], line: int | None) -> None:
    for key, value in more.items():
        if key in config:
            ctx.error(line, f"configuration key {key!r} is given twice")
        config[key] = value


def _configuration(ctx: _Context, el: etree._Element, tag: str) -> dict[str, Any]:
    """The configuration of an invokePipelet/invokeService from all its configuration elements."""
    config: dict[str, Any] = {}
    for c in _elements(el):
        local = _local(c)
        if local in {"configuration", "PipeletConfiguration"}:
            _merge_config(ctx, config, config_map(ctx, _elements(c)), c.sourceline)
        elif local == "setAnnotations":
            _merge_config(ctx, config, annotations_config(ctx, c), c.sourceline)
        elif local in {"pipelet", "service", "variables", "documentation"} or local in _STANDARD:
            continue
        else:
            ctx.error(c.sourceline, f"<{tag}> does not take <{local}>; expected "
                      f"{'<pipelet>' if tag == 'invokePipelet' else '<service>'}, <configuration>, "
                      "<PipeletConfiguration>, <setAnnotations>")
    return config


def _parse_invoke_pipelet(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    aid = ctx.aid()
    cls_name = ""
    found = [c for c in _elements(el) if _local(c) == "pipelet"]
    for c in found:
        cls_name = (c.get("class") or "").strip()
        if not cls_name:
            ctx.error(c.sourceline, "<pipelet> needs class=\"package.module.Class\"")
    if not found:
        ctx.error(el.sourceline, "<invokePipelet> needs <proc:pipelet class=\"package.module.Class\"/>")
    config = _configuration(ctx, el, "invokePipelet")
    return InvokePipelet(aid=aid, pipelet_class=ctx.aliases.get(cls_name, cls_name), config=config,
                         requested=cls_name, **common)


def _parse_invoke_service(ctx: _Context, el: etree._Element) -> Activity:
    """SMILA's older ``invokeService``: a processing service by name, through the service table."""
    common = _standard(ctx, el)
    aid = ctx.aid()
    services = [c for c in _elements(el) if _local(c) == "service"]
    name = (services[0].get("name") or "").strip() if services else ""
    if not name:
        ctx.error(services[0].sourceline if services else el.sourceline,
                  "<invokeService> needs <proc:service name=\"ServiceName\"/>")
    config = _configuration(ctx, el, "invokeService")
    target = ctx.services.get(name, name if "." in name else "")
    return InvokePipelet(aid=aid, pipelet_class=target, config=config, requested=name, service=True, **common)


def _parse_invoke_workflow(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    name = (el.get("workflow") or "").strip()
    if not name:
        ctx.error(el.sourceline, "<invokeWorkflow> needs workflow=\"ProcessName\"")
    ctx.invoked.append((name, el.sourceline or 0))
    return InvokeWorkflow(aid=ctx.aid(), workflow=name, **common)


def _parse_invoke(ctx: _Context, el: etree._Element) -> Activity:
    """BPEL ``invoke``: another pipeline through its partner link (SMILA's superpipeline), or a
    partner service (a message service from the service table, by partner link name)."""
    common = _standard(ctx, el)
    link = el.get("partnerLink") or ""
    has_role, pipeline = ctx.partner_links.get(link, (False, False))
    if not has_role:
        ctx.error(
            el.sourceline,
            f"<invoke partnerLink={link!r}>: only partner links with partnerRole name a sub-workflow or a "
            "service; use <proc:invokeWorkflow workflow=\"Name\"/>",
        )
    if pipeline or not has_role:
        ctx.invoked.append((link, el.sourceline or 0))
        return InvokeWorkflow(aid=ctx.aid(), workflow=link, **common)
    for c in _elements(el):
        if _local(c) in {"toParts", "fromParts", "correlations"}:
            ctx.error(c.sourceline, f"<invoke> with <{_local(c)}> is not supported; use inputVariable= "
                      "and outputVariable=")
    variables = {}
    for attr in ("inputVariable", "outputVariable"):
        name = el.get(attr)
        if name is not None and not ctx.declared(name):
            ctx.error(el.sourceline, f"<invoke {attr}={name!r}>: the variable is not declared")
        variables[attr] = name
    return InvokeService(aid=ctx.aid(), partner_link=link, operation=el.get("operation") or "",
                         input_variable=variables["inputVariable"], output_variable=variables["outputVariable"],
                         service_class=ctx.services.get(link, link if "." in link else ""), **common)


def _parse_extension_activity(ctx: _Context, el: etree._Element) -> Activity | None:
    kids = _elements(el)
    if len(kids) != 1 or _local(kids[0]) not in _EXTENSION_TAGS:
        ctx.error(el.sourceline, "<extensionActivity> must hold one <proc:invokePipelet>, <proc:invokeService> "
                  "or <proc:invokeWorkflow>")
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
    "invokeService": _parse_invoke_service,
    "invokeWorkflow": _parse_invoke_workflow,
    "extensionActivity": _parse_extension_activity,
    "invoke": _parse_invoke,
    "receive": _parse_ignored,
    "reply": _parse_ignored,
    "compensate": _parse_compensate,
    "compensateScope": _parse_compensate,
}
_EXTENSION_TAGS = {"invokePipelet", "invokeService", "invokeWorkflow"}


def _xml_parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False, remove_comments=True
    )


def _partner_links(ctx: _Context, root: etree._Element) -> None:
    for child in _elements(root):
        if _local(child) == "partnerLinks":
            for pl in _elements(child):
                if not pl.get("name"):
                    continue
                ns, local = "", (pl.get("partnerLinkType") or "").strip()
                if ":" in local:
                    prefix, local = local.split(":", 1)
                    ns = pl.nsmap.get(prefix) or ""
                pipeline = ns == PROC_NS and local == "ProcessorPartnerLinkType"
                ctx.partner_links[pl.get("name", "")] = (pl.get("partnerRole") is not None, pipeline)


def parse_text(text: bytes, path: str, aliases: Mapping[str, str] | None = None,
               services: Mapping[str, str] | None = None) -> ParsedFile:
    """Parse workflow XML ``text`` (read from ``path``) into specs; never raises for bad input.

    ``aliases`` maps pipelet class names (SMILA's Java names) to dotted Python
    paths; ``services`` maps service names (``invokeService``, and partner
    links of ``invoke``) to dotted Python paths.
    """
    version = hashlib.sha256(text).hexdigest()
    ctx = _Context(path=path, aliases=dict(aliases or {}), services=dict(services or {}))
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
    _partner_links(ctx, root)
    declared: list[Variable] = []
    for child in _elements(root):
        if _local(child) == "variables":
            declared += variable_decls(ctx, child)
    ctx.var_scopes.append({v.name: v for v in declared})
    handlers: list[Catch] = []
    body_elements: list[etree._Element] = []
    for child in _elements(root):
        local = _local(child)
        if local in _DECLARATIONS or local == "variables":
            continue
        if local == "faultHandlers":
            handlers = _parse_handlers(ctx, child)
        elif local == "eventHandlers":
            ctx.error(child.sourceline, _EVENT_HANDLERS)
        elif local in {"compensationHandler", "terminationHandler"}:
            ctx.error(child.sourceline, f"<{local}> belongs on a <scope>; a <process> has none (wrap the "
                      "activities to undo in a <scope> with the handler)")
        else:
            body_elements.append(child)
    body: Activity | None = None
    if len(body_elements) != 1:
        ctx.error(root.sourceline, f"<process> must hold exactly one activity, found {len(body_elements)}")
    if body_elements:
        body = parse_activity(ctx, body_elements[0])
    _check_compensation_targets(ctx, f"<process {name!r}>", body, [h.activity for h in handlers])
    if body is not None and handlers:
        body = Scope(aid=0, line=root.sourceline or 0, name=name, body=body, handlers=tuple(handlers))
    if body is not None:
        version = _version(text, body)
    return ParsedFile(name or None, body, version, ctx.errors, ctx.invoked, ctx, tuple(declared))


def _version(text: bytes, body: Activity) -> str:
    """The file's hash with the classes the alias and service tables chose: the same file loaded with
    other tables is another version (workers cache configured pipelets by version)."""
    digest = hashlib.sha256(text)
    for act in walk(body):
        if isinstance(act, InvokePipelet):
            digest.update(f"\0{act.aid}={act.pipelet_class}".encode())
        elif isinstance(act, InvokeService):
            digest.update(f"\0{act.aid}={act.service_class}".encode())
    return digest.hexdigest()


def parse_file(path: str | os.PathLike[str], aliases: Mapping[str, str] | None = None,
               services: Mapping[str, str] | None = None) -> ParsedFile:
    """Read and parse ``path``."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            text = f.read()
    except OSError as e:
        return ParsedFile(None, None, "", [f"{p}:0: cannot read the file: {e.strerror or e}"], [])
    return parse_text(text, p, aliases, services)
