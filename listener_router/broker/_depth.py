"""How many messages wait in the broker, asked on a channel of the link's own.

:attr:`DepthProbe.waiting` is how many messages are ready for the consumed
queues (not yet delivered; :attr:`DepthProbe.waiting_by_queue` by queue, with
the queues of ``depth_of`` too), asked every ``WAITING_EVERY`` seconds with a
passive declare.  A mixin of :class:`~listener_router.broker._link.AmqpLink`:
it runs on the link's I/O thread and reads its connection and queues.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["DepthProbe", "WAITING_EVERY"]

WAITING_EVERY = 0.1  # seconds between looks at the consumed queues' ready messages


class DepthProbe:
    """The looks at the broker's ready counts (I/O thread)."""

    _conn: Any
    _stopping: bool
    generation: int
    queues: list[str]
    depth_of: list[str]
    waiting: int
    waiting_by_queue: dict[str, int]
    _depths: dict[str, int]
    _probe_ch: Any
    _probing: int

    def _probe(self, generation: int) -> None:
        """Ask for the consumed queues' ready messages; again in ``WAITING_EVERY`` s."""
        conn = self._conn
        if self._stopping or generation != self.generation or conn is None or not conn.is_open:
            return
        ch = self._probe_ch
        if ch is None or not ch.is_open:
            # Its own channel: a failed passive declare (a queue deleted) closes it, not
            # the consumer's.  Opened again at the next look.
            self._probe_ch = None
            self._probing = 0
            conn.channel(on_open_callback=self._on_probe_channel)
        elif not self._probing:
            probed = [*dict.fromkeys(self.queues), *self.depth_of]
            self._probing = len(probed)
            for name in probed:
                ch.queue_declare(name, passive=True,
                                 callback=functools.partial(self._on_depth, name))
        conn.ioloop.call_later(WAITING_EVERY, functools.partial(self._probe, generation))

    def _on_probe_channel(self, channel: Any) -> None:
        self._probe_ch = channel

    def _on_depth(self, name: str, frame: Any) -> None:
        self._probing = max(0, self._probing - 1)
        count = frame.method.message_count
        if self._depths.get(name) == count:
            return
        self._depths[name] = count
        self.waiting_by_queue = dict(self._depths)
        self.waiting = sum(self._depths.values())
        self._waiting_changed(self.waiting, self.waiting_by_queue)

    def _waiting_changed(self, waiting: int, by_queue: dict[str, int]) -> None:
        """The broker's count of ready messages changed (I/O thread)."""
