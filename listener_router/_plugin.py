"""The one seam: what a feature is to the core, and how the core finds it.

A feature (events, scheduled jobs, the job log, the journal, dead letters,
the dashboard, or one of yours) is a :class:`Plugin` subclass.  The class
says, before anything is built:

- ``name`` and ``requires`` (plug-ins that must be installed and started
  before it; ``after``: those that go first when they are there at all);
- ``sections``: its settings, leaf dataclasses marked with
  :func:`~listener_router._keys.section` (``[jobs]``, ``[[schedule]]``) that
  the loader composes with the core's;
- ``rule_keys``: keys it adds to each rule of a core list, dataclasses
  marked with :func:`~listener_router._keys.rule_keys` (a key such as
  ``sample_every = 10`` on a ``[[listener]]`` rule), read with the rule's own
  keys and kept on it (``rule.extra(name)``);
- :meth:`Plugin.configure`: settings it derives from its own (a schedule's
  queue gets a listener rule) — called by the loader, idempotent;
- :meth:`Plugin.build`: the plug-in for these settings, or None when its
  sections leave it off (a plug-in is built only when turned on).

The instance is installed into a running service (:meth:`Plugin.install`,
given a :class:`Host`), started, and stopped in reverse order.  It takes
part in the pipeline by overriding hooks, each a no-op here, so the core
calls only the hooks a plug-in overrides (nothing at all for a feature that
is off; a plug-in that sets one to None on itself turns it off for the run):
before the run, on records just loaded, where it may settle messages or some
of their records without running them (:meth:`Plugin.screen`), inside a
batch's commit transaction (:meth:`Plugin.in_commit`),
after its settling (:meth:`Plugin.settle_messages`, :meth:`Plugin.settled`),
once a batch is finished (:meth:`Plugin.batch_finished`), on a view change
(:meth:`Plugin.view_established`, in the leader's fenced transaction, and
:meth:`Plugin.topology_event` on every member), as a leader task
(:meth:`Plugin.leader_tasks`) and on the metrics snapshot
(:meth:`Plugin.snapshot`).  A hook that raises is logged and never stops the
service, except :meth:`Plugin.in_commit`, whose failure rolls its
transaction back (its batch is tried again), and :meth:`Plugin.screen`,
whose failure holds the messages it was shown (they are tried again).

The core finds plug-ins through the ``chalk.plugins`` entry points of the
installed distributions (``pyproject.toml``), never by importing them; a
service may be given more (``Service(settings, plugins=[...])``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from listener_router._entry_points import ENTRY_POINTS, plugin_classes
from listener_router._errors import ConfigError

if TYPE_CHECKING:
    import engine
    from listener_router._live import LiveView
    from listener_router._settings import Settings
    from listener_router.broker import Link, OutMessage
    from listener_router.cluster import (
        LeaderTask,
        LeaderTransaction,
        Membership,
        TopologyEvent,
        ViewChange,
    )
    from listener_router.pipeline import BatchReport, Commit, Screen, Stats, Work
    from listener_router.store import Schema, ServiceStore

__all__ = ["ENTRY_POINTS", "HOOKS", "Host", "Plugin", "hooked", "ordered", "plugin_classes"]

log = logging.getLogger(__name__)

class Host:
    """What an installed plug-in gets of the running service.

    ``publish(batches)`` hands outbox batches (``{batch id: [messages]}``,
    written in a transaction that committed) to the finish stage to be
    published with confirms and marked sent; ``plugin(name)`` is another
    installed plug-in (None when it is not built).
    """

    def __init__(self, *, settings: Settings, node: str, store: ServiceStore, link: Link,
                 registry: engine.WorkflowRegistry, membership: Membership, stats: Stats,
                 live: LiveView, publish: Callable[[dict[str, list[OutMessage]]], None],
                 plugins: Mapping[str, Plugin]):
        self.settings = settings
        self.node = node
        self.store = store
        self.link = link
        self.registry = registry
        self.membership = membership
        self.stats = stats
        self.live = live
        self.publish = publish
        self._plugins = plugins

    def plugin(self, name: str) -> Plugin | None:
        return self._plugins.get(name)


class Plugin:
    """A feature of the service (see the module doc).  Override what you need."""

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()
    after: ClassVar[tuple[str, ...]] = ()
    sections: ClassVar[tuple[type, ...]] = ()
    rule_keys: ClassVar[tuple[type, ...]] = ()

    # -- before anything is built ----------------------------------------------------------
    @classmethod
    def configure(cls, settings: Settings) -> Settings:
        """``settings`` with what this feature derives from its sections (idempotent)."""
        return settings

    @classmethod
    def build(cls, settings: Settings) -> Plugin | None:
        """The plug-in for ``settings``, or None when its sections leave it off."""
        return cls()

    @classmethod
    def exchanges(cls, settings: Settings) -> list[tuple[str, str]]:
        """``(name, type)`` of the exchanges it publishes to with ``settings``: declared
        with the queues, on every connection of the service's link and by ``chalk push``."""
        return []

    def tables(self) -> Sequence[Schema]:
        """The tables it owns in the service's database (made, or upgraded, before install)."""
        return ()

    # -- the lifecycle ---------------------------------------------------------------------
    def install(self, host: Host) -> None:
        """Take what the plug-in needs from the running service (in start order)."""

    def start(self) -> None:
        """Start threads or connections of its own (after every plug-in is installed)."""

    def stop(self) -> None:
        """Stop (in reverse start order; the pipeline is drained by then)."""

    # -- hooks -----------------------------------------------------------------------------
    def screen(self, screen: Screen) -> None:
        """A workflow's messages just taken up, their records loaded and the messages'
        attributes written, before they run (on the gather stage's thread): settle records
        that need no run with ``screen.settle(work, ids, step=…, route=…)``.  A message with
        every record settled is committed at once without a run (inbox row, routed records,
        ``in_commit`` hooks, no record written) and logged under the step; one with some
        settled runs with the others.  Raising holds the messages shown (tried again)."""

    def in_commit(self, commit: Commit) -> None:
        """Inside a batch's commit transaction, before its inbox and outbox rows: write rows
        with ``commit.connection``, add messages with ``commit.publish``.  Raising rolls the
        transaction back; the batch's messages are held and tried again."""

    def settle_messages(self, done: Sequence[Work]) -> list[OutMessage]:
        """Messages of its own about settled messages (committed, duplicate, retrying, dead),
        written to the outbox and published with theirs before they are acked."""
        return []

    def settled(self, works: Sequence[Work], report: BatchReport | None) -> None:
        """``works`` are settled and published, and about to be acked."""

    def batch_finished(self, report: BatchReport) -> None:
        """Every message of the batch is published and acked (or held)."""

    def view_established(self, tx: LeaderTransaction, change: ViewChange) -> None:
        """The leader establishes a new view (``change``) in ``tx``, its fenced transaction."""

    def topology_event(self, event: TopologyEvent) -> None:
        """A topology event, on every member."""

    def leader_tasks(self) -> Sequence[LeaderTask]:
        """Periodic tasks only the cluster's leader runs (asked once, after install)."""
        return ()

    def snapshot(self) -> Mapping[str, Any]:
        """Values for the metrics and the dashboard, read when scraped (keep it cheap)."""
        return {}

    def __repr__(self) -> str:
        return f"<plug-in {self.name or type(self).__name__}>"


HOOKS = ("screen", "in_commit", "settle_messages", "settled", "batch_finished", "view_established",
         "topology_event", "snapshot")


def hooked(plugins: Iterable[Plugin], hook: str) -> list[Any]:
    """The bound ``hook`` of each plug-in that overrides it, in order (a plug-in that sets
    the hook to None on itself turns it off for this run)."""
    base = getattr(Plugin, hook)
    return [fn for p in plugins
            if getattr(type(p), hook) is not base and (fn := getattr(p, hook)) is not None]


def ordered(plugins: Iterable[Plugin]) -> list[Plugin]:
    """``plugins`` in start order: each after those it ``requires`` and those it comes
    ``after``; otherwise in the order given.

    Raises:
        ConfigError: a required plug-in is missing, or the requirements form a circle.
    """
    given = list(plugins)
    by_name = {p.name: p for p in given}
    for p in given:
        missing = [r for r in p.requires if r not in by_name]
        if missing:
            raise ConfigError(f"plug-in {p.name!r} requires {', '.join(map(repr, missing))}, "
                              "which is not built (turn its section on)")
    out: list[Plugin] = []
    state: dict[str, int] = {}

    def visit(p: Plugin, path: tuple[str, ...]) -> None:
        if state.get(p.name) == 2:
            return
        if state.get(p.name) == 1:
            raise ConfigError("plug-ins require each other in a circle: "
                              + " → ".join((*path, p.name)))
        state[p.name] = 1
        for name in (*p.requires, *p.after):
            if name in by_name:
                visit(by_name[name], (*path, p.name))
        state[p.name] = 2
        out.append(p)

    for p in given:
        visit(p, ())
    return out
