"""Crawls of a source: ``chalk delta start``, ``finish`` and ``status`` (SMILA's delta-delete).

Theory of operation.  ``start SOURCE`` makes a crawl row, *crawling*
(``_tables``; refused while another crawl of the source runs, unless
``--restart``, which abandons it).  While it runs, each record of the
source is marked *seen* in it: by ``chalk push --source SOURCE``, in the
transaction that stores the records (or, publishing IDs only, one of its
own), and by the service when a message through a delta rule brings the
record (on receipt, before it runs: ``_plugin``).  A mark holds the
source's newest crawl, so it also protects a record from an older crawl's
deletions.

``finish SOURCE`` deletes nothing itself.  It moves the crawl to
*finishing* and walks the store's records of the source in key order, a
page at a time (the schedules' :class:`~listener_router.schedules.Selection`);
for each record of a page not seen in the crawl (nor in a later one) it
publishes a DELETE message — ``{"records": [{"id": …}]}``, header
``operation = "DELETE"``, ``x-chalk-delta-crawl`` and
``x-chalk-delta-source``, ID ``delta:<crawl>:<record>`` — to the crawl's
queue, behind the crawl's own messages, with publisher confirms; only then
does the cursor move past the page, by compare-and-set on the row.  The
service takes each DELETE through its normal way (the rule's workflow
runs, the record is deleted and routed with ``operation = DELETE``,
exactly once); a DELETE whose record was seen by the time it is processed
— its message was still in the queue when ``finish`` ran — is dropped
(``unchanged``: the record stays).  A finish killed halfway is taken up by
running it again: the cursor never passes a page whose messages were not
confirmed, and a page published twice has the same message IDs, which the
service's inbox drops.  What a page will delete is written down before it
is published (``_tables``): the resumed finish publishes the page's
written-down records again even where one was seen meanwhile (its DELETE
is then dropped, the record kept), and counts those the service deleted
before the resume, so ``deletions = deleted + kept`` once all are processed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from sqlalchemy import Connection, create_engine

from listener_router._errors import ConfigError
from listener_router._messages import parse_message
from listener_router._rules import ListenerRules
from listener_router._settings import Settings
from listener_router._signing import HeaderSigner
from listener_router.broker import AmqpLink, OutMessage, declare_input, publish_confirmed
from listener_router.delta._plugin import CRAWL_HEADER, SOURCE_HEADER
from listener_router.delta._tables import SCHEMA, Crawl, CrawlMoved, Crawls, DeltaTables
from listener_router.schedules import PAGE, RecordFilter, Selection
from listener_router.store import ServiceStore, reading

__all__ = ["CONFIRM_WAIT", "MESSAGE_PREFIX", "abandon", "crawl_status", "delete_message", "deletion_crawl",
           "deletion_step", "finish", "message_id", "seen_on_push", "start"]

MESSAGE_PREFIX = "delta:"
CONFIRM_WAIT = 120.0   # seconds a page's confirms may take before the finish stops (resumable)
_ID_BYTES = 255


def message_id(crawl: int, record_id: str) -> str:
    """``delta:<crawl>:<record>``; a record ID too long for that, or not printable, hashed."""
    found = f"{MESSAGE_PREFIX}{crawl}:{record_id}"
    if len(found.encode("utf-8")) <= _ID_BYTES and record_id.isprintable():
        return found
    return f"{MESSAGE_PREFIX}{crawl}:#{hashlib.sha256(record_id.encode('utf-8')).hexdigest()}"


def deletion_crawl(message_id: str) -> int | None:
    """The crawl whose DELETE message ``message_id`` is (:func:`message_id`), or None."""
    if not message_id.startswith(MESSAGE_PREFIX):
        return None
    crawl, _, _record = message_id[len(MESSAGE_PREFIX):].partition(":")
    return int(crawl) if crawl.isdigit() else None


def deletion_step(state: str, message_id: str) -> tuple[str, int | None]:
    """What a job-log step of message ``message_id`` in ``state`` is called: a crawl's
    DELETE message that committed is ``deleted``, with its crawl; else ``state``, None."""
    crawl = deletion_crawl(message_id)
    if crawl is None:
        return state, None
    return ("deleted" if state == "committed" else state), crawl


def delete_message(crawl: Crawl, record_id: str) -> OutMessage:
    """The DELETE message ``finish`` publishes for a record the crawl did not see."""
    return OutMessage(routing_key=crawl.queue, message_id=message_id(crawl.id, record_id),
                      headers={"operation": "DELETE", CRAWL_HEADER: str(crawl.id),
                               SOURCE_HEADER: crawl.source},
                      body=orjson.dumps({"records": [{"id": record_id}]}))


def _queue(settings: Settings, queue: str | None) -> str:
    """The queue a crawl's DELETE messages go to: ``queue``, or the first delta rule's; a
    rule there must take a DELETE message."""
    where = settings.source or "the configuration"
    delta_queues = list(dict.fromkeys(r.queue for r in settings.listeners if r.extra("delta").on))
    if queue is None:
        if not delta_queues:
            raise ConfigError(f"no [[listener]] rule in {where} sets delta = \"hash\": add one "
                              "for the source's queue")
        queue = delta_queues[0]
    elif queue not in delta_queues:
        raise ConfigError(f"no [[listener]] rule in {where} with delta = \"hash\" reads "
                          f"{queue!r} (those with it read {', '.join(delta_queues) or 'none'}): "
                          "a crawl's records are seen, and unchanged ones skipped, only "
                          "through such a rule")
    rules = ListenerRules(settings.listeners)
    probe = parse_message(b'{"records": [{"id": "probe"}]}', queue=queue,
                          message_id="delta:probe", headers={"operation": "DELETE"})
    if rules.match(probe) is None:
        raise ConfigError(f"no [[listener]] rule in {where} takes a DELETE message on queue "
                          f"{queue!r}: a crawl's deletions would be dead-lettered; add one "
                          "(or widen its condition), or give another --queue")
    return queue


def start(settings: Settings, store: ServiceStore, source: str, *, queue: str | None = None,
          restart: bool = False, by: str | None = None) -> tuple[Crawl, Crawl | None]:
    """A new crawl of ``source`` and the running one it abandoned (``restart``), if any.

    Raises:
        CrawlMoved: one is running and ``restart`` is not given.
        ConfigError: no queue to send its deletions to (see :func:`_queue`).
    """
    target = _queue(settings, queue)
    crawls = store.tables(Crawls)
    abandoned = None
    running = crawls.running(source)
    if running is not None:
        if not restart:
            raise CrawlMoved(
                f"a crawl of source {source!r} is {running.state} (crawl {running.id}, since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(running.started_at))}): "
                + ("finish it with chalk delta finish, " if running.state == "crawling" else
                   "its finish stopped halfway: run chalk delta finish again, ")
                + "or start over with --restart (nothing is deleted for it)")
        abandoned = crawls.move(running, "restart", note=f"restarted by {by or 'someone'}")
        crawls.forget_plan(abandoned)
    return crawls.start(source, target, by or ""), abandoned


def abandon(store: ServiceStore, source: str, *, by: str | None = None) -> Crawl:
    """Abandon ``source``'s running crawl: nothing more is deleted for it (DELETE messages a
    finish already published still go).

    Raises:
        CrawlMoved: no crawl of ``source`` is running, or another process moved it.
    """
    crawls = store.tables(Crawls)
    running = crawls.running(source)
    if running is None:
        last = crawls.recent(1, source)
        raise CrawlMoved(f"no crawl of source {source!r} is running"
                         + (f" (crawl {last[0].id} is {last[0].state})" if last else ""))
    abandoned = crawls.move(running, "abandon", note=f"abandoned by {by or 'someone'}")
    crawls.forget_plan(abandoned)
    return abandoned


def finish(settings: Settings, store: ServiceStore, source: str, *,
           progress: Callable[[Crawl], None] | None = None, page: int = PAGE) -> Crawl:
    """Publish DELETE messages for the records of ``source`` its running crawl did not see
    (see the module doc); returns the crawl, finished.

    Raises:
        CrawlMoved: no crawl of ``source`` is running, or another process moved it.
        BrokerUnavailable: the broker did not confirm a page in time (run it again).
    """
    crawls = store.tables(Crawls)
    crawl = crawls.running(source)
    if crawl is None:
        last = crawls.recent(1, source)
        raise CrawlMoved(f"no crawl of source {source!r} is running"
                         + (f" (crawl {last[0].id} is {last[0].state})" if last else "")
                         + f": chalk delta start {source} first")
    _queue(settings, crawl.queue)
    if crawl.state == "crawling":
        crawl = crawls.move(crawl, "finish")
    queue = crawl.queue
    rule = next(r for r in settings.listeners if r.queue == queue)

    def prepare(conn: Any) -> None:
        declare_input(conn, queue, settings, rule.backoff_ms,
                      single_active=bool(rule.ordered_by))

    selection = Selection(RecordFilter(source=source), store.sql, page,
                          where=f"crawl {crawl.id}")
    signer = HeaderSigner.of(store)   # the service takes x-chalk-delta-* from signed ones only
    link = AmqpLink(settings.broker_url, consume=(), prepare=prepare).start()
    try:
        while True:
            found = selection.read(crawl.cursor)
            with reading(store.engine) as conn:
                unseen = Crawls.unseen(conn, crawl, found.ids)
            doomed = crawls.plan(crawl, found.ids, unseen)   # written down before publishing
            if doomed:
                publish_confirmed(link, [signer.sign(delete_message(crawl, rid))
                                         for rid in doomed],
                                  CONFIRM_WAIT)
            # looked: the source's records (the walk reads the others too, and skips them)
            values: dict[str, Any] = dict(cursor=found.cursor,
                                          looked=crawl.looked + len(found.ids),
                                          deletions=crawls.planned(crawl))
            if found.over:
                values["seen"] = crawls.seen_count(crawl)
            crawl = crawls.move(crawl, "last" if found.over else "part", **values)
            if found.over:
                crawls.forget_plan(crawl)
            if progress is not None:
                progress(crawl)
            if found.over:
                return crawl
    finally:
        link.stop()


def crawl_status(store: ServiceStore, *, limit: int = 20,
                 source: str | None = None) -> list[dict[str, Any]]:
    """The newest crawls as plain values (``chalk delta status``), newest first."""
    crawls = store.tables(Crawls)
    out = []
    for c in crawls.recent(limit, source):
        seen = c.seen if c.seen is not None or not c.running else crawls.seen_count(c)
        out.append({
            "crawl": c.id, "source": c.source, "queue": c.queue, "state": c.state,
            "started_at": c.started_at, "finishing_at": c.finishing_at,
            "finished_at": c.finished_at, "seen": seen, "looked": c.looked,
            "deletions": c.deletions, "deleted": c.deleted, "kept": c.kept,
            "pending": c.deletions - c.deleted - c.kept if c.state != "crawling" else 0,
            "note": c.note})
    return out


def seen_on_push(url: str, source: str) -> Callable[[Connection, Sequence[str]], None]:
    """For ``chalk push --source``: a hook that marks records seen in ``source``'s newest
    crawl, inside the transaction that stores them (the tables made first)."""
    engine = create_engine(url)
    try:
        SCHEMA.create(engine)
    finally:
        engine.dispose()

    def mark(conn: Connection, ids: Sequence[str]) -> None:
        DeltaTables.mark_newest(conn, [(source, rid) for rid in ids])

    return mark
