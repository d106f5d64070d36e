"""Fixtures for pipelet tests: local blackboards and a SQLite-backed one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from blackboard import Blackboard


@pytest.fixture
def bb() -> Iterator[Blackboard]:
    board = Blackboard.local()
    yield board
    board.close()


@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'pipelets.db'}"
