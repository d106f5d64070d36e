"""A driver process for tests/engine/test_spark_standalone.py: runs workflows over
JSONL records on one Spark master and commits the results, as ``chalk process`` does.

    python _cluster_driver.py PLAN.json

PLAN has ``master``, ``conf`` (Spark settings), ``blackboard`` (SQLAlchemy URL),
``workflows`` (directory), ``runs`` (each ``workflow``, ``input`` JSONL,
``batch_size``, ``stream``: whether batches go through ``run_stream``),
``probe_module`` (a module to look for on the executors) and ``summary`` (where
to write what happened, as JSON).  Input lines are ``{"id", "attributes",
"instance", "attachments": {name: text}}``; consecutive lines with one
``instance`` form one workflow instance.  Run it with the working directory
the workflows expect (relative file names in their configuration).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from itertools import groupby
from typing import Any

import engine
from blackboard import Blackboard


def read_instances(path: str) -> list[list[dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [list(group) for _, group in groupby(lines, key=lambda r: r["instance"])]


def _put(bb: Blackboard, instances: list[list[dict[str, Any]]]) -> list[list[str]]:
    bb.load_many([r["id"] for one in instances for r in one])
    for one in instances:
        for r in one:
            if r.get("attributes"):
                bb.set_attributes(r["id"], r["attributes"])
            for name, text in (r.get("attachments") or {}).items():
                bb.set_attachment(r["id"], name, text.encode("utf-8"))
    return [[r["id"] for r in one] for one in instances]


def _commit(bb: Blackboard, results: list[engine.InstanceResult], first: int) -> list[list[Any]]:
    bb.invalidate_many([rid for r in results if not r.ok for rid in r.record_ids])
    bb.commit_many([rid for r in results if r.ok for rid in r.record_ids])
    return [[first + r.index, r.ok, r.error, r.result_ids, r.record_ids] for r in results]


def run(runner: Any, workflow: Any, bb: Blackboard, instances: list[list[dict[str, Any]]],
        batch_size: int, stream: bool) -> list[list[Any]]:
    """Every instance through ``runner`` in batches; rows ``[instance, ok, error, result_ids, record_ids]``."""
    batches = [instances[i:i + batch_size] for i in range(0, len(instances), batch_size)]
    out: list[list[Any]] = []
    if stream:
        def loaded() -> Iterator[list[list[str]]]:
            for batch in batches:
                yield _put(bb, batch)

        for k, results in enumerate(runner.run_stream(workflow, bb, loaded())):
            out += _commit(bb, results, k * batch_size)
    else:
        for k, batch in enumerate(batches):
            out += _commit(bb, runner.run(workflow, bb, _put(bb, batch)), k * batch_size)
    return out


def probe(spark: Any, module: str, cores: int) -> list[dict[str, Any]]:
    """What Python workers on the executors see: their interpreter, directory, where ``module`` comes from."""
    import pyarrow as pa

    def look(batches: Any) -> Any:
        import importlib
        import importlib.machinery
        import os
        import sys

        for _ in batches:
            pass
        hidden = [d for d in os.environ.get("CHALK_TEST_HIDDEN", "").split(os.pathsep) if d]
        visible = [d for d in hidden
                   if importlib.machinery.PathFinder.find_spec(module, [d]) is not None]
        try:
            where, error = getattr(importlib.import_module(module), "__file__", None), None
        except ImportError as e:
            where, error = None, str(e)
        info = {"executable": sys.executable, "cwd": os.getcwd(), "hidden": hidden,
                "hidden_but_visible": visible, "module_file": where, "import_error": error,
                "wrapped": os.environ.get("CHALK_TEST_WORKER_PYTHON") == "1"}
        yield pa.RecordBatch.from_pydict({"info": [json.dumps(info)]})

    rows = spark.range(cores, numPartitions=cores).mapInArrow(look, "info string").collect()
    return [json.loads(row.info) for row in rows]


def main(plan_path: str) -> int:
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    started = time.monotonic()
    spark = engine.spark_session(plan["master"], plan.get("conf") or {}, app_name="chalk-standalone-test")
    session_seconds = time.monotonic() - started
    registry = engine.WorkflowRegistry(plan["workflows"])
    if registry.errors:
        print("\n".join(registry.errors), file=sys.stderr)
        return 2
    runner = engine.SparkRunner(spark, batch_timeout=plan.get("batch_timeout", 120))
    warm_up = runner.warm_up()
    summary: dict[str, Any] = {"master": spark.sparkContext.master, "session_seconds": session_seconds,
                               "warm_up_seconds": warm_up, "runs": {}}
    with Blackboard.connect(plan["blackboard"]) as bb:
        for spec in plan["runs"]:
            wf = registry.get(spec["workflow"])
            before = runner.frame_records
            t = time.monotonic()
            results = run(runner, wf, bb, read_instances(spec["input"]), spec["batch_size"],
                          spec.get("stream", False))
            summary["runs"][spec["workflow"]] = {
                "results": results, "seconds": time.monotonic() - t,
                "frame_records": runner.frame_records - before,
            }
    sc = spark.sparkContext
    summary["default_parallelism"] = sc.defaultParallelism
    summary["conf_parallelism"] = sc.getConf().get("spark.default.parallelism", None)
    if plan.get("probe_module"):
        summary["executors"] = probe(spark, plan["probe_module"], max(1, sc.defaultParallelism))
    with open(plan["summary"], "w", encoding="utf-8") as f:
        json.dump(summary, f)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
