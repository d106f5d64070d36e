"""``[dead_letters]``: how often the leader moves dead letters into the store."""

from __future__ import annotations

from dataclasses import dataclass

from listener_router._keys import section, setting

__all__ = ["DeadLettersSettings"]


@section("dead_letters", "Dead letters, moved off each `Q.dlq` into the store where `chalk dlq` "
         "and the page read, replay and purge them.")
@dataclass(frozen=True)
class DeadLettersSettings:
    """The ``[dead_letters]`` keys."""

    move_every: float = setting(
        5.0, "seconds between the leader's moves of dead letters from each `Q.dlq` into the "
        "store (the page reads the store only); 0: never (`chalk dlq` still moves them)",
        minimum=0)
