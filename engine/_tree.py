"""Validating a whole tree of workflow files (``chalk validate PATH``).

Every ``*.xml``/``*.bpel`` file under the path is loaded (hidden folders are
skipped).  Process names must be unique within a folder; across folders the
same name may appear (a tree of SMILA bundles repeats ``EchoPipeline``), so a
sub-workflow (``invokeWorkflow``, or BPEL ``invoke`` of a pipeline) resolves
to the file of that name *nearest* the invoking file: the same folder first,
then by the number of folder steps between them; two at the same distance
are an error naming both.  Unknown names, recursion and invalid sub-workflows
are errors at the invoking line, as in a registry.

:func:`validate_tree` returns a :class:`ValidationReport`: every error once,
the workflows found, the unknown pipelet classes and services grouped by name
(the migration to-do list of ``--summary``), and notes on where a pipelet's
DataFrame form cannot run.  Nothing is logged: the caller prints.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import networkx as nx

from engine._loader import Loaded, load_unresolved, tables
from engine._specs import Workflow
from engine._validate import Unknown

__all__ = ["FileReport", "UnknownGroup", "ValidationReport", "validate_path", "validate_tree"]

log = logging.getLogger(__name__)

_SUFFIXES = (".xml", ".bpel")


@dataclass
class FileReport:
    """One file of the tree: its process name, errors, unknown classes, and the workflow when valid
    (sub-workflows attached, ready to run)."""

    path: str
    name: str | None
    errors: list[str] = field(default_factory=list)
    unknown: list[Unknown] = field(default_factory=list)
    workflow: Workflow | None = None


@dataclass(frozen=True)
class UnknownGroup:
    """Every use of one unknown pipelet class (or service): ``places`` are ``(path, line)``."""

    kind: str
    name: str
    places: tuple[tuple[str, int], ...]

    @property
    def count(self) -> int:
        return len(self.places)

    @property
    def files(self) -> list[str]:
        return sorted({p for p, _ in self.places})


@dataclass
class ValidationReport:
    """What :func:`validate_tree` found."""

    root: str
    files: list[FileReport]
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """Every error once, as ``file:line: message``, file by file."""
        return list(dict.fromkeys(e for f in self.files for e in f.errors))

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def workflows(self) -> list[Workflow]:
        """The workflows that loaded (sub-workflows attached), by path."""
        return [f.workflow for f in self.files if f.workflow is not None]

    def workflow(self, path: str | os.PathLike[str]) -> Workflow:
        """The loaded workflow of the file ``path``; KeyError when it has errors."""
        wanted = os.fspath(path)
        for f in self.files:
            if f.path == wanted and f.workflow is not None:
                return f.workflow
        raise KeyError(wanted)

    def unknown(self) -> list[UnknownGroup]:
        """Unknown pipelet classes and services, most used first."""
        groups: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for f in self.files:
            for u in f.unknown:
                groups.setdefault((u.kind, u.name), []).append((u.path, u.line))
        out = [UnknownGroup(kind, name, tuple(sorted(places))) for (kind, name), places in groups.items()]
        return sorted(out, key=lambda g: (-g.count, g.name))

    def relative(self, path: str) -> str:
        try:
            return os.path.relpath(path, self.root)
        except ValueError:
            return path

    def lines(self, *, summary: bool = False, label: str | None = None) -> list[str]:
        """What ``chalk validate`` prints: every error once, the notes, with ``summary`` the unknown
        classes grouped (their error lines left out), and when all is valid the workflows found."""
        grouped = {u.error for f in self.files for u in f.unknown} if summary else set()
        out = [error for error in self.errors if error not in grouped]
        out += self.notes
        if summary:
            out += self.summary()
        if self.valid:
            found = self.workflows
            out.append(f"{label or self.root}: valid: {len(found)} workflow(s)")
            out += [f"  {wf.name}  {self.relative(wf.path)}" for wf in found]
        return out

    def summary(self) -> list[str]:
        """The migration to-do list: unknown classes by name, with counts and places."""
        groups = self.unknown()
        if not groups:
            return ["no unknown pipelet classes or services"]
        uses = sum(g.count for g in groups)
        files = len({p for g in groups for p, _ in g.places})
        lines = [f"{len(groups)} unknown pipelet class(es) and service(s), {uses} use(s) in {files} file(s) "
                 "(map them in [workflows.aliases] / [workflows.services], or port them):",
                 f"{'uses':>5}  {'kind':<8} name"]
        for g in groups:
            lines.append(f"{g.count:>5}  {g.kind:<8} {g.name}")
            for path, line in g.places:
                lines.append(f"{'':>15} {self.relative(path)}:{line}")
        return lines


def _files(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if Path(name).suffix.lower() in _SUFFIXES:
                found.append(Path(dirpath) / name)
    return found


def _distance(a: Path, b: Path) -> int:
    pa, pb = a.parts, b.parts
    common = 0
    for x, y in zip(pa, pb, strict=False):
        if x != y:
            break
        common += 1
    return len(pa) + len(pb) - 2 * common


def _resolve_tree(reports: dict[str, FileReport], loaded: dict[str, Loaded]) -> None:
    """Pick each invoked name's file, check the graph, attach sub-workflows (errors go on the reports)."""
    by_name: dict[str, list[str]] = {}
    for path, report in reports.items():
        if report.name is not None and not any("is already defined in" in e for e in report.errors):
            by_name.setdefault(report.name, []).append(path)
    graph = nx.DiGraph()
    graph.add_nodes_from(p for p, r in reports.items() if loaded[p].workflow is not None and not r.errors)
    chosen: dict[str, dict[str, str]] = {}
    for path in list(graph.nodes):
        wf = loaded[path].workflow
        assert wf is not None
        here = Path(path).parent
        for sub, line in wf.invoked:
            candidates = [c for c in by_name.get(sub, []) if c != path] if sub != wf.name else [path]
            if sub == wf.name:
                reports[path].errors.append(
                    f"{path}:{line}: <invokeWorkflow {sub!r}>: a workflow cannot invoke itself (recursion)")
                continue
            if not candidates:
                known = sorted(by_name)
                shown = ", ".join(known[:20]) + (f", … ({len(known)} in all)" if len(known) > 20 else "")
                reports[path].errors.append(f"{path}:{line}: <invokeWorkflow {sub!r}>: unknown sub-workflow; "
                                            f"known workflows: {shown or 'none'}")
                continue
            best = min(_distance(here, Path(c).parent) for c in candidates)
            nearest = [c for c in candidates if _distance(here, Path(c).parent) == best]
            if len(nearest) > 1:
                reports[path].errors.append(
                    f"{path}:{line}: <invokeWorkflow {sub!r}>: {len(nearest)} workflows of that name are equally "
                    f"near: {', '.join(nearest)}; rename them or move the invoking file")
                continue
            target = nearest[0]
            if target not in graph:
                reports[path].errors.append(f"{path}:{line}: <invokeWorkflow {sub!r}>: the sub-workflow has "
                                            f"errors (see {target}); fix them first")
                continue
            chosen.setdefault(path, {})[sub] = target
            graph.add_edge(path, target, line=line)
    for cycle in nx.simple_cycles(graph):
        start = cycle.index(min(cycle))
        cycle = cycle[start:] + cycle[:start]
        names = [reports[p].name or p for p in cycle]
        ring = " -> ".join([*names, names[0]])
        for i, path in enumerate(cycle):
            nxt = cycle[(i + 1) % len(cycle)]
            line = graph.edges[path, nxt]["line"]
            reports[path].errors.append(
                f"{path}:{line}: <invokeWorkflow {reports[nxt].name!r}>: sub-workflow recursion {ring}")
    bad = {p for p, r in reports.items() if r.errors}
    for path in list(graph.nodes):
        if path in bad:
            continue
        culprits = sorted(d for d in nx.descendants(graph, path) if d in bad)
        if culprits:
            invoked = {t: n for n, t in chosen.get(path, {}).items()}
            line = next((graph.edges[path, t]["line"] for t in graph.successors(path)
                         if t in culprits or set(nx.descendants(graph, t)) & set(culprits)), 0)
            reports[path].errors.append(
                f"{path}:{line}: sub-workflow(s) {', '.join(invoked.get(c, reports[c].name or c) for c in culprits)} "
                "are not valid; fix them first")
    good = graph.subgraph(p for p in graph if not reports[p].errors)
    attached: dict[str, Workflow] = {}
    for path in reversed(list(nx.topological_sort(good))):
        wf = loaded[path].workflow
        assert wf is not None
        subs = {name: attached[target] for name, target in chosen.get(path, {}).items() if target in attached}
        attached[path] = replace(wf, subworkflows=tuple(sorted(subs.items())))
        reports[path].workflow = attached[path]


def _frame_notes(workflow: Workflow) -> list[str]:
    """Where a pipelet has a DataFrame form that this workflow cannot use (informational)."""
    from engine._frames import frame_plan
    from engine._pipelets import configured_pipelet
    from engine._specs import InvokePipelet

    with_form = []
    for act in workflow.activities():
        if isinstance(act, InvokePipelet) and act.pipelet_class:
            try:
                pipelet = configured_pipelet(workflow, act)
                if pipelet.frame_io() is not None:
                    with_form.append(act)
            except Exception:  # reported as an error already
                continue
    if not with_form:
        return []
    plan, why = frame_plan(workflow)
    if plan is not None:
        return []
    return [f"{workflow.path}:{act.line}: note: {act.label()} has a DataFrame form, but this workflow runs in "
            f"the interpreter on Spark: {why}" for act in with_form]


def validate_tree(path: str | os.PathLike[str], *, aliases: Mapping[str, str] | None = None,
                  services: Mapping[str, str] | None = None, notes: bool = False) -> ValidationReport:
    """Validate a workflow file, or every workflow file in a directory tree.

    A file's sub-workflows resolve across the tree of its directory (see the
    module docstring); only the given file is reported then.  ``notes``: add
    where DataFrame forms of pipelets cannot run (costs making the pipelets).
    """
    p = Path(path)
    if not p.exists():
        return ValidationReport(str(p), [FileReport(str(p), None, [f"{p}:0: no such file or directory"])])
    root = p if p.is_dir() else p.parent
    files = _files(root)
    if p.is_file() and p not in files:
        files.append(p)
    t = tables(aliases, services)
    loaded: dict[str, Loaded] = {}
    reports: dict[str, FileReport] = {}
    seen: dict[tuple[Path, str], str] = {}
    for file in files:
        key = str(file)
        result = load_unresolved(key, t)
        loaded[key] = result
        one = FileReport(key, result.name, list(result.errors), list(result.unknown))
        if result.name is not None:
            first = seen.setdefault((file.parent, result.name), key)
            if first != key:
                line = result.workflow.body.line if result.workflow is not None else 0
                one.errors.append(f"{key}:{line}: process name {result.name!r} is already defined in {first} "
                                  "(the same folder); rename one of them")
        reports[key] = one
    _resolve_tree(reports, loaded)
    shown = [reports[str(p)]] if p.is_file() else list(reports.values())
    report = ValidationReport(str(root), shown)
    if notes:
        for entry in shown:
            if entry.workflow is not None:
                report.notes += _frame_notes(entry.workflow)
    return report


def validate_path(path: str | os.PathLike[str], *, aliases: Mapping[str, str] | None = None,
                  services: Mapping[str, str] | None = None) -> list[str]:
    """Validate a workflow file or every workflow in a directory tree; all errors as ``file:line: message``."""
    return validate_tree(path, aliases=aliases, services=services).errors
