"""The style rules that tools check: ruff everywhere, mypy on every package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_package_is_mypy_clean() -> None:
    done = _run("mypy", "blackboard", "engine", "pipelets", "listener_router")
    assert done.returncode == 0, done.stdout + done.stderr
