"""The lab for the tests in this folder: built once per session (``scripts/lab.sh up``),
taken down at its end, and by itself should this process die (``--owner``).

It needs root (network namespaces) and what ``scripts/install.sh`` installs; without
them the tests skip with the reason (under ``scripts/test.sh``: they fail).  The lab
uses none of the main suite's services: ``scripts/test.sh`` runs this folder in a
pytest process of its own, beside the main suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _lab import LAB_SH, Lab, left_behind


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces)"
    for tool in ("ip", "nft", "unshare", "java"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: run scripts/install.sh"
    if not Path("/usr/sbin/rabbitmq-server").exists():
        return "rabbitmq-server is missing: run scripts/install.sh"
    return None


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    why = _missing()
    if why is None:
        done = subprocess.run(["bash", str(LAB_SH), "up", "--owner", str(os.getpid()),
                               "--max-seconds", "5400"], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=600)
        print(done.stderr, file=sys.stderr)
        if done.returncode != 0:
            why = f"scripts/lab.sh up failed:\n{done.stderr[-3000:]}"
    if why is not None:
        if os.environ.get("CHALK_TEST_REQUIRE_SERVICES") == "1":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    try:
        yield Lab()
    finally:
        subprocess.run(["bash", str(LAB_SH), "down"], stdin=subprocess.DEVNULL, timeout=300,
                       check=False)
        left = left_behind()
        assert not left, f"scripts/lab.sh down left {left}"
