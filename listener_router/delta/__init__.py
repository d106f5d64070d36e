"""Delta processing (SMILA's DeltaIndexing and delta-delete): a plug-in.

- ``_settings``: the keys it adds to a ``[[listener]]`` rule (``delta =
  "hash"``, ``delta_attributes``, ``delta_attachments``, ``delta_unchanged``);
- ``_hash``: a record's content as one hash (canonical: attribute order
  does not count, value kinds do, annotations are not content);
- ``_tables``: its tables (hashes, records seen, crawls);
- ``_plugin``: :class:`DeltaPlugin`, which settles unchanged records without
  a run and keeps the hashes in the commit transaction;
- ``_crawls``: ``chalk delta start``, ``finish`` and ``status`` (a crawl's
  unseen records deleted through the service), and the marks ``chalk push
  --source`` writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.delta._crawls import (
        abandon,
        crawl_status,
        delete_message,
        deletion_crawl,
        deletion_step,
        finish,
        message_id,
        seen_on_push,
        start,
    )
    from listener_router.delta._hash import Content, canonical, content_hash
    from listener_router.delta._plugin import CRAWL_HEADER, SOURCE_HEADER, DeltaPlugin
    from listener_router.delta._settings import STEP, DeltaKeys
    from listener_router.delta._tables import Crawl, CrawlMoved, Crawls, DeltaTables

_HOMES = {
    "abandon": "_crawls", "crawl_status": "_crawls", "delete_message": "_crawls",
    "deletion_crawl": "_crawls", "deletion_step": "_crawls", "finish": "_crawls",
    "message_id": "_crawls", "seen_on_push": "_crawls", "start": "_crawls",
    "Content": "_hash", "canonical": "_hash", "content_hash": "_hash",
    "CRAWL_HEADER": "_plugin", "SOURCE_HEADER": "_plugin", "DeltaPlugin": "_plugin",
    "STEP": "_settings", "DeltaKeys": "_settings",
    "Crawl": "_tables", "CrawlMoved": "_tables", "Crawls": "_tables", "DeltaTables": "_tables",
}

__all__ = [
    "CRAWL_HEADER",
    "Content",
    "Crawl",
    "CrawlMoved",
    "Crawls",
    "DeltaKeys",
    "DeltaPlugin",
    "DeltaTables",
    "SOURCE_HEADER",
    "STEP",
    "abandon",
    "canonical",
    "content_hash",
    "crawl_status",
    "delete_message",
    "deletion_crawl",
    "deletion_step",
    "finish",
    "message_id",
    "seen_on_push",
    "start",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
