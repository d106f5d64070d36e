"""Blackboard test fixtures: ``store_url`` runs a test on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from blackboard import Blackboard


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh store: a SQLite file, or a fresh PostgreSQL database (shared fixtures)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def bb(store_url: str) -> Iterator[Blackboard]:
    board = Blackboard.connect(store_url, owner="test-owner")
    yield board
    board.close()


@pytest.fixture
def local() -> Blackboard:
    """A storage-less blackboard with one empty record ``r``."""
    board = Blackboard.local()
    board.create("r")
    return board
