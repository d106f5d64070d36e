"""Running a batch's parts and finding the instances that break them, in about one timeout.

Theory of operation.  A batch runs as a few *attempts* (a chunk on a warm
worker, a Spark job of its own, a thread).  When one fails as a whole (its
process died) or runs past ``batch_timeout``, the instances it held are
*suspects*: each runs again alone, as an attempt of its own with a deadline
of its own, many at once.  An instance that finishes is a result; one that
runs past its deadline or takes its process down is the culprit and fails
with the reason.  (Halving the batch instead would wait out the timeout once
per halving step.)  A suspect that was alone in its attempt and ran past the
deadline is the culprit already.  A culprit found by its rerun ran twice, and
its output says so (``runs``): its message counts both as attempts.

Once the batch needs isolating, the outcomes known so far go to ``settle``
(when no rerun finished for ``QUIET`` seconds and none waits for a worker),
again as more attempts finish: the batch's good instances need not wait for
the culprit's deadline, nor for a part of the batch still in its first run.

A :class:`Budget` bounds the time one batch spends isolating (it matters
when hangs outnumber the workers: each holds one for its deadline): past it,
suspects not started yet fail as not run (their messages are retried).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine._progress import not_run_reason
from engine._results import failed, not_run
from engine._worker import InstanceInput, InstanceOutput

__all__ = ["Attempt", "Budget", "Outcome", "QUIET", "run_attempts"]

QUIET = 0.25   # seconds without a rerun finishing before the known outcomes are settled
LOOK = 1.0     # seconds between looks when nothing finishes (the budget, deadlines)


class Budget:
    """The time one batch may spend isolating failures (starts at the first failure)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = float("inf")

    def start(self) -> None:
        if self.deadline == float("inf"):
            self.deadline = time.monotonic() + self.seconds

    def spent(self) -> bool:
        return time.monotonic() > self.deadline


@dataclass
class Outcome:
    """What an attempt came to: outputs of instances that ended, suspects to rerun, and
    instances that never began (``again``: the runner that was to run them did not start,
    ``why`` says which) to run elsewhere, as a first run."""

    outputs: list[InstanceOutput] = field(default_factory=list)
    suspects: list[InstanceInput] = field(default_factory=list)
    again: list[InstanceInput] = field(default_factory=list)
    why: str = ""
    after: Any = None   # the runner that did not start (where ``again`` must not go)


class Attempt(Protocol):
    """Some of a batch's instances run once.

    ``done`` resolves when :meth:`poll` has an outcome to give; ``deadline``
    (monotonic, or None) is when :meth:`poll` must be asked anyway (to give
    the attempt up).
    """

    done: Future[Any]
    deadline: float | None

    def start(self) -> None:
        """Start it (reruns are started as capacity allows)."""

    def waiting(self) -> bool:
        """Started, but not yet running (queued for a worker)."""

    def poll(self, now: float) -> Outcome | None:
        """Its outcome once known (finished, failed, or given up past its deadline)."""

    def abandon(self, reason: str) -> list[InstanceOutput]:
        """Give it up before it ran: its instances, failed with ``reason``."""


Elsewhere = Callable[[list[InstanceInput], str, Any], list[Attempt]]


def run_attempts(first: Sequence[Attempt], *, rerun: Callable[[list[InstanceInput]], list[Attempt]],
                 capacity: int, budget: Budget,
                 settle: Callable[[list[InstanceOutput]], None] | None = None,
                 suspects: Sequence[InstanceInput] = (), eager: bool = False,
                 elsewhere: Elsewhere | None = None) -> list[InstanceOutput]:
    """Wait for the ``first`` attempts (started), rerunning the suspects of any that fail
    (and ``suspects`` from the start) as ``rerun(rows)``, at most ``capacity`` reruns
    started at once; the outcomes not settled.  Instances whose runner did not start
    run as ``elsewhere(rows, why, after)`` (attempts started, of a first run: nothing is
    isolated for it), or, with none, end as not run (:func:`~engine._results.not_run`).

    ``settle`` (on this thread) takes known outcomes while reruns are still
    going (module doc); the list returned holds only the others.  ``eager``:
    as soon as outcomes are known, before another rerun starts (reruns in the
    caller's own process, where a crash would take what is not settled with
    it).
    """
    active: list[Attempt] = list(first)
    reruns: set[int] = set()
    again_alone: set[int] = set()   # reruns of instances whose first attempt failed as a whole
    moved: set[int] = set()   # attempts of instances whose first runner did not start
    pending: deque[Attempt] = deque()
    unsettled: list[InstanceOutput] = []
    last = time.monotonic()
    if suspects:
        budget.start()
        pending.extend(rerun(list(suspects)))
        reruns.update(map(id, pending))
    while active or pending:
        if budget.spent():
            reason = not_run_reason(budget.seconds)
            while pending:
                unsettled += pending.popleft().abandon(reason)
            for attempt in [a for a in active if a.waiting()]:
                active.remove(attempt)
                unsettled += attempt.abandon(reason)
        if eager and settle is not None and unsettled:  # before another rerun may crash us
            settle(unsettled)
            unsettled = []
        while pending and sum(1 for a in active if id(a) in reruns) < capacity:
            attempt = pending.popleft()
            attempt.start()
            active.append(attempt)
        now = time.monotonic()
        for attempt in list(active):
            outcome = attempt.poll(now)
            if outcome is None:
                continue
            active.remove(attempt)
            if id(attempt) in reruns or id(attempt) in moved:  # its time measures a fault
                for out in outcome.outputs:
                    out.fault = True
                    if id(attempt) in again_alone and not out.ok and not out.not_run:
                        out.runs = 2
            unsettled += outcome.outputs
            last = now
            if outcome.again:
                more = elsewhere(outcome.again, outcome.why, outcome.after) if elsewhere is not None else []
                if more:
                    moved.update(map(id, more))
                    active.extend(more)
                else:
                    unsettled += [not_run(row, outcome.why) for row in outcome.again]
            if outcome.suspects:
                budget.start()
                more = rerun(outcome.suspects)
                reruns.update(map(id, more))
                again_alone.update(map(id, more))
                pending.extend(more)
        if not active and not pending:
            break
        settling = settle is not None and unsettled and (eager or reruns and not pending and not any(
            id(a) in reruns and a.waiting() for a in active))
        if settling and eager:
            continue
        if settling and now - last >= QUIET:
            assert settle is not None
            settle(unsettled)
            unsettled = []
            settling = False
        wake = [a.deadline for a in active if a.deadline is not None]
        timeout = min([LOOK, *(d - now for d in wake)]) if not settling else QUIET
        if pending:
            timeout = min(timeout, 0.05)
        wait([a.done for a in active], timeout=max(0.001, timeout), return_when=FIRST_COMPLETED)
    return unsettled


def lone_or_suspects(rows: list[InstanceInput], reason: str, rerun: bool) -> Outcome:
    """A failed attempt's outcome: a lone instance that is the culprit already fails with
    ``reason``; otherwise its instances are suspects."""
    if len(rows) == 1 and not rerun:
        return Outcome([failed(rows[0], reason)])
    return Outcome(suspects=list(rows))
