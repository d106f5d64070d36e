"""A 200 MB attachment streams into storage and back out in bounded memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SIZE = 200 * 1024 * 1024
SCRIPT = Path(__file__).with_name("_bigfile.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_200_mb_attachment_streams_in_and_out_with_under_50_mb_peak_growth(
        store_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path),  # the spool file goes here
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), store_url, str(SIZE)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["match"] and report["size"] == SIZE
    assert report["write_growth_mb"] < 50, report
    assert report["read_growth_mb"] < 50, report
