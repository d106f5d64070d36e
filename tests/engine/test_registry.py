"""The workflow registry: duplicate process names, versions, reloads."""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path

import pytest
from engine_helpers import BPEL_HEADER

from engine import WorkflowRegistry

_LATER = itertools.count(1)


def _write(path: Path, name: str, body: str) -> Path:
    path.write_text(BPEL_HEADER.format(name=name) + body + "</process>")
    stamp = time.time() + next(_LATER)  # a new mtime whatever the clock's resolution
    os.utime(path, (stamp, stamp))
    return path


def test_a_second_file_with_a_running_name_is_one_error_and_takes_nothing_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    original = _write(tmp_path / "z_original.xml", "Shared", "<empty name='v1'/>")
    registry = WorkflowRegistry(tmp_path)
    running = registry.get("Shared")

    # sorts before the original: it used to win the name
    intruder = _write(tmp_path / "a_copy.xml", "Shared", "<empty name='other'/>")
    with caplog.at_level(logging.INFO, logger="engine"):
        errors = registry.refresh()

    assert registry.get("Shared") == running
    # one problem, one error (on the file that takes the name over), logged by no one here:
    # the caller reports what refresh returns (the service logs it once)
    (error,) = errors
    assert error.startswith(f"{intruder}:") and f"already defined in {original}" in error
    assert f"version {running.version[:12]} from {original} keeps running" in error
    assert registry.errors == errors
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []

    # editing the original while the clash lasts does not replace the running version either
    _write(original, "Shared", "<sequence><empty name='v2'/><empty/></sequence>")
    registry.refresh()
    assert registry.get("Shared") == running
    assert registry.errors == errors
    assert registry.file_errors("Shared") == errors

    # the clash resolved: the remaining file's version runs, and nothing is an error
    intruder.unlink()
    assert registry.refresh() == []
    assert registry.errors == []
    assert registry.get("Shared").version != running.version
    assert registry.get("Shared").path == str(original)


def test_two_files_with_one_name_at_start_load_neither(tmp_path: Path) -> None:
    one = _write(tmp_path / "one.xml", "Twin", "<empty/>")
    two = _write(tmp_path / "two.xml", "Twin", "<empty name='x'/>")
    _write(tmp_path / "other.xml", "Other", "<empty/>")
    registry = WorkflowRegistry(tmp_path)
    assert registry.names() == ["Other"]
    (error,) = registry.errors
    assert error.startswith(f"{two}:") and f"already defined in {one}" in error
    assert error.endswith("(neither runs)")


def test_reloads_are_logged_with_the_version_and_listed(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "w.xml", "W", "<empty/>")
    with caplog.at_level(logging.INFO, logger="engine"):
        registry = WorkflowRegistry(tmp_path)
        first = registry.get("W")
        _write(path, "W", "<sequence><empty/><empty/></sequence>")
        registry.refresh()
        second = registry.get("W")
        registry.refresh()  # nothing changed: nothing logged

    assert first.version != second.version
    loaded = [r.getMessage() for r in caplog.records if "workflow W" in r.getMessage()]
    assert loaded == [f"workflow W version {first.version[:12]} loaded from {path}",
                      f"workflow W version {second.version[:12]} loaded from {path} "
                      f"(was {first.version[:12]})"]
    (version,) = registry.versions()
    assert (version.name, version.version, version.path) == ("W", second.version, str(path))
    assert version.loaded_at > 0
