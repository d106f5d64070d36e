"""The service's own process as a runner: which batches may run there, and a record of those
that do (``store/_local_runs.py`` says why).

Before a run here its messages are written down; after it they are
forgotten.  A run an earlier incarnation of this member left written down
took that process down: :meth:`InProcess.recover` quarantines its records
(the reason names the pipelet call it was in, from its ``_trail``) and
returns it, so that the plug-ins can tell (the job log writes the attempt
that crashed).  A run that hangs here is abandoned by the execute
stage, which quarantines its records at once (:meth:`InProcess.quarantine`)
and runs them on Spark.  A quarantined record never runs here again.

Lanes run here at once, so a crash may leave several runs written down: the
culprit is known only when one run of one message was left.  With
``runner = "local"`` the suspects then run one at a time, each with nothing
else in the process for its first :data:`ALONE` seconds
(:meth:`InProcess.alone`; other runs wait that long at most,
:meth:`InProcess.shared`): a crash in that time names its record, and a
suspect that hangs holds back the other lanes two seconds, not its timeout.
(A suspect that crashes later, beside other runs, is a suspect again.)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from engine import PipeletCall
from listener_router._errors import StoreUnavailable
from listener_router.pipeline._trail import Trail
from listener_router.pipeline._work import Work
from listener_router.store import LocalRun, RunMessage, ServiceStore, unavailable

__all__ = ["CRASHED", "CRASHED_ALONE", "HUNG", "InProcess"]

log = logging.getLogger(__name__)

CRASHED = ("took the service's process down (killed, os._exit, a crash or out of memory) "
           "while it ran there")
CRASHED_ALONE = CRASHED + " alone"   # the culprit, not one of a batch that crashed
HUNG = "ran past batch_timeout in the service's process (abandoned there)"
ALONE = 2.0   # seconds a suspect runs with nothing beside it (a crash then names it)


class InProcess:
    """Runs in the service's process: their record, and the quarantine (see module doc)."""

    def __init__(self, store: ServiceStore, member: str):
        self.store = store
        self.member = member
        self.incarnation = ""          # the membership's, once it is made
        self.trail = Trail(member)
        self.window = ALONE
        self._turns = threading.Condition()
        self._suspects = threading.Lock()    # suspects run one at a time
        self._running = 0                    # shared runs in the process now
        self._closed_until = 0.0             # monotonic: no shared run starts before it

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """A run beside others; it waits while a suspect runs alone (at most ``window``)."""
        with self._turns:
            while (left := self._closed_until - time.monotonic()) > 0:
                self._turns.wait(None if left == float("inf") else left)
            self._running += 1
        try:
            yield
        finally:
            with self._turns:
                self._running -= 1
                self._turns.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """A suspect's run, with nothing else running in the process for its first
        ``window`` seconds (module doc): the runs in flight end first (waited for at most
        ``window``), and new ones wait."""
        with self._suspects:
            with self._turns:
                self._closed_until = float("inf")
                self._turns.wait_for(lambda: not self._running, timeout=self.window)
                self._closed_until = time.monotonic() + self.window
            try:
                yield
            finally:
                with self._turns:
                    self._closed_until = 0.0
                    self._turns.notify_all()

    def culprit(self, reason: str) -> bool:
        """Whether a quarantine ``reason`` says the record took the process down alone."""
        return CRASHED_ALONE in reason

    def quarantined(self, ids: Sequence[str]) -> dict[str, str]:
        """Those of ``ids`` that must not run here, with the reason (all of them, when the
        store cannot say)."""
        try:
            with unavailable():
                return self.store.quarantine.which(ids)
        except StoreUnavailable as e:
            return dict.fromkeys(ids, f"the quarantine could not be read: {e}")

    def begin(self, workflow: str, works: Sequence[Work]) -> str | None:
        """Write the run down before it starts; None (run it elsewhere) when that fails."""
        messages = [RunMessage(w.message.queue, w.message.message_id, w.message.attempts,
                               _plain(w.message.headers), tuple(w.message.record_ids))
                    for w in works if w.message is not None]
        try:
            with self.store.writes, unavailable():
                return self.store.local_runs.begin(self.member, self.incarnation, workflow,
                                                   messages)
        except StoreUnavailable as e:
            log.warning("could not write down a run in this process, running it on the "
                        "runner instead: %s", e)
            return None

    def watch(self, run_id: str) -> Callable[[PipeletCall], None]:
        """What the run tells each pipelet call to, before it makes it (its trail)."""
        return self.trail.watch(run_id)

    def end(self, run_id: str) -> None:
        self.trail.end(run_id)
        try:
            with self.store.writes, unavailable():
                self.store.local_runs.end(run_id)
        except StoreUnavailable as e:  # found at the next start: its records go to Spark
            log.warning("could not forget a run in this process (its records will not run "
                        "here again): %s", e)

    def quarantine(self, ids: Sequence[str], reason: str, *, replace: bool = False) -> None:
        try:
            with self.store.writes, unavailable():
                self.store.quarantine.add(ids, reason, self.member, replace=replace)
        except StoreUnavailable as e:
            log.warning("could not quarantine %d record(s): %s", len(ids), e)

    def recover(self) -> list[LocalRun]:
        """Runs an earlier incarnation of this member left unfinished: their records are
        quarantined, the runs forgotten and returned."""
        with unavailable():
            runs = self.store.local_runs.left(self.member, besides=self.incarnation)
        calls = self.trail.left()
        for run in runs:
            log.warning("a run of %s over %d message(s) in this member's process %s; its "
                        "%d record(s) are quarantined (they run on Spark from now on; with "
                        "runner = \"local\", one by one)", run.workflow, len(run.messages),
                        CRASHED, len(run.records))
            alone = len(runs) == 1 and len(run.messages) == 1  # the culprit, known
            call = calls.get(run.id)
            where = f", in {call.text()} on {call.on()}" if call is not None else ""
            self.quarantine(run.records, f"workflow {run.workflow}: "
                            f"{CRASHED_ALONE if alone else CRASHED}{where}", replace=alone)
        with self.store.writes, unavailable():
            self.store.local_runs.forget(runs)
        return runs


def _plain(headers: dict[str, Any]) -> dict[str, Any]:
    """AMQP headers as JSON values (bytes as text)."""
    return {str(k): v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            for k, v in headers.items()}
