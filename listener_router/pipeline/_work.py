"""One delivery on its way through the pipeline (:class:`Work`), and its in-flight keys."""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from listener_router._messages import Incoming
from listener_router._settings import ListenerRule
from listener_router.broker import Delivery, OutMessage
from listener_router.pipeline._states import State, check_transition

__all__ = ["Work", "keys", "record_ids"]


class _Referable:
    """A slot for weak references (plug-ins key weak dictionaries by Work), on Python 3.10
    too (``dataclass(weakref_slot=True)`` is 3.11's)."""

    __slots__ = ("__weakref__",)


@dataclass(eq=False, slots=True)
class Work(_Referable):
    """One delivery on its way through the service; ``state`` moves along ``_states``."""

    delivery: Delivery
    state: State = State.RECEIVED
    message: Incoming | None = None
    rule: ListenerRule | None = None
    error: str | None = None
    workflow: str | None = None
    outgoing: list[OutMessage] = field(default_factory=list)
    batch: str | None = None           # the outbox batch ``outgoing`` is in, once committed
    received_at: float = field(default_factory=time.time)   # wall clock, taken up
    loaded: bool = False               # its records were taken up (invalidated if it fails)
    parked: bool = False               # deferred, its delivery parked on a key in flight
    runs: int = 1                      # attempts its failure took (``_retries.fail``)
    # Records a plug-in settled without a run (``_screen``): ``unrun`` each one's step;
    # ``step`` names a message committed with none of its records run (``unchanged``);
    # ``whole`` is the message as received when ``message`` names only the records that run;
    # ``unrun_outgoing`` the settled records' routed messages, written with its commit.
    unrun: dict[str, str] = field(default_factory=dict)
    step: str | None = None
    whole: Incoming | None = None
    unrun_outgoing: list[OutMessage] = field(default_factory=list)

    def to(self, state: State, error: str | None = None) -> None:
        self.state = check_transition(self.state, state)
        if error is not None:
            self.error = error

    @property
    def label(self) -> str:
        """What the message is counted and logged as: its state, or the step of a plug-in
        that committed it without a run."""
        return self.step if self.step is not None and self.state is State.COMMITTED \
            else self.state.value

    @property
    def received(self) -> Incoming | None:
        """The message as received, with every record it names."""
        return self.whole or self.message


def keys(works: Iterable[Work]) -> list[Hashable]:
    """In-flight keys of messages that were taken up (the message and its records)."""
    found: list[Hashable] = []
    append, extend = found.append, found.extend
    for w in works:
        message = w.whole or w.message
        if message is not None:
            append(message.key)
            extend(message.record_ids)
    return found


def record_ids(works: Iterable[Work]) -> list[str]:
    """The record IDs of parsed messages, in order."""
    return [rid for w in works if w.message is not None for rid in w.message.record_ids]
