"""Static checks of a parsed workflow, each error with ``file:line`` and the fix.

Checks: pipelet classes import and accept their configuration; every XPath
compiles and evaluates over an empty record; BPEL 2.0 link rules (declared,
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
from collections.abc import Callable

import networkx as nx

from engine import _conditions
from engine._graph import unreachable
from engine._parser import ParsedFile
from engine._pipelets import ensure_importable, instantiate
from engine._specs import (
    Activity,
    Assign,
    Catch,
    Condition,
    Flow,
    If,
    InvokePipelet,
    RepeatUntil,
    Scope,
    Sequence,
    While,
    walk,
)

__all__ = ["check"]

log = logging.getLogger(__name__)


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
            if copy.source[0] == "expression":
                out.append((copy.source[1], ()))
    return out


def _check_pipelets(body: Activity, path: str, errors: list[str]) -> None:
    for a in walk(body):
        if not isinstance(a, InvokePipelet) or not a.pipelet_class:
            continue
        try:
            instantiate(a)
        except ImportError as e:
            errors.append(
                f"{path}:{a.line}: {a.label()}: unknown pipelet class {a.pipelet_class!r}: {e}; "
                "put the class in an importable module (the workflow directory and the working "
                "directory are on the path) or map the name in the alias table"
            )
        except Exception as e:  # the pipelet's own validation: any exception is a rejection
            errors.append(f"{path}:{a.line}: {a.label()}: configuration rejected by {a.pipelet_class}: {e}")


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
    elif hasattr(a, "body") and a.body is not None:
        changes["body"] = _rebuild(a.body, fn)
    return fn(dataclasses.replace(a, **changes) if changes else a)  # type: ignore[arg-type]


def check(parsed: ParsedFile, search_path: tuple[str, ...]) -> tuple[Activity | None, list[str]]:
    """Every static check on a parsed file; returns the final body and all errors."""
    errors = list(parsed.errors)
    body = parsed.body
    if body is None:
        return None, errors
    path = parsed.context.path if parsed.context else "?"
    ensure_importable(search_path)
    _check_pipelets(body, path, errors)
    _check_conditions(body, path, errors)
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

    return _rebuild(body, set_order), errors
