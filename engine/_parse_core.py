"""The parser's core: its context, the standard parts of every activity, and dispatch.

``parse_activity`` looks an element's local name up in ``PARSERS`` (the one
table of the dialect, filled in by ``engine._parser``) and calls its parse
function; errors are collected in the context as ``file:line: message``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from engine._specs import Activity, Condition, LinkSource, Variable

__all__ = ["BPEL_NS", "PARSERS", "PROC_NS", "ParsedFile", "parse_activity"]

BPEL_NS = "http://docs.oasis-open.org/wsbpel/2.0/process/executable"
PROC_NS = "http://www.eclipse.org/smila/processor"
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
    if parser is None or (ns not in _ACTIVITY_NS and not (ns in _EXT_NS and local in EXTENSION_TAGS)):
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



#: XML local name -> parse function: the dialect (filled in by ``engine._parser``).
PARSERS: dict[str, Callable[[_Context, etree._Element], Activity | None]] = {}
#: Elements an ``extensionActivity`` may hold.
EXTENSION_TAGS = {"invokePipelet", "invokeService", "invokeWorkflow"}

