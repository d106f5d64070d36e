"""Workflow XML -> frozen activity specs.

The whole dialect is the ``PARSERS`` table at the bottom: XML local name ->
parse function.  Parse functions collect errors (``file:line: message``) in
the context instead of raising, so one load reports every problem.  The
context and dispatch are in ``engine._parse_core``, scopes, handlers and
``forEach`` in ``engine._parse_scopes``; configuration, variables and copy
ends (both SMILA syntaxes) are read by ``engine._parse_data``.

XML is parsed with entity resolution, DTD loading and network access off: a
workflow file cannot read other files or reach the network.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from lxml import etree

from engine._parse_core import (
    _ACTIVITY_NS,
    _DECLARATIONS,
    _EVENT_HANDLERS,
    _STANDARD,
    BPEL_NS,
    EXTENSION_TAGS,
    PARSERS,
    PROC_NS,
    ParsedFile,
    _condition,
    _Context,
    _elements,
    _FlowFrame,
    _local,
    _ns,
    _one_activity,
    _standard,
    _with_suppress,
    _yes,
    parse_activity,
)
from engine._parse_core import _activity_children as _activity_children
from engine._parse_data import annotations_config, config_map, copy_end, variable_decls
from engine._parse_scopes import (
    check_compensation_targets,
    fault_name,
    parse_compensate,
    parse_foreach,
    parse_handlers,
    parse_scope,
)
from engine._specs import (
    Activity,
    Assign,
    Catch,
    Condition,
    CopySpec,
    Empty,
    Exit,
    Flow,
    If,
    InvokePipelet,
    InvokeService,
    InvokeWorkflow,
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


def _parse_throw(ctx: _Context, el: etree._Element) -> Activity:
    common = _standard(ctx, el)
    name = fault_name(el.get("faultName"))
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
    if len(kids) != 1 or _local(kids[0]) not in EXTENSION_TAGS:
        ctx.error(el.sourceline, "<extensionActivity> must hold one <proc:invokePipelet>, <proc:invokeService> "
                  "or <proc:invokeWorkflow>")
        return None
    inner = kids[0]
    return _with_suppress(ctx, inner, lambda: PARSERS[_local(inner)](ctx, inner))


def _parse_ignored(ctx: _Context, el: etree._Element) -> Activity:
    """``receive``/``reply`` carry no meaning here: they run as ``empty``."""
    common = _standard(ctx, el)
    return Empty(aid=ctx.aid(), **common)


PARSERS.update({
    "sequence": _parse_sequence,
    "flow": _parse_flow,
    "if": _parse_if,
    "while": lambda ctx, el: _parse_loop(ctx, el, While),
    "repeatUntil": lambda ctx, el: _parse_loop(ctx, el, RepeatUntil),
    "forEach": parse_foreach,
    "scope": parse_scope,
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
    "compensate": parse_compensate,
    "compensateScope": parse_compensate,
})


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
            handlers = parse_handlers(ctx, child)
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
    check_compensation_targets(ctx, f"<process {name!r}>", body, [h.activity for h in handlers])
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
