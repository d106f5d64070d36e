"""The work-bound bench end to end: its documented command runs, and Chalk and the
hand-written consumer leave the same records behind.

Ratios between two sides that did different work would mean nothing: these run
both on the real broker and Spark and compare what each stored.
"""

from __future__ import annotations

import importlib
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_bench_handwritten import stored
from test_bench_web import assert_web_work_done
from test_docs import code_blocks

from blackboard import Blackboard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
listener = importlib.import_module("bench_listener")

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def test_the_documented_work_bound_command_runs_the_same_work_on_both_sides(
        spark: Any, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/performance.md's command, with fewer messages, no warm-up and no cold pass."""
    (block,) = [b for b in code_blocks(REPO / "docs" / "performance.md", "")
                if "bench/bench_listener.py --pipelets real" in b]
    argv = shlex.split(block)
    assert argv[:2] == [".venv/bin/python", "bench/bench_listener.py"]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    figures = tmp_path / "figures.json"
    n = 240
    assert listener.main([*argv[2:], "--messages", str(n), "--warmup", "0", "--no-cold",
                          "--runs", "1", "--broker", broker_url, "--json", str(figures)]) == 0
    out = json.loads(figures.read_text())
    summary = out["summary"]["1"]
    assert summary["vs_handwritten"] > 0 and summary["vs_handwritten_2"] > 0
    (run,) = out["runs"]
    assert (run["handwritten"]["processes"], run["handwritten_2"]["processes"]) == (1, 2)
    assert run["committed"] == n and "bare" not in summary
    assert run["cpu_us"]["Spark workers"] > 0       # the pipelets ran on Spark's workers
    here = Path(out["dir"])
    assert_web_work_done(stored(here / "handwritten.db"), range(2 * n))  # 1, then 2 processes
    ids = [f"b{i:07d}" for i in range(n)]
    with Blackboard.connect(f"sqlite:///{here / 'bench.db'}") as bb:
        bb.load_many(ids)
        chalk = {i: bb.get_attributes(i) for i in ids}
    assert_web_work_done(chalk, range(n))
