"""Journal benchmark: one publisher, 1, 10 and 100 subscribers, and lag under a slow one.

The publisher's side is this process: the journal relay (numbering the
outbox's entries and publishing them to the stream with confirms) and the
status view (``journal_status``, read every second while subscribers run).
Entries are written straight into the journal outbox (what a commit's
``JournalWriter`` does), so the figures are the journal's, not a workflow's.

Subscribers are :class:`~listener_router.journal.Subscriber` agents, as
threads in worker processes (at most ``--procs``; 100 subscribers run as
10 processes of 10 threads), each with a callable that writes one row per
entry to its own SQLite file, offset in the same transaction.

Passes, each on a fresh stream:

1. **publish**: ``--entries`` entries through the relay: entries/s, bytes
   per entry in the stream;
2. **1 / 10 / 100 subscribers** reading those entries from ``first``:
   entries/s per subscriber (median) and in total, and the publisher
   process's memory (peak RSS while they run);
3. **lag**: 10 subscribers while entries are published at ``--rate`` for
   ``--seconds``; one subscriber is slowed 10x: its callable sleeps, per
   entry, nine times the time an entry took a subscriber in the 10-subscriber
   pass (so it manages a tenth of their rate).  The default rate is a third
   of that pass's per-subscriber rate: the others keep up, the slow one
   cannot.  The lag (entries) of the slow one and of the others, sampled
   each second from the status view.

Every subscriber declares an error queue (a quorum queue); the bench deletes
them with the streams, or a few runs would leave hundreds on the broker.

Output: a table on stdout, the same as Markdown in ``--markdown`` and a
plot in ``--plot`` (PNG; needs matplotlib, ``pip install -e .[bench]``).

Run: ``.venv/bin/python bench/bench_journal.py`` (``--entries 2000
--counts 1,10`` for a quick look).  The broker: ``--broker`` or
``CHALK_BROKER_URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pika
from sqlalchemy import text

from listener_router import Settings
from listener_router.broker import AmqpLink, connection_parameters, ensure_local_broker
from listener_router.journal import (
    JournalRelay,
    JournalRule,
    Subscriber,
    SubscriberRule,
    journal_status,
)
from listener_router.store import JournalOutbox, ServiceStore

ROOT = Path(__file__).resolve().parent.parent


def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def entry_body(i: int) -> str:
    """An entry as a commit writes it (without seq): ID, version, origin, two attributes."""
    return orjson.dumps({
        "journal": "bench", "id": f"doc-{i:08d}", "version": 1 + i % 3,
        "op": "ADD" if i % 3 == 0 else "UPDATE", "origin": "bench-node", "workflow": "AddPipeline",
        "committed_at": time.time(),
        "attributes": {"title": f"Title of document {i}", "lang": "en"}}).decode()


def settings_for(broker: str, db: str, stream: str) -> Settings:
    rule = JournalRule(name="bench", stream=stream, forget_after=600.0)
    return Settings(blackboard_url=db, broker_url=broker, journals=(rule,), node="bench-pub")


# -- the subscriber workers ---------------------------------------------------------------------
APPLIED = "CREATE TABLE IF NOT EXISTS applied (seq INTEGER, id TEXT, version INTEGER)"


def bench_apply(slow: float) -> Any:
    """The subscribers' callable; ``slow`` seconds more per entry (0: none)."""
    def apply(entries: list[Any], conn: Any) -> None:
        conn.execute(text(APPLIED))
        conn.execute(text("INSERT INTO applied VALUES (:seq, :id, :version)"),
                     [{"seq": e.seq, "id": e.id, "version": e.version} for e in entries])
        if slow:
            time.sleep(slow * len(entries))
    return apply


def worker(spec: dict[str, Any]) -> None:
    """A worker process: ``spec["subscribers"]`` agents as threads until each applied
    ``spec["want"]`` entries or ``spec["stop_file"]`` appears; prints one JSON line each.

    The agents open (connect, start consuming) only once every worker is ready and the
    bench says go, and each one's clock starts before it opens."""
    settings = settings_for(spec["broker"], spec["db"], spec["stream"])
    results: list[dict[str, Any]] = []
    folder = Path(spec["dir"])
    (folder / f"ready-{os.getpid()}").touch()
    while not (folder / "go").exists():
        time.sleep(0.05)

    def one(name: str, slow: float) -> None:
        rule = SubscriberRule(id=name, journal="bench", store=f"sqlite:///{folder}/{name}.db",
                              batch_size=spec["batch"], status_every=1.0)
        stop_file = Path(spec["stop_file"]) if spec.get("stop_file") else None
        started = time.time()
        with Subscriber(settings, rule, apply=bench_apply(slow)) as sub:
            stats = sub.run(until=lambda s: s.applied >= spec["want"] or
                            (stop_file is not None and stop_file.exists()))
            results.append({"subscriber": name, "applied": stats.applied, "started": started,
                            "ended": time.time(), "slow": bool(slow)})

    threads = [threading.Thread(target=one, args=(name, slow))
               for name, slow in spec["subscribers"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        print(json.dumps(r), flush=True)


def start_workers(args: argparse.Namespace, stream: str, db: str, folder: Path,
                  names: list[tuple[str, float]], want: int, stop_file: str | None
                  ) -> list[subprocess.Popen[str]]:
    procs = min(args.procs, len(names))
    groups = [names[i::procs] for i in range(procs)]
    out = []
    for group in groups:
        spec = {"broker": args.broker, "db": db, "stream": stream, "dir": str(folder),
                "subscribers": group, "want": want, "batch": args.batch, "stop_file": stop_file}
        out.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                    stdout=subprocess.PIPE, text=True, cwd=ROOT))
    deadline = time.monotonic() + 300
    while len(list(folder.glob("ready-*"))) < len(out):       # every worker imported
        if time.monotonic() > deadline or any(p.poll() is not None for p in out):
            raise SystemExit("the subscriber workers did not start")
        time.sleep(0.1)
    (folder / "go").touch()
    return out


def collect(workers: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    results = []
    for proc in workers:
        stdout, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a subscriber worker failed (exit {proc.returncode})")
        results += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return results


# -- the publisher ----------------------------------------------------------------------------
class Publisher:
    """The relay over a fresh outbox and stream, in this process."""

    def __init__(self, args: argparse.Namespace, folder: Path):
        self.stream = f"bench.journal.{uuid.uuid4().hex[:8]}"
        self.db = f"sqlite:///{folder / 'publisher.db'}"
        self.settings = settings_for(args.broker, self.db, self.stream)
        self.store = ServiceStore.connect(self.db)
        self.link = AmqpLink(args.broker, consume=()).start()
        self.relay = JournalRelay(self.settings.journals, self.store, self.link, args.broker,
                                  "bench-pub")
        self.written = 0
        self.subscribers: list[str] = []     # their error queues go with the streams

    def write(self, n: int) -> None:
        bodies = [entry_body(self.written + i) for i in range(n)]
        with self.store.sql.engine.begin() as conn:
            JournalOutbox.write(conn, "bench", bodies)
        self.written += n

    def drain(self) -> int:
        moved = 0
        while (n := self.relay.publish_once(self.settings.journals[0])):
            moved += n
        return moved

    def close(self) -> None:
        self.link.stop()
        self.store.close()
        conn = pika.BlockingConnection(connection_parameters(self.settings.broker_url))
        try:
            channel = conn.channel()
            rule = self.settings.journals[0]
            for name in (self.stream, rule.status_stream,
                         *(rule.error_queue(s) for s in self.subscribers)):
                channel.queue_delete(name)
        finally:
            conn.close()


def stream_bytes(stream: str) -> int | None:
    import glob
    node = os.environ.get("CHALK_RMQ_NODE") or "rabbit"
    dirs = glob.glob(f"/var/lib/rabbitmq/mnesia/{node}@*/stream/__{stream.replace('.', '_')}_*")
    return sum(os.path.getsize(f) for d in dirs for f in glob.glob(f"{d}/*.segment")) \
        if dirs else None


def sample_status(pub: Publisher, stop: threading.Event, every: float,
                  samples: list[tuple[float, list[Any]]], peak: list[float]) -> None:
    started = time.monotonic()
    while not stop.is_set():
        try:
            _head, views = journal_status(pub.settings, "bench")
            samples.append((time.monotonic() - started, views))
        except Exception as e:  # noqa: BLE001 - a bench keeps going; say so
            print(f"  (status read failed: {e})", file=sys.stderr)
        peak[0] = max(peak[0], rss_mb())
        stop.wait(every)


# -- the passes -------------------------------------------------------------------------------
def pass_publish(args: argparse.Namespace, folder: Path) -> tuple[Publisher, dict[str, Any]]:
    pub = Publisher(args, folder)
    for start in range(0, args.entries, 10000):
        pub.write(min(10000, args.entries - start))
    started = time.perf_counter()
    moved = pub.drain()
    seconds = time.perf_counter() - started
    on_disk = stream_bytes(pub.stream)
    body = len(entry_body(0)) + len('"seq":1,"published_at":1700000000.000000,')
    return pub, {"entries": moved, "rate": moved / seconds, "entry_bytes": body,
                 "stored_bytes": None if on_disk is None else on_disk / moved}


def pass_subscribers(args: argparse.Namespace, pub: Publisher, folder: Path,
                     count: int) -> dict[str, Any]:
    sub_dir = folder / f"subs{count}"
    sub_dir.mkdir()
    names = [(f"s{count}-{i}", 0.0) for i in range(count)]
    pub.subscribers += [name for name, _ in names]
    stop = threading.Event()
    samples: list[tuple[float, list[Any]]] = []
    peak = [rss_mb()]
    sampler = threading.Thread(target=sample_status, args=(pub, stop, 1.0, samples, peak))
    workers = start_workers(args, pub.stream, pub.db, sub_dir, names, args.entries, None)
    sampler.start()
    results = collect(workers)
    stop.set()
    sampler.join()
    if len(results) != count:
        raise SystemExit(f"{count - len(results)} of {count} subscribers did not finish")
    rates = [r["applied"] / (r["ended"] - r["started"]) for r in results]
    wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {"count": count, "per_sub": statistics.median(rates), "min_sub": min(rates),
            "total": sum(r["applied"] for r in results) / wall, "wall": wall,
            "applied": sum(r["applied"] for r in results), "rss": peak[0],
            "views": len(samples[-1][1]) if samples else 0}


def pass_lag(args: argparse.Namespace, folder: Path, per_sub: float) -> dict[str, Any]:
    """``per_sub``: entries/s of one of 10 subscribers (the 10-subscriber pass)."""
    rate = args.rate or per_sub / 3
    pub = Publisher(args, folder)
    sub_dir = folder / "lag"
    sub_dir.mkdir()
    stop_file = str(sub_dir / "stop")
    names = [("slow", 9.0 / per_sub)] + [(f"fast-{i}", 0.0) for i in range(9)]
    pub.subscribers += [name for name, _ in names]
    workers = start_workers(args, pub.stream, pub.db, sub_dir, names, 1 << 60, stop_file)
    stop = threading.Event()
    samples: list[tuple[float, list[Any]]] = []
    peak = [rss_mb()]
    pub.write(1)                        # the streams exist once the relay published
    pub.drain()
    deadline = time.monotonic() + 180
    while len(journal_status(pub.settings, "bench")[1]) < len(names):   # all running
        if time.monotonic() > deadline:
            raise SystemExit("the lag pass's subscribers did not start within 180 s")
        time.sleep(1.0)
    sampler = threading.Thread(target=sample_status, args=(pub, stop, 1.0, samples, peak))
    sampler.start()
    started = time.monotonic()
    tick = 0.1
    while time.monotonic() - started < args.seconds:
        due = int((time.monotonic() - started + tick) * rate) - pub.written
        if due > 0:
            pub.write(due)
            pub.drain()
        time.sleep(tick)
    time.sleep(3.0)
    stop.set()
    sampler.join()
    Path(stop_file).touch()
    results = collect(workers)
    pub.close()
    series: dict[str, list[tuple[float, int]]] = {}
    for at, views in samples:
        for v in views:
            series.setdefault(v.subscriber, []).append((at, v.lag_entries))
    slow = series.get("slow", [])
    fast = [max((lag for name, pts in series.items() if name != "slow"
                 for t, lag in pts if t == at), default=0) for at, _ in slow]
    applied = {r["subscriber"]: r["applied"] for r in results}
    return {"published": pub.written, "rate": rate, "seconds": args.seconds, "per_sub": per_sub,
            "slow_final": slow[-1][1] if slow else None,
            "slow_max": max((lag for _, lag in slow), default=None),
            "fast_max": max(fast, default=None), "fast_final": fast[-1] if fast else None,
            "slow_applied": applied.get("slow"),
            "fast_applied_min": min(v for k, v in applied.items() if k != "slow"),
            "series": {"t": [t for t, _ in slow], "slow": [lag for _, lag in slow],
                       "others_max": fast}}


# -- output -----------------------------------------------------------------------------------
def report(args: argparse.Namespace, publish: dict[str, Any], subs: list[dict[str, Any]],
           lag: dict[str, Any] | None, base_rss: float) -> str:
    lines = [f"Journal bench: {args.entries} entries, subscriber batch {args.batch}, "
             f"subscribers in at most {args.procs} processes; {time.strftime('%Y-%m-%d %H:%M')}",
             "",
             f"Publishing (relay, confirms): {publish['rate']:,.0f} entries/s; "
             f"{publish['entry_bytes']} bytes per entry"
             + ("" if publish["stored_bytes"] is None else
                f" ({publish['stored_bytes']:.0f} bytes per entry in the stream's files)"),
             "",
             "| subscribers | entries/s per subscriber (median) | slowest | entries/s total "
             "| publisher RSS (MB) |",
             "|---:|---:|---:|---:|---:|"]
    for s in subs:
        lines.append(f"| {s['count']} | {s['per_sub']:,.0f} | {s['min_sub']:,.0f} | "
                     f"{s['total']:,.0f} | {s['rss']:.0f} |")
    lines.append(f"\nPublisher RSS before any subscriber: {base_rss:.0f} MB (this process: "
                 "relay, outbox, status view).")
    if lag is not None:
        lines += ["", f"Lag: 10 subscribers, {lag['rate']:.0f} entries/s published for "
                  f"{lag['seconds']:.0f} s ({lag['published']} entries), one slowed 10x (its "
                  f"callable sleeps {9 / lag['per_sub'] * 1000:.1f} ms per entry)",
                  "", "| subscriber | max lag (entries) | lag at the end | applied |",
                  "|---|---:|---:|---:|",
                  f"| slowed 10x | {lag['slow_max']} | {lag['slow_final']} | "
                  f"{lag['slow_applied']} |",
                  f"| the other 9 (worst) | {lag['fast_max']} | {lag['fast_final']} | "
                  f"{lag['fast_applied_min']} (fewest) |"]
    return "\n".join(lines)


def plot(path: str, subs: list[dict[str, Any]], lag: dict[str, Any] | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2 if lag else 1, figsize=(11 if lag else 6, 4))
    axes = axes if lag else [axes]
    counts = [s["count"] for s in subs]
    ax = axes[0]
    ax.plot(counts, [s["total"] for s in subs], "o-", label="total")
    ax.plot(counts, [s["per_sub"] for s in subs], "s-", label="per subscriber (median)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set_xlabel("subscribers")
    ax.set_ylabel("entries/s")
    ax.set_title("One journal, many subscribers")
    ax.legend()
    if lag:
        ax = axes[1]
        series = lag["series"]
        ax.plot(series["t"], series["slow"], label="subscriber slowed 10x")
        ax.plot(series["t"], series["others_max"], label="other 9 (worst)")
        ax.set_xlabel("seconds")
        ax.set_ylabel("lag (entries)")
        ax.set_title(f"Lag, {lag['rate']:.0f} entries/s published")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get(
        "CHALK_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--entries", type=int, default=5000,
                        help="entries each subscriber reads (default 5000)")
    parser.add_argument("--counts", default="1,10,100", help="subscriber counts (1,10,100)")
    parser.add_argument("--procs", type=int, default=10, help="most worker processes (10)")
    parser.add_argument("--batch", type=int, default=100, help="subscriber batch size (100)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="entries/s published in the lag pass (default: a third of one "
                             "of 10 subscribers' rate)")
    parser.add_argument("--seconds", type=float, default=30.0, help="lag pass length (30)")
    parser.add_argument("--no-lag", action="store_true", help="leave the lag pass out")
    parser.add_argument("--markdown", help="write the tables here too")
    parser.add_argument("--plot", help="write a PNG plot here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    ensure_local_broker(args.broker)
    with tempfile.TemporaryDirectory(prefix="chalk-bench-journal-") as tmp:
        folder = Path(tmp)
        base_rss = rss_mb()
        pub, publish = pass_publish(args, folder)
        print(f"publish: {publish['rate']:,.0f} entries/s", flush=True)
        subs = []
        try:
            for count in [int(c) for c in args.counts.split(",")]:
                subs.append(pass_subscribers(args, pub, folder, count))
                print(f"{count} subscribers: {subs[-1]['total']:,.0f} entries/s total",
                      flush=True)
        finally:
            pub.close()
        ten = [s for s in subs if s["count"] == 10]
        per_sub = (ten or subs)[0]["per_sub"]     # without a 10-subscriber pass: the first
        lag = None if args.no_lag else pass_lag(args, folder, per_sub)
    out = report(args, publish, subs, lag, base_rss)
    print("\n" + out)
    if args.markdown:
        Path(args.markdown).write_text(out + "\n")
    if args.plot:
        plot(args.plot, subs, lag)


if __name__ == "__main__":
    main()
