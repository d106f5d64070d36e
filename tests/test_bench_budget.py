"""The CPU budget's arithmetic: probes count each step once, and the table adds up.

The budget is read to decide what to cut: a step counted twice (in itself and in
the step that calls it), or a stage that leaves part of a process out, would point
at the wrong one.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
budget = importlib.import_module("bench_budget")


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_probe_inside_another_is_not_counted_in_the_outer_one() -> None:
    inner = budget._probe("test: inner", lambda: _spin(0.02))

    def work() -> None:
        _spin(0.02)
        inner()

    outer = budget._probe("test: outer", work)
    outer()
    spent = budget.probes()
    assert 0.015 < spent["test: inner"][0] < 0.04
    assert 0.015 < spent["test: outer"][0] < 0.04
    assert spent["test: outer"][1] == 1


def test_a_probe_called_inside_itself_counts_once() -> None:
    calls = []

    def again(depth: int) -> None:
        calls.append(depth)
        _spin(0.005)
        if depth:
            probed(depth - 1)

    probed = budget._probe("test: recursive", again)
    probed(2)
    assert calls == [2, 1, 0]
    assert budget.probes()["test: recursive"][1] == 1


def _run(processes: dict[str, float], steps: dict[str, float]) -> dict[str, Any]:
    return {"processes": processes, "steps": steps, "threads": {}}


def test_the_stages_add_up_to_the_processes() -> None:
    chalk = _run({"service": 100.0, "broker I/O": 20.0, "JVM": 30.0, "Spark workers": 40.0,
                  "RabbitMQ": 45.0},
                 {"gather: parse + match": 10.0, "commit: route": 5.0,
                  "relay: deliveries from the broker process": 3.0})
    hand = _run({"hand-written": 60.0, "RabbitMQ": 50.0},
                {"receive: delivery callback": 2.0, "pipelets: the three steps": 4.0})
    rows = {row["stage"]: row for row in budget.budget(chalk, hand)}
    stages = [row for name, row in rows.items()
              if name not in ("all own processes", "RabbitMQ node")]
    assert sum(r["chalk"] for r in stages) == rows["all own processes"]["chalk"] == 190.0
    assert sum(r["handwritten"] for r in stages) == rows["all own processes"]["handwritten"] == 60.0
    assert rows["the service's other threads (run loop, queues, py4j, GC)"]["chalk"] == 82.0
    assert rows["broker I/O (AMQP frames, socket)"]["chalk"] == 23.0
    assert rows["RabbitMQ node"]["handwritten"] == 50.0


def test_the_table_gives_the_median_and_the_spread_of_the_runs() -> None:
    runs = [budget.budget(_run({"service": s}, {}), _run({"hand-written": h}, {}))
            for s, h in ((10.0, 5.0), (30.0, 7.0), (20.0, 6.0))]
    total = next(r for r in budget.budget_table(runs) if r["stage"] == "all own processes")
    assert total["chalk"] == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert total["handwritten"] == {"median": 6.0, "min": 5.0, "max": 7.0}


def test_the_timed_writer_tells_who_held_it_from_who_waited_for_it() -> None:
    import threading

    writer = budget._TimedWriter(threading.Lock())
    holding = threading.Event()

    def hold(seconds: float) -> None:
        with writer:
            holding.set()
            time.sleep(seconds)

    first = threading.Thread(target=hold, args=(0.3,), name="chalk-commit_0")
    first.start()
    holding.wait()
    second = threading.Thread(target=hold, args=(0.0,), name="chalk-gather-q")
    second.start()
    first.join()
    second.join()
    spent = budget.writer()
    waited_commit, held_commit = spent["chalk-commit"]
    waited_gather, held_gather = spent["chalk-gather"]
    assert 0.25 < held_commit < 1.0 and waited_commit < 0.05
    assert 0.15 < waited_gather < 1.0 and held_gather < 0.05
