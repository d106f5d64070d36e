"""Engine test fixtures.

``engine_spark`` is the session's SparkSession: the shared ``spark`` fixture
from ``tests/conftest.py`` when it exists, else one made here (once per test
session, local[2]).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import BPEL_HEADER

from engine import Workflow, load_workflow


@pytest.fixture(scope="session")
def engine_spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    try:
        yield request.getfixturevalue("spark")
        return
    except pytest.FixtureLookupError:
        pass
    from engine import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture
def make_workflow(tmp_path: Path) -> Callable[..., Workflow]:
    """Write a process around ``body`` XML to a file and load it."""

    def make(body: str, name: str = "Test", **kwargs: Any) -> Workflow:
        path = tmp_path / f"{name}.xml"
        path.write_text(BPEL_HEADER.format(name=name) + textwrap.dedent(body) + "</process>")
        return load_workflow(path, **kwargs)

    return make


