"""``chalk demo``: sample records through the shipped demo workflow, end to end: a cold
start that warms the path, then records timed at the steady rate (as
``bench/bench_listener.py --pipelets demo`` times them)."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from blackboard import Blackboard
from listener_router._loader import load_settings
from listener_router._records import push_records
from listener_router._service import Service
from listener_router._settings import ListenerRule, RouterRule, Settings
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


def _where(url: str) -> str:
    """The broker's host and port (no user or password)."""
    import pika

    params = pika.URLParameters(url)
    return f"{params.host}:{params.port}"


def _pass(settings: Settings, spark: Any, records: list[dict], sizing: Any = None
          ) -> tuple[Any, float]:
    """``records`` pushed, then a service on ``spark`` run until each is settled: its stats
    and the seconds its run took (the service's start-up left out, as the benchmark does)."""
    push_records(settings, IN_QUEUE, records)
    with Service(settings, spark=spark, sizing=sizing) as service:
        started = time.monotonic()
        stats = service.run(until=lambda s: s["committed"] + s["dead"] >= len(records),
                            idle_exit=120)
        return stats, time.monotonic() - started


def run_demo(records: int = 20_000, config: str | None = None, warmup: int = 3_000) -> int:
    """Sample records through the demo workflow: a cold start that warms the path
    (``warmup`` records in Spark jobs of 100), then ``records`` timed at the steady rate."""
    import engine
    from listener_router.pipeline import BatchSizing

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
    console.print(f"[bold]Chalk demo[/]: {records:,} records → {IN_QUEUE} → workflow Demo "
                  f"(Spark {settings.spark_master}) → {OUT_QUEUE}, broker "
                  f"{_where(settings.broker_url)} (CHALK_BROKER_URL)")
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
    data = sample_records(warmup + records)
    warm, timed = data[:warmup], data[warmup:]

    # cold: Spark starts, then the first records run in jobs of 100 (a new JVM compiles
    # what each job runs over its first few hundred jobs): none of it is timed as steady
    t0 = time.monotonic()
    spark = engine.spark_session(settings.spark_master, dict(settings.spark_conf))
    t_spark = time.monotonic() - t0
    cold_stats, t_cold = _pass(replace(settings, local_below=0), spark, warm,
                               BatchSizing(100, 0.05)) if warm else (None, 0.0)
    console.print(f"cold start: Spark {t_spark:.1f} s, then {len(warm):,} records to warm "
                  f"the path in {t_cold:.1f} s ({cold_stats['batches'] if cold_stats else 0} "
                  f"Spark jobs of 100)")
    # steady: the records published, then a service on the warm Spark takes them
    stats, t_run = _pass(settings, spark, timed)
    depths = queue_depths(settings, [OUT_QUEUE, f"{IN_QUEUE}.dlq"])
    out_depth = depths[OUT_QUEUE] or 0
    dead = depths[f"{IN_QUEUE}.dlq"] or 0
    with Blackboard.connect(settings.blackboard_url) as bb:
        sample = timed[0]["id"] if timed else data[0]["id"]
        bb.load(sample)
        after = bb.get_attributes(sample, ["text", "words"])
        bb.invalidate(sample)
    steady = stats["records_committed"] / max(t_run, 1e-9)
    table = Table(title="demo summary")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("cold start (Spark, and the warm-up records)", f"{t_spark + t_cold:.1f} s")
    table.add_row("records timed", f"{len(timed):,}")
    table.add_row("messages committed", f"{stats['committed']:,}")
    table.add_row("dead-lettered", str(dead))
    table.add_row(f"messages in {OUT_QUEUE}", f"{out_depth:,}")
    table.add_row("batches (Spark jobs)", str(stats["batches"]))
    table.add_row("processing time", f"{t_run:.1f} s")
    table.add_row("steady rate", f"{steady:,.0f} records/s")
    console.print(table)
    console.print(f"steady rate: {steady:,.0f} records/s over {len(timed):,} records, "
                  f"warm (the cold start apart: {t_spark + t_cold:.1f} s)")
    console.print("time per phase (ms): " + ", ".join(
        f"{k[:-3]} {stats[k]}" for k in ("load_ms", "run_ms", "commit_ms", "publish_ms", "batch_ms")))
    console.print(f"record {sample}: text {data[warmup]['attributes']['text']!r} → "
                  f"{after.get('text')!r}, words = {after.get('words')}")
    ok = stats["committed"] == len(timed) and out_depth >= warmup + len(timed)
    console.print("[green]demo OK[/]" if ok else "[red]demo incomplete[/]")
    return 0 if ok else 1
