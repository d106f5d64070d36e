"""Parsing scopes and what hangs on them: handlers, compensation, and ``forEach``.

Scopes carry fault, compensation and termination handlers and variables;
``compensate``/``compensateScope`` are checked here (only inside a handler,
naming a scope directly inside the handler's scope), and so is ``forEach``,
whose counter is a variable of its body.
"""

from __future__ import annotations

from collections.abc import Iterable

from lxml import etree

from engine._parse_core import (
    _DECLARATIONS,
    _EVENT_HANDLERS,
    _SCOPE_PARTS,
    _condition,
    _Context,
    _elements,
    _local,
    _one_activity,
    _standard,
    _yes,
)
from engine._parse_data import variable_decls
from engine._specs import Activity, Catch, Compensate, Condition, ForEach, Scope, Variable, walk

__all__ = ["check_compensation_targets", "fault_name", "parse_compensate", "parse_foreach", "parse_handlers", "parse_scope"]


def parse_foreach(ctx: _Context, el: etree._Element) -> Activity:
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


def fault_name(value: str | None) -> str | None:
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


def parse_handlers(ctx: _Context, el: etree._Element) -> list[Catch]:
    handlers: list[Catch] = []
    seen: set[str | None] = set()
    for h in _elements(el):
        local = _local(h)
        if local not in {"catch", "catchAll"}:
            ctx.error(h.sourceline, f"<faultHandlers> holds <catch> and <catchAll>, not <{local}>")
            continue
        name = fault_name(h.get("faultName")) if local == "catch" else None
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


def check_compensation_targets(ctx: _Context, owner: str, body: Activity | None,
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


def parse_scope(ctx: _Context, el: etree._Element) -> Activity:
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
                handlers = parse_handlers(ctx, c)
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
    check_compensation_targets(ctx, owner, body, [h.activity for h in handlers] + [compensation, termination])
    return Scope(aid=aid, body=body, handlers=tuple(handlers), variables=tuple(declared),
                 compensation=compensation, termination=termination, **common)


def parse_compensate(ctx: _Context, el: etree._Element) -> Activity:
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
