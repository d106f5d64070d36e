"""``scripts/demo.sh``, as the README runs it: pointed at a broker on another port by one
variable (``CHALK_BROKER_URL``: no RabbitMQ is started then), it warms the path and
prints the cold start and the steady rate apart.  (How fast is the benchmark's business:
``bench/bench_listener.py --pipelets demo``; here only that the figures are there.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_the_demo_script_warms_up_then_prints_the_cold_start_and_the_steady_rate_apart(
        amqp_queues: Any) -> None:
    env = dict(os.environ, CHALK_BROKER_URL=amqp_queues.url, COLUMNS="200",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh"), "--records", "2000",
                           "--warmup", "200"], env=env, capture_output=True, text=True,
                          timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "[services]" not in done.stderr          # the variable's broker: none started
    port = re.search(r":(\d+)/", amqp_queues.url).group(1)
    assert f"broker 127.0.0.1:{port} (CHALK_BROKER_URL)" in " ".join(out.split())
    cold = re.search(r"cold start: Spark ([\d.]+) s, then 200 records to warm the path in "
                     r"([\d.]+) s \((\d+) Spark jobs of 100\)", " ".join(out.split()))
    assert cold is not None, out
    assert int(cold.group(3)) >= 2
    steady = re.search(r"steady rate: ([\d,]+) records/s over 2,000 records, warm \(the cold "
                       r"start apart: ([\d.]+) s\)", " ".join(out.split()))
    assert steady is not None, out
    assert int(steady.group(1).replace(",", "")) > 0
    assert float(steady.group(2)) == pytest.approx(float(cold.group(1)) + float(cold.group(2)),
                                                   abs=0.11)
    assert "demo OK" in out
