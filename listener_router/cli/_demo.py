"""``chalk demo``: sample records through the shipped demo workflow, end to end."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from blackboard import Blackboard
from listener_router._loader import load_settings
from listener_router._records import push_records
from listener_router._service import Service
from listener_router._settings import ListenerRule, RouterRule
from listener_router.broker import connect, declare_all, ensure_local_broker
from listener_router.cli._status import queue_depths

__all__ = ["run_demo", "sample_records"]

SHIPPED_WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"
IN_QUEUE, OUT_QUEUE = "chalk.demo.in", "chalk.demo.out"
_WORDS = ("Blackboard", "record", "WORKFLOW", "spark", "Queue", "pipelet", "commit", "route",
          "lease", "Batch", "message", "broker")


def sample_records(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        title = "  " + "   ".join(words[:4]) + f"  #{i} "
        out.append({"id": f"demo-{i:06d}",
                    "attributes": {"text": title + "\n " + "  ".join(words), "title": title,
                                   "source": "demo"}})
    return out


def run_demo(records: int = 1000, config: str | None = None) -> int:
    console = Console()
    settings = load_settings(config)
    state = Path(".chalk")
    state.mkdir(exist_ok=True)
    db = state / "demo.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    settings = replace(
        settings, blackboard_url=f"sqlite:///{db}", workflows_dir=str(SHIPPED_WORKFLOWS),
        listeners=(ListenerRule(name="demo", queue=IN_QUEUE, workflow="Demo"),),
        routers=(RouterRule(queue=OUT_QUEUE, attributes=("text", "words")),))
    console.print(f"[bold]Chalk demo[/]: {records} records → {IN_QUEUE} → workflow Demo "
                  f"(Spark {settings.spark_master}) → {OUT_QUEUE}")
    ensure_local_broker(settings.broker_url)
    conn = connect(settings.broker_url)
    try:
        declare_all(conn, settings)
        channel = conn.channel()
        for name in (IN_QUEUE, OUT_QUEUE, f"{IN_QUEUE}.dlq"):
            channel.queue_purge(name)
    finally:
        if conn.is_open:
            conn.close()
    data = sample_records(records)
    t0 = time.monotonic()
    push_records(settings, IN_QUEUE, data)
    t_push = time.monotonic() - t0
    console.print(f"pushed {records} records in {t_push:.1f} s; starting the service (Spark "
                  "takes a few seconds to start)")
    service = Service(settings)
    service.open()
    try:
        t1 = time.monotonic()

        def done(stats) -> bool:
            return stats["committed"] + stats["dead"] >= records

        stats = service.run(until=done, idle_exit=120)
        t_run = time.monotonic() - t1
    finally:
        service.close()
    depths = queue_depths(settings, [OUT_QUEUE, f"{IN_QUEUE}.dlq"])
    out_depth = depths[OUT_QUEUE] or 0
    dead = depths[f"{IN_QUEUE}.dlq"] or 0
    with Blackboard.connect(settings.blackboard_url) as bb:
        sample = data[0]["id"]
        bb.load(sample)
        after = bb.get_attributes(sample, ["text", "words"])
        bb.invalidate(sample)
    table = Table(title="demo summary")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("records pushed", str(records))
    table.add_row("messages committed", str(stats["committed"]))
    table.add_row("dead-lettered", str(dead))
    table.add_row(f"messages in {OUT_QUEUE}", str(out_depth))
    table.add_row("batches (Spark jobs)", str(stats["batches"]))
    table.add_row("processing time", f"{t_run:.1f} s")
    table.add_row("records/s", f"{stats['records_committed'] / max(t_run, 1e-9):.0f}")
    console.print(table)
    console.print("time per phase (ms): " + ", ".join(
        f"{k[:-3]} {stats[k]}" for k in ("load_ms", "run_ms", "commit_ms", "publish_ms", "batch_ms")))
    console.print(f"record {sample}: text {data[0]['attributes']['text']!r} → "
                  f"{after.get('text')!r}, words = {after.get('words')}")
    ok = stats["committed"] == records and out_depth >= records
    console.print("[green]demo OK[/]" if ok else "[red]demo incomplete[/]")
    return 0 if ok else 1
