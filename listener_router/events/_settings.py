"""``[events]``: which distributed events the service writes, and where."""

from __future__ import annotations

from dataclasses import dataclass

from listener_router._errors import ConfigError
from listener_router._keys import section, setting

__all__ = ["EVENTS_EXCHANGE", "EventSettings"]

EVENTS_EXCHANGE = "chalk.events"
KINDS = ("committed", "invalidated", "dead_lettered", "topology", "job_finished")


def _events_exchange(exchange: str, where: str) -> None:
    if not exchange or exchange.startswith("amq."):
        raise ConfigError(f"{where} must name a topic exchange of Chalk's own, got {exchange!r}")


@section("events", "Distributed events on a topic exchange (`chalk events --follow` prints "
         "them); each kind is off until switched on here.", attribute="events",
         flat={f"events_{k}": k for k in ("exchange", *KINDS)})
@dataclass(frozen=True)
class EventSettings:
    """The ``[events]`` keys: which distributed events the service writes."""

    exchange: str = setting(EVENTS_EXCHANGE, "the topic exchange events go to",
                            check=_events_exchange)
    committed: bool = setting(False, "`record.committed.<workflow>`: one per committed record")
    invalidated: bool = setting(False, "`record.invalidated.<workflow>`: one per record of a "
                                "failed instance (retried or dead)")
    dead_lettered: bool = setting(False, "`message.dead_lettered.<queue>`: one per dead letter")
    topology: bool = setting(False, "`topology.changed`: one per cluster view the leader "
                             "establishes")
    job_finished: bool = setting(False, "`job.finished.<schedule>`: one per scheduled job run")

    @property
    def any(self) -> bool:
        """Whether any kind is on (the exchange is declared then)."""
        return any(getattr(self, kind) for kind in KINDS)
