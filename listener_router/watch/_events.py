"""The live event stream of the page: the last events on ``[events] exchange``.

Events are not stored: a follower sees those published while it is
connected.  So while the page is open (its events panel asked within the
last ``IDLE`` seconds) a thread of the watch (``chalk-watch-events``) follows
the exchange on a temporary queue of its own (exclusive, auto-deleted: it
goes with the connection), the way ``chalk events --follow`` does, and keeps
the last ``KEEP`` events in memory; with nobody looking it disconnects.
Nothing is followed when no kind of event is on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from listener_router.events import ReceivedEvent, follow

__all__ = ["EventStream", "IDLE", "KEEP", "SeenEvent"]

log = logging.getLogger(__name__)

KEEP = 100         # events kept for the page
IDLE = 60.0        # seconds without a look before the follower disconnects
RETRY = 5.0        # seconds before following again after the broker failed


@dataclass(frozen=True)
class SeenEvent:
    at: float                  # when the watch received it
    event: ReceivedEvent


class EventStream:
    """Follows ``exchange`` while someone looks (see the module doc)."""

    def __init__(self, broker_url: str, exchange: str, *, keep: int = KEEP, idle: float = IDLE):
        self.broker_url = broker_url
        self.exchange = exchange
        self.idle = idle
        self.keep = keep
        self.error: str | None = None
        self.following = False
        self._events: deque[SeenEvent] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._looked = 0.0
        self._failed = 0.0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def look(self) -> list[SeenEvent]:
        """The events kept, newest first; starts following when nobody did."""
        now = time.monotonic()
        with self._lock:
            self._looked = now
            idle = self._thread is None or not self._thread.is_alive()
            if idle and not self._stopped.is_set() and now - self._failed >= RETRY:
                self._thread = threading.Thread(target=self._follow, name="chalk-watch-events",
                                                daemon=True)
                self._thread.start()
            return list(reversed(self._events))

    def _done(self) -> bool:
        return self._stopped.is_set() or time.monotonic() - self._looked > self.idle

    def _ready(self) -> None:
        self.following, self.error = True, None

    def _follow(self) -> None:
        try:
            follow(self.broker_url, self.exchange, ["#"],
                   lambda e: self._events.append(SeenEvent(time.time(), e)),
                   ready=self._ready, stop=self._done)
        except Exception as e:  # the broker is down: say so on the page, try again later
            self.error = f"{type(e).__name__}: {e}"
            self._failed = time.monotonic()
            log.debug("following %s failed: %s", self.exchange, e)
        finally:
            self.following = False

    def stop(self) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
