"""Engine test fixtures (the SparkSession is the shared ``spark`` fixture of tests/conftest.py)."""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import BPEL_HEADER

from engine import Workflow, load_workflow

# Full-text indexes of SMILA files (LuceneIndexPipelet -> pipelets.index) go to a scratch
# directory, set before any Spark worker starts so the workers see it too.
os.environ.setdefault("CHALK_INDEX_DIR", tempfile.mkdtemp(prefix="chalk-test-indexes-"))


@pytest.fixture
def make_workflow(tmp_path: Path) -> Callable[..., Workflow]:
    """Write a process around ``body`` XML to a file and load it."""

    def make(body: str, name: str = "Test", **kwargs: Any) -> Workflow:
        path = tmp_path / f"{name}.xml"
        path.write_text(BPEL_HEADER.format(name=name) + textwrap.dedent(body) + "</process>")
        return load_workflow(path, **kwargs)

    return make


