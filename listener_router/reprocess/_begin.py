"""Starting a run, or taking an unfinished one up again.

``--resume RUN`` continues that run.  Without it, a run is looked for
that has the same workflow, queue and selection and did not finish
(stopped, or interrupted: its process is gone); it is continued, so
running the same command again after a crash or Ctrl-C goes on where it
stopped.  ``--new`` starts a new run all the same (the old one stays
resumable by its ID).  A run whose process still runs is refused: two
processes never move one run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from listener_router._errors import ConfigError
from listener_router._settings import Settings
from listener_router.reprocess._selection import RunSelection
from listener_router.reprocess._tables import Run, Runs, this_process
from listener_router.reprocess._target import target_rule
from listener_router.store import ServiceStore

__all__ = ["Begun", "begin"]


@dataclass(frozen=True)
class Begun:
    """A run this process now owns: ``resumed`` or new, its listed IDs (``--ids-from``)
    and the repeated IDs dropped from the file."""

    run: Run
    resumed: bool
    ids: tuple[str, ...] | None
    repeats: int = 0


def _take_up(runs: Runs, run: Run, rate: float | None) -> Begun:
    if run.state == "finished":
        raise ConfigError(f"run {run.id} finished; nothing to resume (a new run: leave out "
                          "--resume)")
    if run.state == "running" and not run.gone():
        raise ConfigError(
            f"run {run.id} is running in process {run.owner} (its row moved "
            f"{time.time() - run.updated_at:.0f} s ago); stop it with Ctrl-C first, or wait: "
            "a run whose process is gone is taken over")
    ids = RunSelection.parse(run.selection).listed()
    return Begun(runs.resume(run, this_process(), run.rate if rate is None else rate), True, ids)


def begin(settings: Settings, store: ServiceStore, *, workflow: str | None = None,
          queue: str | None = None, selection: RunSelection | None = None,
          ids: tuple[str, ...] | None = None, repeats: int = 0, rate: float | None = None,
          resume: str | None = None, new: bool = False) -> Begun:
    """The run to go on with, owned by this process (see the module doc)."""
    runs = store.tables(Runs)
    if rate is not None and rate <= 0:
        raise ConfigError(f"--rate must be more than 0 (messages a second), got {rate:g}")
    if resume is not None:
        found = runs.read(resume)
        if found is None:
            raise ConfigError(f"no reprocess run {resume!r} (chalk reprocess --list shows them)")
        target_rule(settings, found.workflow, found.queue)
        return _take_up(runs, found, rate)
    if workflow is None:
        raise ConfigError("give --workflow NAME (or --resume RUN, or --list)")
    selection = selection or RunSelection()
    rule = target_rule(settings, workflow, queue)
    if not new:
        found = runs.unfinished(workflow, rule.queue, selection.text())
        if found is not None:
            return _take_up(runs, found, rate)
    total = len(ids) if ids is not None else store.sql.record_count()
    run = runs.create(workflow=workflow, queue=rule.queue, selection=selection.text(),
                      rate=rate, total=total, owner=this_process())
    return Begun(run, False, ids, repeats)
