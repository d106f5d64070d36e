"""One reprocess run in this process: the selection walked, its IDs published in parts.

Theory of operation.  The selection is walked a page at a time from the
run's cursor (the schedules' :class:`~listener_router.schedules.Selection`).
Each page's IDs go out in parts, one message a record, published with
publisher confirms; once the broker confirmed a part, the cursor after it
(:meth:`~listener_router.schedules.Page.after`) and the counts are saved
by compare-and-set on the run's row (``_tables``).  So:

- nothing is skipped: the cursor never passes a record whose message the
  broker has not confirmed;
- nothing is done twice: a process that dies (or is stopped) between a
  confirm and the save leaves the cursor before that part, and the resumed
  run publishes it again with the same message IDs
  (``reprocess:<run>:<record>``): the service's inbox drops a copy of a
  message it committed, and a copy that meets its original in the queue
  waits for it (the in-flight key) and is then dropped the same way.

Without a rate a part is :data:`PART` messages; with ``rate`` N, a part is
a fifth of N (at least one) and parts start at least ``part / N`` seconds
apart, so no second sees more than N messages.  A lost broker connection
holds the part until the link is back (up to :data:`BROKER_WAIT` s), then
stops the run (resumable).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as ConfirmTimeout
from typing import Any

import orjson

from listener_router._errors import BrokerUnavailable
from listener_router._settings import Settings
from listener_router.broker import AmqpLink, OutMessage, declare_input
from listener_router.reprocess._selection import RunSelection
from listener_router.reprocess._tables import MESSAGE_PREFIX, Run, Runs
from listener_router.reprocess._target import headers_for, target_rule
from listener_router.schedules import PAGE
from listener_router.store import ServiceStore

__all__ = ["BROKER_WAIT", "PART", "Pacer", "Reprocess", "message_id"]

log = logging.getLogger(__name__)

PART = 1000            # messages per publish (one confirm wait) without a rate
BROKER_WAIT = 120.0    # seconds a part waits for the broker before the run stops
_ID_BYTES = 255        # an AMQP message ID is a short string


def message_id(run_id: str, record_id: str) -> str:
    """``reprocess:<run>:<record>``; a record ID too long for that, or with characters a
    message ID must not hold (control characters), is hashed."""
    found = f"{MESSAGE_PREFIX}{run_id}:{record_id}"
    if len(found.encode("utf-8")) <= _ID_BYTES and record_id.isprintable():
        return found
    return f"{MESSAGE_PREFIX}{run_id}:#{hashlib.sha256(record_id.encode('utf-8')).hexdigest()}"


class Pacer:
    """At most ``rate`` messages a second: parts of a fifth of it, spaced out."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = rate
        self.part = PART if rate is None else max(1, min(PART, int(rate / 5)))
        self._clock = clock
        self._sleep = sleep
        self._next = 0.0

    def wait(self, n: int) -> None:
        """Wait until ``n`` more messages may go."""
        if self.rate is None:
            return
        now = self._clock()
        if self._next > now:
            self._sleep(self._next - now)
            now = self._next
        self._next = now + n / self.rate


class Reprocess:
    """Runs ``run`` (already claimed by this process) to its end, or until stopped.

    ``ids``: the listed IDs of an ``--ids-from`` run (read once); ``progress(run)`` is
    called after every saved part.  :meth:`run` returns the run as it ended (finished);
    Ctrl-C (``KeyboardInterrupt``) or an error marks it stopped, with why, and is raised
    again.
    """

    def __init__(self, settings: Settings, store: ServiceStore, run: Run, *,
                 ids: tuple[str, ...] | None = None,
                 progress: Callable[[Run], None] | None = None, page: int = PAGE):
        self.settings = settings
        self.store = store
        self.runs = store.tables(Runs)
        self.run_row = run
        self.ids = ids
        self.progress = progress or (lambda _run: None)
        self.page = page
        self.pacer = Pacer(run.rate)

    def run(self) -> Run:
        run = self.run_row
        rule = target_rule(self.settings, run.workflow, run.queue)

        def prepare(conn: Any) -> None:
            declare_input(conn, run.queue, self.settings, rule.backoff_ms)

        link = AmqpLink(self.settings.broker_url, consume=(), prepare=prepare)
        try:
            return self._walk(link.start())
        except KeyboardInterrupt:
            self._stop("stopped by Ctrl-C or SIGTERM")
            raise
        except Exception as e:
            self._stop(f"{type(e).__name__}: {e}")
            raise
        finally:
            link.stop()

    def _stop(self, note: str) -> None:
        try:
            self.run_row = self.runs.stop(self.run_row, note)
        except Exception:  # taken over, or the store is gone: the row stays resumable
            log.warning("run %s: could not mark it stopped", self.run_row.id, exc_info=True)

    def _walk(self, link: AmqpLink) -> Run:
        selection = RunSelection.parse(self.run_row.selection).walk(
            self.store.sql, self.ids, self.page)
        listed = self.ids is not None
        size = self.pacer.part
        while True:
            run = self.run_row
            page = selection.read(run.cursor)
            looked, missing = run.looked, run.missing
            if not page.ids:  # nothing chosen here: the cursor moves past the page
                self._save(page.cursor, looked + page.read,
                           missing + (page.read if listed else 0), 0, page.over)
            for start in range(0, len(page.ids), size):
                part = page.ids[start:start + size]
                self.pacer.wait(len(part))
                self._publish(link, part)
                cursor, read = page.after(start + len(part))
                self._save(cursor, looked + read,
                           missing + (read - start - len(part) if listed else 0), len(part),
                           page.over and start + len(part) >= len(page.ids))
            if page.over:
                return self.run_row

    def _save(self, cursor: str | None, looked: int, missing: int, sent: int,
              last: bool) -> None:
        run = self.run_row
        self.run_row = self.runs.advance(run, cursor, looked, run.published + sent, missing,
                                         last)
        self.progress(self.run_row)

    def _publish(self, link: AmqpLink, ids: list[str]) -> None:
        run = self.run_row
        headers = headers_for(run.id)
        messages = [OutMessage(routing_key=run.queue, message_id=message_id(run.id, rid),
                               headers=dict(headers),
                               body=orjson.dumps({"records": [{"id": rid}]}))
                    for rid in ids]
        deadline = time.monotonic() + BROKER_WAIT
        while True:
            try:
                link.publish(messages).result(timeout=BROKER_WAIT)
                return
            except (BrokerUnavailable, ConfirmTimeout) as e:
                if time.monotonic() >= deadline:
                    raise BrokerUnavailable(f"the broker did not confirm a part of run {run.id} "
                                            f"within {BROKER_WAIT:.0f} s: {e}") from e
                log.warning("run %s: publishing waits for the broker: %s", run.id, e)
                link.ready.wait(5.0)
