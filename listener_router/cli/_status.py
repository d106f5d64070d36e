"""``chalk status``: the queues, the lanes, the store, the cluster, the running workflows,
the statistics.

:func:`status_report` gathers it all as plain values (what ``--json``
prints); :func:`print_status` shows it.  A dead-letter queue counts what
waits to be replayed or purged: the messages still in ``Q.dlq`` and those
``chalk dlq`` or the page moved into the store (the ``chalk_dead_letters``
gauge counts the same).  The lanes are read as every member obeys them: paused
from the store (a running service's lanes are not visible to this process),
and back-pressure as the broker's depths of each lane's output queues against
its ``max_output_depth``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

import pika

from listener_router._control import lane_rows
from listener_router._errors import BrokerUnavailable
from listener_router._settings import Settings
from listener_router._urls import shown_url
from listener_router.broker import connect, dlq_name
from listener_router.cli._show import Out, iso
from listener_router.dead_letters import DeadLetters
from listener_router.jobs import statistics
from listener_router.pipeline import lane_outputs
from listener_router.store import ServiceStore

__all__ = ["STAGES", "lanes_report", "print_statistics", "print_status", "queue_depths",
           "statistics_rows", "status_report"]

STAGES = ("latency", "stage:run", "stage:commit", "stage:publish", "stage:batch")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


def queue_depths(settings: Settings, names: Sequence[str]) -> dict[str, int | None]:
    """Messages ready in each queue (None: no such queue), on one connection."""
    found: dict[str, int | None] = {}
    conn = connect(settings.broker_url)
    try:
        channel = None
        for name in names:
            if channel is None or not channel.is_open:
                channel = conn.channel()
            try:
                found[name] = channel.queue_declare(name, passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:   # 404: not declared (yet)
                found[name] = None
                channel = None
    finally:
        if conn.is_open:
            conn.close()
    return found


def _queues(settings: Settings, store: ServiceStore, now: float
            ) -> tuple[list[dict[str, Any]], dict[str, int | None], str | None]:
    """Each queue the configuration names: what waits in it, committed/s over 5 minutes
    (and the depths as the broker said, by queue, for the lanes)."""
    rates: dict[str, float] = {}
    for (queue, _workflow), summary in statistics(store, now - 300).items():
        rates[queue] = rates.get(queue, 0.0) + summary.rate("committed", now)
    roles: dict[str, str] = {}
    for rule in settings.listeners:
        roles.setdefault(rule.queue, "input")
        roles.setdefault(dlq_name(rule.queue), "dead letters")
    for router in settings.routers:
        if router.queue:
            roles.setdefault(router.queue, "output")
    for rule in settings.listeners:   # the lanes' outputs, whatever role they have
        if rule.max_output_depth is not None:
            for queue in lane_outputs(settings, [rule]):
                roles.setdefault(queue, "output")
    inputs = [q for q, role in roles.items() if role == "input"]
    kept = store.tables(DeadLetters).counts(inputs)
    broker = None
    try:
        depths = queue_depths(settings, list(roles))
    except BrokerUnavailable as e:
        broker, depths = str(e), dict.fromkeys(roles)
    rows = []
    for queue, role in roles.items():
        row: dict[str, Any] = {"queue": queue, "role": role, "messages": depths[queue]}
        if role == "dead letters":
            source = queue.removesuffix(".dlq")
            moved = kept.get(source, 0)
            row["queued"], row["kept"] = depths[queue], moved
            row["messages"] = (depths[queue] or 0) + moved if (depths[queue] is not None
                                                              or moved) else None
        row["committed_per_second"] = round(rates[queue], 3) if queue in rates else None
        rows.append(row)
    return rows, depths, broker


def lanes_report(settings: Settings, store: ServiceStore,
                 depths: dict[str, int | None]) -> list[dict[str, Any]]:
    """Each lane: paused or not (by whom, since, why: from the store), its flow settings,
    and with a ``max_output_depth`` its output queues' depths (``depths``, from the broker)
    and the first one over it (``held_back_by``: the lane takes nothing new)."""
    out = []
    for row in lane_rows(settings, store):
        limit = row["max_output_depth"]
        row["held_back_by"] = None
        if limit is not None:
            rules = [r for r in settings.listeners if r.queue == row["queue"]]
            row["outputs"] = [{"queue": q, "messages": depths.get(q)}
                              for q in lane_outputs(settings, rules)]
            row["held_back_by"] = next((o["queue"] for o in row["outputs"]
                                        if (o["messages"] or 0) > limit), None)
        out.append(row)
    return out


def statistics_rows(store: ServiceStore, since: float, now: float) -> list[dict[str, Any]]:
    """The job log's statistics since ``since`` per queue and workflow (all members)."""
    rows = []
    for (queue, workflow), s in sorted(statistics(store, since).items()):
        committed = s.counts.get("committed", 0) + s.counts.get("processed", 0)
        rows.append({
            "queue": queue, "workflow": workflow or None, "committed": committed,
            "unchanged": s.counts.get("unchanged", 0), "retried": s.counts.get("retrying", 0),
            "dead": s.counts.get("dead", 0) + s.counts.get("failed", 0),
            "duplicate": s.counts.get("duplicate", 0), "records": s.counts.get("records", 0),
            "per_second": round(committed / max(now - (s.first or now), 1.0), 3),
            "seconds": {m.split(":")[-1]: {"p50": s.percentile(m, 0.5),
                                           "p99": s.percentile(m, 0.99)} for m in STAGES}})
    return rows


def status_report(settings: Settings, since: float | None = None,
                  now: float | None = None) -> dict[str, Any]:
    """Everything ``chalk status`` shows, as plain values (see docs/guide.md for the shape)."""
    now = time.time() if now is None else now
    since = now - 3600 if since is None else since
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        queues, depths, broker = _queues(settings, store, now)
        state = store.cluster.read()
        members = [m for m in store.nodes.all() if m.live(now, settings.ttl_seconds)]
        return {
            "queues": queues, "broker_error": broker,
            "lanes": lanes_report(settings, store, depths),
            "store": {"url": shown_url(settings.blackboard_url), "records": store.sql.record_count(),
                      "processed_messages": store.outbox.processed_count(),
                      "unsent_outbox_messages": store.outbox.unsent_count(),
                      "leases": dict(store.sql.lease_counts())},
            "cluster": {
                "id": state.cluster_id, "leader": state.leader, "epoch": state.epoch,
                "view": state.view_seq, "view_members": len(state.view_members),
                "members": [{"name": m.name, "pid": m.pid, "host": m.host,
                             "version": m.properties.get("version"),
                             "heartbeat_age": round(now - m.heartbeat_at, 3),
                             "queues": list(m.properties.get("queues", [])),
                             "workflows": list(m.properties.get("workflows", []))}
                            for m in members]},
            "workflows": [{"workflow": v.name, "version": v.version, "loaded_at": iso(v.loaded_at),
                           "node": v.node, "path": v.path}
                          for v in store.workflow_versions.running([m.name for m in members])],
            "statistics": {"since": iso(since), "rows": statistics_rows(store, since, now)},
        }
    finally:
        store.close()


def print_status(report: dict[str, Any], out: Out, now: float | None = None) -> None:
    """``report`` (:func:`status_report`) as text."""
    now = time.time() if now is None else now
    rows = []
    for q in report["queues"]:
        shown = "absent" if q["messages"] is None else str(q["messages"])
        if q.get("kept"):
            shown += f" ({q['kept']} kept in the store)"
        rate = q["committed_per_second"]
        rows.append([q["queue"], shown, "" if rate is None else f"{rate:.1f}"])
    out.table("queues", ["queue", "messages", "committed/s (5 min)"], rows,
              right=("messages", "committed/s (5 min)"))
    if report["broker_error"]:
        out.text(f"broker: unreachable ({report['broker_error']})")
    _print_lanes(report["lanes"], out)
    s = report["store"]
    out.text(f"store {s['url']}: {s['records']} record(s), {s['processed_messages']} processed "
             f"message(s), {s['unsent_outbox_messages']} unsent outbox message(s)")
    for owner, n in s["leases"].items():
        out.text(f"  leases held by {owner}: {n}")
    c = report["cluster"]
    out.text(f"cluster {c['id'][:8]}: {len(c['members'])} live member(s), leader "
             f"{c['leader'] or 'none'} (epoch {c['epoch']}); the last view agreed, number "
             f"{c['view']}, has {c['view_members']} member(s)")
    for m in c["members"]:
        out.text(f"  {m['name']} (pid {m['pid']} on {m['host']}, version {m['version'] or '?'}), "
                 f"heartbeat {m['heartbeat_age']:.0f} s ago; queues "
                 f"{', '.join(m['queues']) or '-'}; workflows {', '.join(m['workflows']) or '-'}")
    if report["workflows"]:
        out.table("running workflows", ["workflow", "version", "last reload", "process", "file"],
                  [[w["workflow"], w["version"][:12], _reloaded(w["loaded_at"], now), w["node"],
                    w["path"]] for w in report["workflows"]])
    else:
        out.text("workflows: no running service reports its versions (chalk run does)")
    print_statistics(report["statistics"], out)


def _print_lanes(lanes: list[dict[str, Any]], out: Out) -> None:
    """The lanes that are paused or held back by back-pressure (a line when none is)."""
    rows = []
    for lane in lanes:
        if lane["paused"]:
            when = dt.datetime.fromtimestamp(lane["changed_at"]).strftime("%Y-%m-%d %H:%M:%S")
            why = f": {lane['reason']}" if lane.get("reason") else ""
            rows.append([lane["queue"], "paused", f"since {when} by {lane['changed_by']}{why}"])
        if lane["held_back_by"]:
            depth = next(o["messages"] for o in lane["outputs"]
                         if o["queue"] == lane["held_back_by"])
            rows.append([lane["queue"], "held back",
                         f"{lane['held_back_by']} holds {depth} message(s), over its "
                         f"max_output_depth {lane['max_output_depth']}"])
    if rows:
        out.table("lanes paused or held back", ["queue", "state", "why"], rows)
    elif lanes:
        out.text(f"lanes: {len(lanes)}, none paused or held back")


def _reloaded(at: str, now: float) -> str:
    when = dt.datetime.fromisoformat(at)
    return f"{when.strftime('%Y-%m-%d %H:%M:%S')} ({now - when.timestamp():.0f} s ago)"


def print_statistics(stats: dict[str, Any], out: Out) -> None:
    """The statistics part of a status report as a table."""
    since = stats["since"].replace("T", " ")[:19]
    window = f"from {since} (the window's start: --since) until now"
    if not stats["rows"]:
        out.text(f"statistics {window}: nothing ran")
        return
    # "unchanged" (delta processing) only where some messages were
    unchanged = any(r["unchanged"] for r in stats["rows"])
    counts = ["committed", *(["unchanged"] if unchanged else []), "retried", "dead", "dup",
              "records", "msg/s"]
    durations = [f"{m.split(':')[-1]} p50/p99" for m in STAGES]
    rows = [[r["queue"], r["workflow"] or "-", r["committed"],
             *([r["unchanged"]] if unchanged else []), r["retried"], r["dead"],
             r["duplicate"], r["records"], f"{r['per_second']:.1f}",
             *(f"{_seconds(p['p50'])} / {_seconds(p['p99'])}" for p in r["seconds"].values())]
            for r in stats["rows"]]
    out.table(f"statistics {window}, all members", ["queue", "workflow", *counts,
                                                          *durations], rows,
              right=(*counts, *durations))
