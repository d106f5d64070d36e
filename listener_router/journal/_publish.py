"""The publishing side: the plug-in whose commit hook writes entries, and the relay that sends them.

:class:`JournalWriter` is a :class:`~listener_router.CommitExtension`: in
each commit transaction it writes one entry per committed record that
changed and matches a ``[[journal]]`` (``_entries``) into the journal
outbox (``store/_journal.py``).  :class:`JournalRelay` is a thread of the
service: for each journal whose relay lease it holds it numbers the
waiting entries, publishes them to the stream with confirms through the
service's broker link, and deletes them once confirmed.  The outbox
module's doc says why the order per record holds and why a copy published
again carries its original's number.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pika
import pika.exceptions

from listener_router._errors import BrokerUnavailable, InfrastructureError
from listener_router._plugin import Host, Plugin
from listener_router._settings import Settings
from listener_router.broker import Link, OutMessage, node_parameters, publish_confirmed
from listener_router.journal._entries import EntryEncoder, with_number
from listener_router.journal._outbox import SCHEMA, JournalOutbox
from listener_router.journal._settings import JournalRule, SubscriberRule, check_journals
from listener_router.pipeline import Commit
from listener_router.store import Schema, ServiceStore, unavailable

__all__ = ["JournalPublisher", "JournalRelay", "JournalWriter", "declare_journal",
           "STATUS_ARGUMENTS"]

log = logging.getLogger(__name__)

RELAY_LEASE = 30.0        # seconds a relay holds a journal without renewing
RELAY_BATCH = 2000        # entries per publish (one confirm wait)
CONFIRM_TIMEOUT = 60.0

# The status stream holds subscribers' status messages: an hour is plenty.
STATUS_ARGUMENTS = {"x-queue-type": "stream", "x-max-age": "1h",
                    "x-max-length-bytes": 200_000_000,
                    "x-stream-max-segment-size-bytes": 10_000_000}


def declare_journal(channel: Any, rule: JournalRule) -> Any:
    """Declare the journal's stream and status stream on a pika BlockingChannel.

    A stream that exists with other arguments (retention changed in the
    configuration) is used as it is, with a warning: RabbitMQ refuses to
    declare it again; change retention with a policy.  Returns the channel
    to go on with (a refused declare closes one).
    """
    conn = channel.connection
    for name, arguments in ((rule.stream, rule.stream_arguments()),
                            (rule.status_stream, STATUS_ARGUMENTS)):
        try:
            channel.queue_declare(name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code != 406:
                raise
            channel = conn.channel()
            channel.queue_declare(name, passive=True)
            log.warning("stream %s exists with other arguments (%s); using it as it is "
                        "(change retention with a policy)", name, e.reply_text)
    return channel


class JournalWriter:
    """Writes the journals' entries in each commit transaction (see module doc)."""

    def __init__(self, rules: Sequence[JournalRule], origin: str,
                 wake: threading.Event | None = None):
        self.encoders = [EntryEncoder(rule, origin) for rule in rules]
        self.wake = wake

    def in_transaction(self, commit: Commit) -> None:
        bb = commit.blackboard
        if bb is None or not commit.committed_ids:
            return
        wrote = False
        for encoder in self.encoders:
            if not encoder.wants(commit.workflow):
                continue
            bodies = encoder.encode(commit.connection, bb, commit.workflow, commit.committed_ids)
            if bodies:
                JournalOutbox.write(commit.connection, encoder.rule.name, bodies)
                wrote = True
        if wrote and self.wake is not None:
            self.wake.set()


class JournalRelay:
    """Numbers and publishes the journals' entries (a thread; see module doc).

    ``owner`` names this process in the relay leases (the node name).
    """

    def __init__(self, rules: Sequence[JournalRule], store: ServiceStore, link: Link,
                 broker_url: str, owner: str, *, idle: float = 0.2, batch: int = RELAY_BATCH):
        self.rules = list(rules)
        self.store = store
        self.outbox = store.tables(JournalOutbox)
        self.link = link
        self.broker_url = broker_url
        self.owner = owner
        self.idle = idle
        self.batch = batch
        self.wake = threading.Event()
        self.published = 0
        self._declared = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = 0.5

    def start(self) -> JournalRelay:
        self._thread = threading.Thread(target=self._run, name="chalk-journal", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Publish what is waiting (within ``timeout``), give the leases up, end the thread."""
        self._stopping.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for rule in self.rules:
            try:
                with self.store.writes, unavailable():
                    self.outbox.release(rule.name, self.owner)
            except InfrastructureError as e:
                log.debug("journal %s: releasing the relay lease failed: %s", rule.name, e)

    def _run(self) -> None:
        while True:
            stopping = self._stopping.is_set()
            try:
                moved = sum(self.publish_once(rule) for rule in self.rules)
                self._backoff = 0.5
            except InfrastructureError as e:
                log.warning("journal relay: %s; trying again in %.1f s", e, self._backoff)
                moved = 0
                if stopping or self._stopping.wait(self._backoff):
                    return
                self._backoff = min(self._backoff * 2, 10.0)
                continue
            except Exception:  # a bug: logged, and the relay goes on
                log.exception("journal relay failed; trying again")
                moved = 0
                if stopping or self._stopping.wait(1.0):
                    return
                continue
            if stopping and not moved:
                return  # asked to stop and nothing more to send
            if not moved and not stopping:
                self.wake.wait(self.idle)
                self.wake.clear()

    def _declare(self) -> None:
        try:
            connection = pika.BlockingConnection(node_parameters(self.broker_url))
            try:
                channel = connection.channel()
                for rule in self.rules:
                    channel = declare_journal(channel, rule)
            finally:
                if connection.is_open:
                    connection.close()
        except (pika.exceptions.AMQPError, OSError) as e:
            raise BrokerUnavailable(f"declaring the journal streams failed: {e}") from e
        self._declared = True

    def publish_once(self, rule: JournalRule) -> int:
        """One round for ``rule``'s journal: how many entries it published (0: none waiting,
        or another process holds the journal)."""
        if not self._declared:
            self._declare()
        with unavailable():
            if not self.outbox.waiting(rule.name):
                return 0
        with self.store.writes, unavailable():
            rows = self.outbox.take(rule.name, self.owner, RELAY_LEASE, self.batch)
        if not rows:
            return 0
        now = time.time()
        messages = [OutMessage(routing_key=rule.stream, body=with_number(body, seq, now),
                               message_id=f"{rule.name}:{seq}") for seq, body in rows]
        publish_confirmed(self.link, messages, CONFIRM_TIMEOUT)
        with self.store.writes, unavailable():
            self.outbox.sent(rule.name, rows[-1][0])
        self.published += len(rows)
        log.debug("journal %s: published entries %d..%d", rule.name, rows[0][0], rows[-1][0])
        return len(rows)


class JournalPublisher(Plugin):
    """The journal plug-in: the writer and the relay of a service's journals (built when there
    is any ``[[journal]]``; ``[[subscriber]]`` is read by ``chalk subscribe``)."""

    name = "journal"
    sections = (JournalRule, SubscriberRule)

    @classmethod
    def configure(cls, settings: Settings) -> Settings:
        check_journals(settings.section("journal"), settings.section("subscriber"),
                       settings.source or "settings")
        return settings

    @classmethod
    def build(cls, settings: Settings) -> JournalPublisher | None:
        rules: tuple[JournalRule, ...] = settings.section("journal")
        return cls(rules, settings.broker_url) if rules else None

    def __init__(self, rules: Sequence[JournalRule], broker_url: str):
        self.rules = tuple(rules)
        self.broker_url = broker_url
        self.wake = threading.Event()
        self.writer: JournalWriter | None = None
        self.relay: JournalRelay | None = None
        self._host: Host | None = None

    def tables(self) -> list[Schema]:
        return [SCHEMA]

    def install(self, host: Host) -> None:
        self._host = host
        self.writer = JournalWriter(self.rules, host.node, self.wake)

    def in_commit(self, commit: Commit) -> None:
        assert self.writer is not None
        self.writer.in_transaction(commit)

    def start(self) -> None:
        host = self._host
        assert host is not None, "install() first"
        relay = self.relay = JournalRelay(self.rules, host.store, host.link, self.broker_url,
                                          host.node)
        relay.wake = self.wake
        relay.start()

    def stop(self) -> None:
        """What was committed goes out first (the pipeline is drained by now)."""
        if self.relay is not None:
            self.relay.stop()
