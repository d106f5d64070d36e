"""Blackboard throughput against the floor: a raw SQLAlchemy Core bulk upsert.

For each store (SQLite file, PostgreSQL when reachable) and each of
``--rounds`` rounds:

* **blackboard**: ``load_many`` of N records of ~1 KB, change 3 attributes on
  each (set two literals, add one), ``commit_many`` — leases taken and
  released, version check, every document parsed and serialised once (the
  blackboard parses lazily, so the changes are replayed at commit);
* **raw upsert**: the same N rows (id, JSON document, version, timestamp),
  already serialised, written with one Core ``INSERT … ON CONFLICT DO
  UPDATE`` executemany in one transaction — no reads, no leases, no JSON
  work: the floor for writing those rows at all.

The medians go into one table with the ratio blackboard / raw.  Run::

    .venv/bin/python bench/bench_blackboard.py            # SQLite + PostgreSQL
    .venv/bin/python bench/bench_blackboard.py --records 10000 --rounds 5 \\
        --pg postgresql+psycopg://postgres@127.0.0.1:55432/chalk_test

PostgreSQL: ``--pg URL`` or ``CHALK_BENCH_PG_URL``; default
``scripts/services.sh postgres-url``; skipped when unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path as FsPath

sys.path.insert(0, str(FsPath(__file__).resolve().parents[1]))

from sqlalchemy import MetaData, Table, create_engine, text  # noqa: E402
from sqlalchemy.dialects import postgresql, sqlite  # noqa: E402

from blackboard import Blackboard, Literal  # noqa: E402

ROOT = FsPath(__file__).resolve().parents[1]


def make_attributes(n: int) -> dict:
    """~1 KB of attributes for record ``n`` (strings, numbers, a list, a sub-object)."""
    return {
        "title": f"Record number {n} about the blackboard benchmark",
        "body": ("lorem ipsum dolor sit amet consectetur " * 16)[: 600],
        "lang": "en",
        "tags": ["alpha", "beta", "gamma", f"t{n % 97}"],
        "count": n,
        "score": n / 7.0,
        "author": {"name": f"Author {n % 31}", "email": f"a{n % 31}@example.org"},
        "url": f"https://example.org/docs/{n}/index.html",
    }


def populate(url: str, n: int) -> list[str]:
    ids = [f"doc-{i:06d}" for i in range(n)]
    with Blackboard.connect(url, owner="bench-populate") as bb:
        for start in range(0, n, 2000):
            part = ids[start:start + 2000]
            for rid in part:
                bb.create(rid)
                bb.set_attributes(rid, make_attributes(int(rid[4:])))
            bb.commit_many(part)
    return ids


def run_blackboard(url: str, ids: list[str], round_no: int, batch: int
                   ) -> tuple[float, list[float]]:
    """Total seconds, and seconds per phase (load, change, commit)."""
    bb = Blackboard.connect(url, owner=f"bench-{round_no}")
    phases = [0.0, 0.0, 0.0]
    try:
        started = time.perf_counter()
        for start in range(0, len(ids), batch):
            part = ids[start:start + batch]
            t0 = time.perf_counter()
            bb.load_many(part)
            t1 = time.perf_counter()
            for rid in part:
                bb.set_literal(rid, "title", f"changed title {round_no}")
                bb.set_literal(rid, "count", Literal(round_no, "counter"))
                bb.add_literal(rid, "tags", f"round{round_no}")
            t2 = time.perf_counter()
            bb.commit_many(part)
            t3 = time.perf_counter()
            phases = [phases[0] + t1 - t0, phases[1] + t2 - t1, phases[2] + t3 - t2]
        return time.perf_counter() - started, phases
    finally:
        bb.close()


def raw_rows(url: str, ids: list[str]) -> list[dict]:
    """The rows the blackboard writes, serialised up front (the floor does no JSON work)."""
    bb = Blackboard.connect(url, owner="bench-raw-rows")
    try:
        bb.load_many(ids)
        rows = [{"id": rid, "doc": json.dumps(bb.document(rid), separators=(",", ":")),
                 "version": 1, "updated_at": time.time()} for rid in ids]
        bb.invalidate_many(ids)
    finally:
        bb.close()
    return rows


def run_raw(url: str, rows: list[dict], batch: int) -> float:
    engine = create_engine(url)
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[engine.dialect.name]
    # the blackboard's record table, read from the database (its layout is the blackboard's own)
    records_table = Table("chalk_records", MetaData(), autoload_with=engine)
    stmt = insert(records_table)
    stmt = stmt.on_conflict_do_update(
        index_elements=[records_table.c.id],
        set_={"doc": stmt.excluded.doc, "updated_at": stmt.excluded.updated_at,
              "version": records_table.c.version + 1})
    try:
        with engine.connect() as conn:  # connect outside the timer, as the blackboard's pool is warm
            conn.execute(text("select 1"))
            conn.commit()
            started = time.perf_counter()
            for start in range(0, len(rows), batch):
                with conn.begin():
                    conn.execute(stmt, rows[start:start + batch])
            return time.perf_counter() - started
    finally:
        engine.dispose()


def pg_url(arg: str | None) -> str | None:
    if arg:
        return arg
    if os.environ.get("CHALK_BENCH_PG_URL"):
        return os.environ["CHALK_BENCH_PG_URL"]
    script = ROOT / "scripts" / "services.sh"
    if script.exists():
        try:
            return subprocess.run(["bash", str(script), "postgres-url"], capture_output=True,
                                  text=True, check=True, timeout=30).stdout.strip() or None
        except (subprocess.SubprocessError, OSError):
            return None
    return None


def fresh_pg_database(url: str) -> str | None:
    """A new empty database next to ``url`` (dropped by :func:`drop_pg_database`)."""
    base = url.rsplit("/", 1)[0]
    name = f"chalk_bench_{os.getpid()}"
    try:
        admin = create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
    except Exception as e:  # noqa: BLE001 - any failure means: no PostgreSQL here
        print(f"PostgreSQL at {url} not usable ({type(e).__name__}: {e}); skipped",
              file=sys.stderr)
        return None
    return f"{base}/{name}"


def drop_pg_database(url: str) -> None:
    base, name = url.rsplit("/", 1)
    admin = create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def bench_store(label: str, url: str, n: int, rounds: int, batch: int) -> dict:
    ids = populate(url, n)
    rows = raw_rows(url, ids)
    size = statistics.mean(len(r["doc"]) for r in rows[:200])
    bb_times, raw_times, phases = [], [], []
    for r in range(rounds):  # interleaved, so drift hits both alike
        total, split = run_blackboard(url, ids, r + 1, batch)
        bb_times.append(total)
        phases.append(split)
        raw_times.append(run_raw(url, rows, batch))
    bb_rate = n / statistics.median(bb_times)
    raw_rate = n / statistics.median(raw_times)
    return {"store": label, "doc_bytes": size, "bb": bb_rate, "raw": raw_rate,
            "ratio": bb_rate / raw_rate,
            "phases": [statistics.median(p[i] for p in phases) for i in range(3)],
            "raw_s": statistics.median(raw_times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10_000,
                        help="records per load_many/commit_many (default: all in one batch)")
    parser.add_argument("--pg", help="PostgreSQL SQLAlchemy URL (a scratch database is made next to it)")
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results.append(bench_store("SQLite (WAL file)", f"sqlite:///{tmp}/bench.db",
                                   args.records, args.rounds, args.batch))
    if not args.no_pg:
        url = pg_url(args.pg)
        scratch = fresh_pg_database(url) if url else None
        if scratch:
            try:
                results.append(bench_store("PostgreSQL", scratch, args.records, args.rounds,
                                           args.batch))
            finally:
                drop_pg_database(scratch)

    print(f"\n{args.records} records, batch {args.batch}, median of {args.rounds} rounds "
          f"(records/s; higher is better)\n")
    print("| store | doc bytes | blackboard load+3 changes+commit | raw Core upsert | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['store']} | {r['doc_bytes']:.0f} | {r['bb']:,.0f} | {r['raw']:,.0f} | "
              f"{r['ratio']:.2f} |")
    print("\nmedian seconds per phase: blackboard load / change / commit; raw upsert")
    for r in results:
        load, change, commit = r["phases"]
        print(f"  {r['store']}: {load:.3f} / {change:.3f} / {commit:.3f}; {r['raw_s']:.3f}")


if __name__ == "__main__":
    main()
