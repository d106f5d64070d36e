"""Engine benchmark: Spark runner vs the same pipelets in a plain Python loop.

100,000 records of ~1 KB go through a 5-pipelet workflow with one ``if``
(NormalizeWhitespace, WordCount, RegexExtract, then Replace for German or
SetValue for the rest, then Lowercase of the title).  Reported side by side
in one run:

* plain loop: the same configured pipelets called one after the other with
  every ID, the ``if`` as a Python test, on one in-process blackboard (the
  least work possible in one process);
* LocalRunner: the engine in this process (interpreter, XPath condition,
  record round trip) -- shows the engine's own cost;
* SparkRunner: one Spark job per batch, records there and back (driver
  export/import included), batches through ``run_stream`` (the next job in
  flight while one finishes, as a service runs them).  Measured twice: on
  the first records after the session starts (the JVM still compiling the
  regular expressions and generated code of the DataFrame forms), and warm,
  once ``--warmup`` records have gone through, as in a service that has run
  for a few minutes.

Then the fixed cost of a Spark batch (one instance) and records/s for batch
sizes 100, 1,000 and 10,000, three ways: the DataFrame forms (the
workflow's default), the interpreter as a job of its own, and the
interpreter on warm workers (``engine._warm``: tasks that stay up between
batches).

Run: ``.venv/bin/python bench/bench_engine.py`` (``--records 20000`` for a
quicker look; ``--master local[4]`` on a bigger machine).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blackboard import Blackboard
from engine import LocalRunner, SparkRunner, Workflow, load_workflow, spark_session

WORKFLOW = """<?xml version="1.0" encoding="utf-8"?>
<process name="Bench" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="normalize">
      <proc:pipelet class="pipelets.text.NormalizeWhitespace"/>
      <proc:configuration><proc:param name="attribute">text</proc:param>
        <proc:param name="lowercase">true</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="count">
      <proc:pipelet class="pipelets.text.WordCount"/>
      <proc:configuration><proc:param name="attribute">text</proc:param>
        <proc:param name="output">words</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="longWords">
      <proc:pipelet class="pipelets.text.RegexExtract"/>
      <proc:configuration><proc:param name="attribute">text</proc:param>
        <proc:param name="pattern">\\b(\\w{11,})\\b</proc:param>
        <proc:param name="output">long</proc:param></proc:configuration>
    </proc:invokePipelet>
    <if>
      <condition>$record/Val[@key='lang'] = 'de'</condition>
      <proc:invokePipelet name="german">
        <proc:pipelet class="pipelets.text.Replace"/>
        <proc:configuration><proc:param name="attribute">text</proc:param>
          <proc:param name="pattern">\\bund\\b</proc:param>
          <proc:param name="replacement">and</proc:param></proc:configuration>
      </proc:invokePipelet>
      <else>
        <proc:invokePipelet name="other">
          <proc:pipelet class="pipelets.values.SetValue"/>
          <proc:configuration><proc:param name="attribute">label</proc:param>
            <proc:param name="value">other</proc:param></proc:configuration>
        </proc:invokePipelet>
      </else>
    </if>
    <proc:invokePipelet name="title">
      <proc:pipelet class="pipelets.text.Lowercase"/>
      <proc:configuration><proc:param name="attribute">title</proc:param></proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""

WORDS = ("und der die das alpha beta gamma delta epsilon information retrieval blackboard "
         "workflow pipelet record processing engine verarbeitung datensatz").split()


def make_records(n: int, seed: int = 7) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        words = []
        size = 0
        while size < 900:
            w = rng.choice(WORDS)
            words.append(w.upper() if rng.random() < 0.1 else w)
            size += len(w) + 2
        text = "  ".join(words)
        out[f"rec-{i:06d}"] = {"title": f"Record Number {i} Title", "text": text,
                               "lang": "de" if i % 2 else "en"}
    return out


def load(records: dict[str, dict[str, Any]]) -> Blackboard:
    bb = Blackboard.local()
    for rid, attrs in records.items():
        bb.create(rid)
        bb.set_attributes(rid, attrs)
    return bb


def plain_loop(wf: Workflow, bb: Blackboard, ids: list[str]) -> None:
    from engine import instantiate_pipelet

    p = {a.name: instantiate_pipelet(a) for a in wf.pipelets()}
    ids = p["normalize"].process(bb, ids)
    ids = p["count"].process(bb, ids)
    ids = p["longWords"].process(bb, ids)
    de = [r for r in ids if bb.get_literal(r, "lang").value == "de"]
    de_set = set(de)
    rest = [r for r in ids if r not in de_set]
    p["german"].process(bb, de)
    p["other"].process(bb, rest)
    p["title"].process(bb, ids)


def timed_runs(runner: Any, wf: Workflow, records: dict[str, dict[str, Any]], batch: int) -> tuple[float, Blackboard]:
    bb = load(records)
    ids = list(records)
    batches = [[[rid] for rid in ids[i:i + batch]] for i in range(0, len(ids), batch)]
    started = time.perf_counter()
    # SparkRunner.run_stream keeps the next job in flight while one finishes
    stream = runner.run_stream(wf, bb, batches) if hasattr(runner, "run_stream") else (
        runner.run(wf, bb, b) for b in batches)
    for results in stream:
        bad = [r for r in results if not r.ok]
        if bad:
            raise SystemExit(f"benchmark instance failed: {bad[0].error}")
    return time.perf_counter() - started, bb


def median_time(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=10_000, help="instances per Spark job in the main run")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--warmup", type=int, default=300_000,
                    help="records the Spark runner has processed (the first pass included) before the warm pass")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.xml"
        path.write_text(WORKFLOW)
        wf = load_workflow(path)

    print(f"making {args.records:,} records ...", flush=True)
    records = make_records(args.records)
    doc_size = len(str(make_records(1)["rec-000000"]))
    print(f"record size ~{doc_size} bytes of attributes")

    bb = load(records)
    t = time.perf_counter()
    plain_loop(wf, bb, list(records))
    loop_s = time.perf_counter() - t
    reference = {rid: bb.get_attributes(rid) for rid in records}
    del bb

    local_s, lbb = timed_runs(LocalRunner(), wf, records, args.batch)
    assert {rid: lbb.get_attributes(rid) for rid in reference} == reference, "LocalRunner differs from the loop"
    del lbb

    t = time.perf_counter()
    spark = spark_session(args.master)
    start_s = time.perf_counter() - t
    runner = SparkRunner(spark, batch_timeout=600)
    runner.warm_up()  # Python workers started, as a service does before its first batch
    # cold: the first records after start, while the JVM still compiles its hot code
    cold_s, sbb = timed_runs(runner, wf, records, args.batch)
    assert {rid: sbb.get_attributes(rid) for rid in reference} == reference, "SparkRunner differs from the loop"
    del sbb
    # warm: after --warmup records in all, as in a service that has been running a while
    warm_records = make_records(min(args.warmup, args.records), seed=1)
    for _ in range(max(0, args.warmup - args.records) // len(warm_records)):
        timed_runs(runner, wf, warm_records, args.batch)
    spark_s, sbb = timed_runs(runner, wf, records, args.batch)
    assert {rid: sbb.get_attributes(rid) for rid in reference} == reference, "SparkRunner differs from the loop"
    del sbb

    n = args.records
    print()
    print(f"{n:,} records, 5 pipelets + 1 if, Spark {args.master}, {args.batch:,} instances per job")
    print("| runner | seconds | records/s | vs loop |")
    print("| --- | --- | --- | --- |")
    for name, secs in (("plain Python loop (one process)", loop_s), ("LocalRunner (engine, one process)", local_s),
                       (f"SparkRunner {args.master}, first {n:,} records after start", cold_s),
                       (f"SparkRunner {args.master}, warm (after {max(args.warmup, n):,} records)", spark_s)):
        print(f"| {name} | {secs:.2f} | {n / secs:,.0f} | {loop_s / secs:.2f}x |")
    print(f"(SparkSession start: {start_s:.1f} s, not included)")

    print()
    print("Spark batch sizes, median seconds (records/s): the workflow's DataFrame forms (its")
    print("default); the interpreter as a job of its own; the interpreter on warm workers")
    print("| Spark batch size | DataFrame forms | interpreter, a job of its own | interpreter, warm workers |")
    print("| --- | --- | --- | --- |")
    kinds = [runner, SparkRunner(spark, batch_timeout=600, frames=False, warm=False),
             SparkRunner(spark, batch_timeout=600, frames=False, warm=True)]
    for size, repeat in ((1, 9), (100, 5), (1_000, 5), (10_000, 3)):
        sized = make_records(size, seed=3)
        load_s = median_time(lambda sized=sized: load(sized), 1)
        cells = []
        for kind in kinds:
            def run_one(sized: dict[str, dict[str, Any]] = sized, kind: Any = kind) -> None:
                b = load(sized)
                kind.run(wf, b, [[rid] for rid in sized])

            run_one()  # the kind's first batch (warm workers start) is not counted
            secs = max(1e-6, median_time(run_one, repeat) - load_s)
            cells.append(f"{secs:.3f} ({size / secs:,.0f})")
        label = "1 (the fixed cost)" if size == 1 else f"{size:,}"
        print(f"| {label} | " + " | ".join(cells) + " |")
    for kind in kinds:  # their tasks would be cancelled with the session, noisily
        if kind.warm is not None:
            kind.warm.park()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
