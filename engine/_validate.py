"""Static checks of a parsed workflow, each error with ``file:line`` and the fix.

Checks: pipelet classes (and services) import and accept their configuration;
every XPath compiles and evaluates over an empty record; BPEL 2.0 link rules (declared,
exactly one source and one target, not crossing a loop or handler boundary,
no cycles -- networkx); unreachable activities.  Sub-workflow checks
(unknown name, recursion) need the other workflows and live in ``_loader``.

The checker also fixes each ``flow``'s run order: branches in document order
unless links order them (a topological sort that keeps document order among
unordered branches).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import networkx as nx

from engine import _conditions
from engine._graph import unreachable
from engine._parser import ParsedFile
from engine._pipelets import ensure_importable, instantiate, resolve_service_class
from engine._specs import (
    Activity,
    Assign,
    Catch,
    Condition,
    Flow,
    ForEach,
    If,
    InvokePipelet,
    InvokeService,
    RepeatUntil,
    Scope,
    Sequence,
    Variable,
    While,
    walk,
)

__all__ = ["Unknown", "check"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unknown:
    """A pipelet class or service with no Python class behind it (the migration to-do list).

    ``kind`` is ``"pipelet"`` (``invokePipelet`` class), ``"service"`` (SMILA's
    ``invokeService`` name) or ``"partner"`` (a partner service of ``invoke``);
    ``name`` is the name as the file writes it (a Java class for SMILA files).
    """

    kind: str
    name: str
    path: str
    line: int
    error: str = ""  # the error line reported for it


def _copy_conditions(end: tuple[str, object]) -> Iterator[Condition]:
    kind, arg = end
    if kind == "expression" and isinstance(arg, Condition):
        yield arg
    elif kind == "variable" and isinstance(arg, tuple) and isinstance(arg[2], Condition):
        yield arg[2]


def _variable_conditions(variables: tuple[Variable, ...]) -> list[tuple[Condition, tuple[str, ...]]]:
    return [(c, ()) for v in variables if v.init is not None for c in _copy_conditions(v.init)]


def _conditions_of(a: Activity) -> list[tuple[Condition, tuple[str, ...]]]:
    out: list[tuple[Condition, tuple[str, ...]]] = []
    if a.join_condition is not None:
        out.append((a.join_condition, a.targets))
    for s in a.sources:
        if s.condition is not None:
            out.append((s.condition, ()))
    if isinstance(a, If):
        out.extend((c, ()) for c, _ in a.branches)
    if isinstance(a, (While, RepeatUntil)) and a.condition is not None:
        out.append((a.condition, ()))
    if isinstance(a, Assign):
        for copy in a.copies:
            for end in (copy.source, copy.target):
                out.extend((c, ()) for c in _copy_conditions(end))
    if isinstance(a, ForEach):
        out.extend((c, ()) for c in (a.start, a.final, a.branches) if c is not None)
    if isinstance(a, Scope):
        out.extend(_variable_conditions(a.variables))
    return out


def _check_pipelets(body: Activity, path: str, errors: list[str], unknown: list[Unknown]) -> None:
    for a in walk(body):
        if isinstance(a, InvokeService):
            _check_partner(a, path, errors, unknown)
        if not isinstance(a, InvokePipelet):
            continue
        if a.service and not a.pipelet_class:
            if a.requested:
                errors.append(
                    f"{path}:{a.line}: {a.label()}: unknown service {a.requested!r}: map it to a pipelet "
                    "class in the service table ([workflows.services] in chalk.toml: "
                    f"{a.requested} = \"package.module.Class\")"
                )
                unknown.append(Unknown("service", a.requested, path, a.line, errors[-1]))
            continue
        if not a.pipelet_class:
            continue
        try:
            instantiate(a)
        except ImportError as e:
            mapped = f" (mapped from {a.requested!r})" if a.requested and a.requested != a.pipelet_class else ""
            errors.append(
                f"{path}:{a.line}: {a.label()}: unknown pipelet class {a.pipelet_class!r}{mapped}: {e}; "
                "put the class in an importable module (the workflow directory and the working "
                "directory are on the path) or map the name in the alias table"
            )
            unknown.append(Unknown("service" if a.service else "pipelet", a.requested or a.pipelet_class,
                                   path, a.line, errors[-1]))
        except Exception as e:  # the pipelet's own validation: any exception is a rejection
            errors.append(f"{path}:{a.line}: {a.label()}: configuration rejected by {a.pipelet_class}: {e}")


def _check_partner(a: InvokeService, path: str, errors: list[str], unknown: list[Unknown]) -> None:
    problem = ""
    if not a.service_class:
        problem = "no service class is mapped to it"
    else:
        try:
            resolve_service_class(a.service_class)
        except ImportError as e:
            problem = f"{a.service_class!r}: {e}"
    if problem:
        errors.append(
            f"{path}:{a.line}: {a.label()}: unknown partner service {a.partner_link!r} ({problem}); map the "
            "partner link to a class with invoke(operation, parts) in the service table "
            f"([workflows.services] in chalk.toml: {a.partner_link} = \"package.module.Class\")"
        )
        unknown.append(Unknown("partner", a.partner_link, path, a.line, errors[-1]))


def _check_conditions(body: Activity, path: str, errors: list[str]) -> None:
    for a in walk(body):
        for cond, link_vars in _conditions_of(a):
            message = _conditions.check(cond, link_vars)
            if message:
                errors.append(f"{path}:{cond.line}: {a.label()}: {message}")


def _parents(body: Activity) -> dict[int, tuple[Activity, int]]:
    parents: dict[int, tuple[Activity, int]] = {}
    for a in walk(body):
        for i, child in enumerate(a.children()):
            parents[child.aid] = (a, i)
    return parents


def _chain(aid: int, parents: dict[int, tuple[Activity, int]]) -> list[tuple[Activity, int]]:
    """(ancestor, index of the child on the way down) from the activity up to the root."""
    out: list[tuple[Activity, int]] = []
    while aid in parents:
        parent, index = parents[aid]
        out.append((parent, index))
        aid = parent.aid
    return out


def _check_links(parsed: ParsedFile, body: Activity, errors: list[str]) -> dict[int, tuple[int, ...]]:
    """Link rules; returns the run order of each flow (by flow aid)."""
    ctx = parsed.context
    if ctx is None:
        return {}
    path = ctx.path
    by_aid = {a.aid: a for a in walk(body)}
    parents = _parents(body)
    order_graphs: dict[int, nx.DiGraph] = {}
    for a in walk(body):
        if isinstance(a, Flow):
            g = nx.DiGraph()
            g.add_nodes_from(range(len(a.body)))
            order_graphs[a.aid] = g
    for (flow_aid, link), decl_line in sorted(ctx.link_decl.items(), key=lambda kv: kv[1]):
        ends = ctx.link_ends.get((flow_aid, link), [])
        srcs = [e for e in ends if e[0] == "source"]
        tgts = [e for e in ends if e[0] == "target"]
        if len(srcs) != 1 or len(tgts) != 1:
            errors.append(
                f"{path}:{decl_line}: link {link!r} needs exactly one <source> and one <target>; "
                f"found {len(srcs)} source(s) and {len(tgts)} target(s)"
            )
            continue
        (_, s_aid, s_line, s_loops, s_handlers), (_, t_aid, t_line, t_loops, t_handlers) = srcs[0], tgts[0]
        flow = by_aid.get(flow_aid)
        if s_loops != t_loops or (flow is not None and _loops_inside(flow, s_aid, parents) != _loops_inside(flow, t_aid, parents)):
            errors.append(
                f"{path}:{t_line}: link {link!r} crosses the boundary of a <while>, <repeatUntil> or <forEach>; "
                "links must start and end inside the same loop body"
            )
            continue
        if s_handlers != t_handlers:
            errors.append(f"{path}:{t_line}: link {link!r} crosses the boundary of a fault handler; remove it")
            continue
        if s_aid == t_aid:
            errors.append(f"{path}:{t_line}: link {link!r} starts and ends at the same activity (a cycle)")
            continue
        s_chain = _chain(s_aid, parents)
        t_chain = _chain(t_aid, parents)
        s_anc = {p.aid: i for p, i in s_chain}
        if t_aid in s_anc or s_aid in {p.aid for p, _ in t_chain}:
            errors.append(f"{path}:{t_line}: link {link!r} connects an activity with one nested inside it (a cycle)")
            continue
        # lowest common ancestor and the branches the two ends are in
        for parent, t_index in t_chain:
            if parent.aid in s_anc:
                s_index = s_anc[parent.aid]
                if isinstance(parent, Flow):
                    order_graphs[parent.aid].add_edge(s_index, t_index, link=link, line=t_line)
                elif isinstance(parent, Sequence) and s_index > t_index:
                    errors.append(
                        f"{path}:{t_line}: link {link!r} goes backwards in <sequence> (line {parent.line}): "
                        "its target runs before its source, a cycle that can never fire; move the link or the activities"
                    )
                break
        _ = s_line
    orders: dict[int, tuple[int, ...]] = {}
    for flow_aid, g in order_graphs.items():
        try:
            cycle = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            orders[flow_aid] = tuple(nx.lexicographical_topological_sort(g))
            continue
        links = [g.edges[u, v]["link"] for u, v in cycle]
        line = g.edges[cycle[0][0], cycle[0][1]]["line"]
        errors.append(
            f"{path}:{line}: links {', '.join(repr(x) for x in links)} form a cycle in <flow> "
            f"(line {by_aid[flow_aid].line}); remove one of them"
        )
    return orders


def _loops_inside(flow: Activity, aid: int, parents: dict[int, tuple[Activity, int]]) -> tuple[int, ...]:
    loops: list[int] = []
    for parent, _ in _chain(aid, parents):
        if parent.aid == flow.aid:
            break
        if parent.kind in {"while", "repeatUntil", "forEach"}:
            loops.append(parent.aid)
    return tuple(loops)


def _rebuild(a: Activity, fn: Callable[[Activity], Activity]) -> Activity:
    """Apply ``fn`` bottom-up to every activity of the tree (specs are frozen)."""
    changes: dict[str, object] = {}
    if isinstance(a, (Sequence, Flow)):
        changes["body"] = tuple(_rebuild(c, fn) for c in a.body)
    elif isinstance(a, If):
        changes["branches"] = tuple((c, _rebuild(x, fn)) for c, x in a.branches)
        if a.otherwise is not None:
            changes["otherwise"] = _rebuild(a.otherwise, fn)
    elif isinstance(a, Scope):
        if a.body is not None:
            changes["body"] = _rebuild(a.body, fn)
        changes["handlers"] = tuple(
            Catch(fault_name=h.fault_name, activity=_rebuild(h.activity, fn), line=h.line) for h in a.handlers
        )
        for name in ("compensation", "termination"):
            handler = getattr(a, name)
            if handler is not None:
                changes[name] = _rebuild(handler, fn)
    elif hasattr(a, "body") and a.body is not None:
        changes["body"] = _rebuild(a.body, fn)
    return fn(dataclasses.replace(a, **changes) if changes else a)  # type: ignore[arg-type]


def check(parsed: ParsedFile, search_path: tuple[str, ...]) -> tuple[Activity | None, list[str], list[Unknown]]:
    """Every static check on a parsed file; returns the final body, all errors and the unknown classes."""
    errors = list(parsed.errors)
    unknown: list[Unknown] = []
    body = parsed.body
    if body is None:
        return None, errors, unknown
    path = parsed.context.path if parsed.context else "?"
    ensure_importable(search_path)
    _check_pipelets(body, path, errors, unknown)
    _check_conditions(body, path, errors)
    for cond, _ in _variable_conditions(parsed.variables):
        message = _conditions.check(cond)
        if message:
            errors.append(f"{path}:{cond.line}: <variable>: {message}")
    orders = _check_links(parsed, body, errors)
    for a in unreachable(body):
        errors.append(
            f"{path}:{a.line}: {a.label()} is unreachable (it follows <exit>, <throw> or <rethrow> "
            "in its sequence); remove it or move it before"
        )

    def set_order(a: Activity) -> Activity:
        if isinstance(a, Flow) and a.aid in orders:
            return dataclasses.replace(a, order=orders[a.aid])
        return a

    return _rebuild(body, set_order), errors, unknown
