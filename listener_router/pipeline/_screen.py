"""Settling messages, or some of their records, without a run: the plug-ins' ``screen`` hook.

After the gather stage has loaded a chunk's records for a workflow and written
the messages' attributes, and before the messages join their batch's run,
each plug-in's ``screen`` hook is shown them (:class:`Screen`) and may
settle records without running them (:meth:`Screen.settle`: the step the
job log names them by, and whether the router rules route them as they are).
Then (:class:`Screening`):

- a message none of whose records was settled runs as before;
- a message some of whose records were settled runs with the others only:
  its ``message`` names those, ``whole`` keeps the message as received (its
  in-flight keys, its job-log entry); the settled records are routed now
  when asked (``unrun_outgoing``, written to the outbox with the message's
  commit) and leave the blackboard unwritten;
- a message all of whose records were settled does not run at all: it is
  committed at once, on the gather stage's thread, by the commit stage —
  its inbox row (whose status is the step), its records' outgoing messages
  and the plug-ins' ``in_commit`` rows in one transaction, no record
  written — and goes to the finish stage like any committed message,
  counted and logged under the step (``Work.label``).

As a cancellation short-circuits a message before it runs (``_cancelled``),
this short-circuits it with a commit, so exactly-once holds as for any
commit: a crash before the transaction leaves the message to be delivered
and screened again; after it, the inbox makes a redelivery a duplicate.

A hook that raises defers the works it was shown (held and gathered again,
as after a failed load): a plug-in that could not decide never lets a
message run as though it had.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from blackboard import Blackboard
from listener_router.pipeline._batch import Group
from listener_router.pipeline._commit import CommitStage
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._report import BatchReport, Meter, hook_name
from listener_router.pipeline._retries import fail
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work

__all__ = ["Screen", "ScreenHook", "Screening"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Screen:
    """One workflow's messages of a gathered chunk, loaded, before they run (module doc).

    ``works`` are *processing*; their records are on ``blackboard`` (the
    group's: read it, never change it) with the messages' attributes written.
    """

    workflow: str
    blackboard: Blackboard
    works: Sequence[Work]
    report: BatchReport | None = None
    # id(work) → (work, {record ID: (step, route)}), in the order settled
    settled: dict[int, tuple[Work, dict[str, tuple[str, bool]]]] = field(default_factory=dict)

    def settle(self, work: Work, record_ids: Collection[str] | None = None, *, step: str,
               route: bool = False) -> None:
        """Settle ``record_ids`` of ``work`` (all its records: None) without running them.

        ``step`` is what the job log calls a message settled whole this way
        (``unchanged``; at most 16 characters); ``route``: the records go to
        the router rules as they are on the blackboard (else they send nothing).
        A record settled by an earlier hook keeps that hook's step.
        """
        assert work.message is not None
        if len(step) > 16:
            raise ValueError(f"step {step!r}: at most 16 characters (the inbox's status)")
        ids = work.message.record_ids if record_ids is None else record_ids
        unknown = set(ids) - set(work.message.record_ids)
        if unknown:
            raise ValueError(f"message {work.message.message_id} does not name record(s) "
                             f"{', '.join(map(repr, sorted(unknown)))}")
        found = self.settled.setdefault(id(work), (work, {}))[1]
        for rid in ids:
            found.setdefault(rid, (step, route))


ScreenHook = Callable[[Screen], None]   # a plug-in's ``screen`` hook


class Screening:
    """Shows a group's works to the plug-ins' ``screen`` hooks and settles what they say
    (see the module doc)."""

    def __init__(self, hooks: Sequence[ScreenHook], *, commit: CommitStage, loader: Loader,
                 meter: Meter):
        self.hooks = list(hooks)
        self.commit = commit
        self.loader = loader
        self.meter = meter

    def screen(self, group: Group, works: list[Work]) -> list[Work]:
        """The works of ``group`` (loaded, attributes written) that run; the others are
        settled (committed, or failed or deferred on the way) or deferred."""
        if not works or not self.hooks:
            return works
        report = group.batch.report if group.batch is not None else None
        started = time.perf_counter()
        try:
            return self._screen(group, works, report)
        finally:
            self.meter.time("screen", time.perf_counter() - started, report)

    def _screen(self, group: Group, works: list[Work], report: BatchReport | None
                ) -> list[Work]:
        bb = group.bb
        screen = Screen(group.name, bb, tuple(works), report)
        for hook in self.hooks:
            try:
                hook(screen)
            except Exception as e:  # nothing runs on a screening that could not be done
                name = hook_name(hook)
                log.exception("screen hook %s failed; its %d message(s) are held and tried "
                              "again", name, len(works))
                self.loader.invalidate(bb, [r for w in works for r in w.message.record_ids])  # type: ignore[union-attr]
                for w in works:
                    w.to(State.DEFERRED, f"screen hook {name} failed: {type(e).__name__}: {e}")
                return []
        if not screen.settled:
            return works
        run: list[Work] = []
        unrun: list[Work] = []
        leaving: list[str] = []
        for w in works:
            message = w.message
            assert message is not None
            settled = screen.settled.get(id(w), (w, {}))[1]
            if not settled:
                run.append(w)
                continue
            w.unrun = {rid: step for rid, (step, _route) in settled.items()}
            routed = [rid for rid, (_step, route) in settled.items() if route]
            try:
                w.unrun_outgoing = self.commit.router.route(bb, group.name, message, routed) \
                    if routed else []
            except Exception as e:  # a router condition or attribute that cannot be rendered
                fail(w, f"routing failed: {type(e).__name__}: {e}")
                leaving += message.record_ids
                continue
            if len(settled) == len(message.record_ids):
                w.step = next(iter(settled.values()))[0]
                unrun.append(w)
                leaving += message.record_ids
                continue
            kept = [r for r in message.records if r["id"] not in settled]
            w.whole = message
            w.message = dataclasses.replace(message, records=kept,
                                            record_ids=[r["id"] for r in kept])
            leaving += list(settled)
            run.append(w)
        if unrun:
            self.commit.commit_unrun(group, unrun)
        if leaving:  # settled records are not written: their leases go now
            self.loader.invalidate(bb, leaving)
        return run
