"""Loading workflow files: one file, or a watched directory of them.

A directory is a registry of workflows by process name.  ``refresh()``
reloads new and changed files (by mtime and size); a file that fails
validation is reported and the last good version of its workflow keeps
running.  Sub-workflows (``invokeWorkflow``) are resolved among the loaded
workflows: unknown names and recursion are errors at the invoking line.
Validating a whole tree of files (``chalk validate``) is ``engine._tree``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import networkx as nx

from engine._errors import UnknownWorkflowError, WorkflowDefinitionError
from engine._parser import parse_file
from engine._pipelets import DEFAULT_ALIASES, DEFAULT_SERVICES
from engine._specs import Workflow
from engine._validate import Unknown, check

__all__ = ["Loaded", "WorkflowRegistry", "WorkflowVersion", "load_unresolved", "load_workflow", "resolve", "tables"]

log = logging.getLogger(__name__)

_SUFFIXES = (".xml", ".bpel")


@dataclass(frozen=True)
class _Tables:
    """The alias table (pipelet classes) and the service table, defaults included."""

    aliases: Mapping[str, str]
    services: Mapping[str, str]


def tables(aliases: Mapping[str, str] | None = None, services: Mapping[str, str] | None = None) -> _Tables:
    """The built-in alias and service tables with the caller's entries on top."""
    return _Tables({**DEFAULT_ALIASES, **(aliases or {})}, {**DEFAULT_SERVICES, **(services or {})})


@dataclass(frozen=True)
class Loaded:
    """One file parsed and checked: its workflow (None when it cannot run), errors, unknown classes.

    ``name`` is the process name, also when the file has errors.
    """

    workflow: Workflow | None
    errors: list[str]
    unknown: list[Unknown]
    name: str | None


def load_unresolved(path: str, t: _Tables) -> Loaded:
    """Parse and check one file; sub-workflow names are not resolved yet."""
    parsed = parse_file(path, t.aliases, t.services)
    workdir = os.getcwd()
    search_path = (str(Path(path).resolve().parent), workdir)
    body, errors, unknown = check(parsed, search_path)
    if body is None or parsed.name is None:
        return Loaded(None, errors, unknown, parsed.name)
    wf = Workflow(
        name=parsed.name,
        path=path,
        body=body,
        version=parsed.version,
        search_path=search_path,
        workdir=workdir,
        invoked=tuple(parsed.invoked),
        variables=parsed.variables,
    )
    return Loaded(wf, errors, unknown, parsed.name)


def _load_unresolved(path: str, t: _Tables) -> tuple[Workflow | None, list[str]]:
    loaded = load_unresolved(path, t)
    return loaded.workflow, loaded.errors


def resolve(
    workflows: Mapping[str, Workflow], failed: Mapping[str, str] | None = None
) -> tuple[dict[str, Workflow], dict[str, list[str]]]:
    """Attach sub-workflows; return the resolved workflows and errors by workflow name.

    A workflow with an unknown sub-workflow or in a recursion is left out.
    """
    errors: dict[str, list[str]] = {}
    g = nx.DiGraph()
    g.add_nodes_from(workflows)
    for name, wf in workflows.items():
        for sub, line in wf.invoked:
            if sub == name:
                errors.setdefault(name, []).append(
                    f"{wf.path}:{line}: <invokeWorkflow {sub!r}>: a workflow cannot invoke itself (recursion)"
                )
            elif sub not in workflows and failed and sub in failed:
                errors.setdefault(name, []).append(
                    f"{wf.path}:{line}: <invokeWorkflow {sub!r}>: the sub-workflow has errors "
                    f"(see {failed[sub]}); fix them first"
                )
            elif sub not in workflows:
                known = ", ".join(sorted(workflows)) or "none"
                errors.setdefault(name, []).append(
                    f"{wf.path}:{line}: <invokeWorkflow {sub!r}>: unknown sub-workflow; known workflows: {known}"
                )
            else:
                g.add_edge(name, sub, line=line)
    for cycle in nx.simple_cycles(g):
        if len(cycle) < 2:
            continue
        start = cycle.index(min(cycle))
        cycle = cycle[start:] + cycle[:start]
        ring = " -> ".join([*cycle, cycle[0]])
        for i, name in enumerate(cycle):
            nxt = cycle[(i + 1) % len(cycle)]
            line = g.edges[name, nxt]["line"]
            errors.setdefault(name, []).append(
                f"{workflows[name].path}:{line}: <invokeWorkflow {nxt!r}>: sub-workflow recursion {ring}"
            )
    bad = set(errors)
    # a workflow that invokes a bad one cannot run either
    for name in list(g.nodes):
        if name not in bad and any(d in bad for d in nx.descendants(g, name)):
            wf = workflows[name]
            culprits = sorted(d for d in nx.descendants(g, name) if d in bad)
            line = next((ln for s, ln in wf.invoked if s in culprits), 0)
            errors.setdefault(name, []).append(
                f"{wf.path}:{line}: sub-workflow(s) {', '.join(culprits)} are not valid; fix them first"
            )
    resolved: dict[str, Workflow] = {}
    for name in reversed(list(nx.topological_sort(g.subgraph(n for n in g if n not in errors)))):
        wf = workflows[name]
        subs: dict[str, Workflow] = {}
        for sub, _ in wf.invoked:
            if sub in resolved:
                subs[sub] = resolved[sub]
                subs.update(dict(resolved[sub].subworkflows))
        resolved[name] = replace(wf, subworkflows=tuple(sorted(subs.items())))
    return resolved, errors


def load_workflow(
    path: str | os.PathLike[str],
    *,
    aliases: Mapping[str, str] | None = None,
    services: Mapping[str, str] | None = None,
    known_workflows: Mapping[str, Workflow] | Iterable[str] | None = None,
) -> Workflow:
    """Load, validate and return the workflow in ``path``.

    Args:
        path: the workflow XML (BPEL ``<process>``) file.
        aliases: pipelet class name -> dotted Python path (e.g. Java SMILA names),
            on top of the built-in alias table.
        services: service name (SMILA's ``invokeService``, or the partner link
            of a BPEL ``invoke``) -> dotted Python path, on top of the built-in
            service table.
        known_workflows: workflows ``invokeWorkflow`` may name: a mapping
            name -> :class:`Workflow` (attached, so the result can run), or just
            names (checked, not attached).

    Raises:
        WorkflowDefinitionError: every problem found, each as ``file:line: message``.
    """
    p = os.fspath(path)
    wf, errors = _load_unresolved(p, tables(aliases, services))
    if wf is not None:
        known: dict[str, Workflow] = {}
        names: set[str] = set()
        if isinstance(known_workflows, Mapping):
            known = dict(known_workflows)
            names = set(known)
        elif known_workflows is not None:
            names = set(known_workflows)
        pool: dict[str, Workflow] = {n: k for n, k in known.items() if n != wf.name}
        for n in names - set(pool) - {wf.name}:
            # names only: stand-ins so the name check passes; they are not attached
            pool[n] = Workflow(name=n, path="?", body=wf.body, version="")
        pool[wf.name] = wf
        resolved, sub_errors = resolve(pool)
        errors.extend(sub_errors.get(wf.name, []))
        if wf.name in resolved:
            attached = tuple((n, s) for n, s in resolved[wf.name].subworkflows if n in known)
            wf = replace(wf, subworkflows=attached)
    if errors:
        raise WorkflowDefinitionError(errors)
    assert wf is not None
    log.info("loaded workflow %s from %s", wf.name, p, extra={"workflow": wf.name})
    return wf


@dataclass
class _FileState:
    stamp: tuple[float, int]
    workflow: Workflow | None  # unresolved, when the file itself was valid
    errors: list[str]
    name: str | None = None  # process name, also when the file has errors


@dataclass(frozen=True)
class WorkflowVersion:
    """A workflow the registry runs: its name, version, file and when this version was loaded.

    ``version`` is :attr:`Workflow.version`: the SHA-256 of the file's text and of the
    pipelet classes the alias and service tables chose for it (the first 12 hex digits
    are what logs and ``chalk status`` show).
    """

    name: str
    version: str
    path: str
    loaded_at: float


class WorkflowRegistry:
    """The workflows of a directory, by process name, reloaded on change.

    Every ``*.xml`` and ``*.bpel`` file is loaded.  Thread-safe: ``get`` may
    run while another thread calls ``refresh``.

    A process name belongs to one file.  When two files define the same name,
    the one that takes it over (at start, the later one by path) gets an error
    naming the other (one problem, one error), and neither replaces the
    version of that workflow that was running (at start, when none ran,
    neither runs); once one of them is renamed or removed, the other is
    loaded.  A file that fails validation leaves the last good version of its
    workflow running.  Each version loaded is logged with the first 12 hex
    digits of its :attr:`Workflow.version`; :meth:`versions` lists what runs.
    Errors are not logged here: :attr:`errors` and :meth:`refresh` give them
    to the caller, who reports each once (the service logs them).
    """

    def __init__(self, directory: str | os.PathLike[str], *, aliases: Mapping[str, str] | None = None,
                 services: Mapping[str, str] | None = None) -> None:
        self.directory = Path(directory)
        self._tables = tables(aliases, services)
        self._files: dict[str, _FileState] = {}
        self._workflows: dict[str, Workflow] = {}
        self._loaded_at: dict[str, float] = {}  # by workflow name: when its version came in
        self._errors: dict[str, list[str]] = {}  # by file path
        self._lock = threading.RLock()
        if not self.directory.is_dir():
            raise FileNotFoundError(f"workflow directory {str(self.directory)!r} does not exist")
        self.refresh()

    @property
    def errors(self) -> list[str]:
        """The current errors of every file, as ``file:line: message``."""
        with self._lock:
            return [e for errs in self._errors.values() for e in errs]

    def file_errors(self, name: str) -> list[str]:
        """The current errors of the files that define process ``name``."""
        with self._lock:
            return [e for path, state in sorted(self._files.items()) if state.name == name
                    for e in self._errors.get(path, [])]

    def names(self) -> list[str]:
        """Names of the workflows that can run, sorted."""
        with self._lock:
            return sorted(self._workflows)

    def versions(self) -> list[WorkflowVersion]:
        """The workflows that run now, by name."""
        with self._lock:
            return [WorkflowVersion(name, wf.version, wf.path, self._loaded_at.get(name, 0.0))
                    for name, wf in sorted(self._workflows.items())]

    def get(self, name: str) -> Workflow:
        """The current good version of workflow ``name``.

        Raises:
            UnknownWorkflowError: no valid workflow of that name (lists the known ones).
        """
        with self._lock:
            try:
                return self._workflows[name]
            except KeyError:
                raise UnknownWorkflowError(name, self._workflows) from None

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._workflows

    def _scan(self) -> dict[str, tuple[float, int]]:
        found: dict[str, tuple[float, int]] = {}
        for entry in sorted(self.directory.iterdir()):
            if entry.suffix.lower() in _SUFFIXES and entry.is_file():
                st = entry.stat()
                found[str(entry)] = (st.st_mtime, st.st_size)
        return found

    def _clashes(self) -> tuple[dict[str, list[str]], set[str]]:
        """Errors for process names more than one file defines, by path, and every path
        that takes part in a clash.

        One clash is one problem, so one error: on each file that takes a name over
        (not the one whose version runs; at start, every one but the first), naming the
        file that has it."""
        claims: dict[str, list[str]] = {}
        for path, state in sorted(self._files.items()):
            if state.name:
                claims.setdefault(state.name, []).append(path)
        errors: dict[str, list[str]] = {}
        clashing: set[str] = set()
        for name, paths in claims.items():
            if len(paths) < 2:
                continue
            clashing.update(paths)
            running = self._workflows.get(name)
            holder = running.path if running is not None and running.path in paths else paths[0]
            keeps = (f"version {running.version[:12]} from {running.path} keeps running"
                     if running is not None else "neither runs")
            for path in paths:
                if path == holder:
                    continue
                state = self._files[path]
                line = state.workflow.body.line if state.workflow is not None else 1
                errors[path] = [f"{path}:{line}: process name {name!r} is already defined in "
                                f"{holder}; rename or remove one of them ({keeps})"]
        return errors, clashing

    def refresh(self) -> list[str]:
        """Reload new and changed files; return the errors found now (each new one once,
        for the caller to report).

        A file that fails keeps the last good version of its workflow running;
        a process name two files define keeps its running version (see the
        class doc); a removed file's workflow is dropped.
        """
        with self._lock:
            found = self._scan()
            loaded_now: list[str] = []
            for path in list(self._files):
                if path not in found:
                    log.info("workflow file %s was removed", path)
                    del self._files[path]
            for path, stamp in found.items():
                state = self._files.get(path)
                if state is not None and state.stamp == stamp:
                    continue
                loaded = load_unresolved(path, self._tables)
                errors = loaded.errors
                self._files[path] = _FileState(stamp, loaded.workflow if not errors else None,
                                               errors, loaded.name)
                loaded_now.append(path)
            dup_errors, clashing_paths = self._clashes()
            previous = self._workflows
            candidates: dict[str, Workflow] = {}
            for path, state in sorted(self._files.items()):
                wf = state.workflow
                if wf is not None and path not in clashing_paths:
                    candidates[wf.name] = wf
            # the last good version stays (for its invokers too) while its file is bad or
            # its name is claimed twice
            for name, wf in previous.items():
                if name in candidates:
                    continue
                state = self._files.get(wf.path)
                clashing = any(self._files[p].name == name for p in clashing_paths)
                if clashing or (state is not None and state.workflow is None):
                    candidates[name] = wf
            failed = {
                st.name: p for p, st in self._files.items() if st.workflow is None and st.name and st.name not in candidates
            }
            resolved, sub_errors = resolve(candidates, failed)
            errors_by_file: dict[str, list[str]] = {}
            for path, state in self._files.items():
                errs = list(state.errors) + dup_errors.get(path, [])
                if state.workflow is not None and state.workflow.name in sub_errors \
                        and path not in clashing_paths:
                    errs += sub_errors[state.workflow.name]
                if errs:
                    errors_by_file[path] = errs
            current: dict[str, Workflow] = dict(resolved)
            # last good version keeps running when its file is now bad
            live_paths = set(self._files)
            for name, wf in previous.items():
                if name not in current and wf.path in live_paths and wf.path in errors_by_file:
                    current[name] = wf
            old_errors = self._errors
            self._workflows = current
            self._errors = errors_by_file
            new_errors = [e for p, errs in errors_by_file.items() for e in errs
                          if p in loaded_now or e not in old_errors.get(p, ())]
            # The errors are returned, not logged: the caller reports them, once each (the
            # service logs them, chalk process prints them).  A clash's error already says
            # what keeps running.
            troubled = {self._files[p].name for p, errs in errors_by_file.items()
                        if any(e in new_errors for e in errs if e not in dup_errors.get(p, ()))}
            for name in sorted(n for n in troubled if n and n in current and previous.get(n) is current[n]):
                wf = current[name]
                log.warning("workflow %s: version %s from %s keeps running", name,
                            wf.version[:12], wf.path, extra={"workflow": name})
            now = time.time()
            for name in sorted(set(previous) - set(current)):
                self._loaded_at.pop(name, None)
                log.info("workflow %s is no longer defined; it was version %s from %s", name,
                         previous[name].version[:12], previous[name].path, extra={"workflow": name})
            for name, wf in sorted(current.items()):
                before = previous.get(name)
                # its file was broken and is good again: the last line about it must not
                # stay the error, also when the fix brought back the version that ran
                mended = wf.path in loaded_now and wf.path in old_errors \
                    and wf.path not in errors_by_file
                if mended:
                    self._loaded_at[name] = now
                    log.info("workflow %s loaded (version %s), replacing the broken one "
                             "(from %s)", name, wf.version[:12], wf.path,
                             extra={"workflow": name})
                    continue
                if before is not None and before.version == wf.version and before.path == wf.path:
                    continue
                self._loaded_at[name] = now
                was = f" (was {before.version[:12]})" if before is not None else ""
                log.info("workflow %s version %s loaded from %s%s", name, wf.version[:12],
                         wf.path, was, extra={"workflow": name})
            return new_errors

