"""``chalk status`` shows the workflow versions a running service runs and their last reload."""

from __future__ import annotations

import re
import signal
import time

import pytest
from listener_router_helpers import (
    kill_group,
    start_service,
    wait_for_log,
    write_config,
    write_test_workflows,
)

from listener_router.cli import main


def _status(config, capsys) -> str:
    assert main(["status", "--config", str(config)]) == 0
    return capsys.readouterr().out


def _wait_status(config, capsys, needle: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = _status(config, capsys)
        if needle in out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _row(out: str, version: str) -> str | None:
    """The table row of workflow Counting at ``version``."""
    return next((line for line in out.splitlines()
                 if line.lstrip("│┃ ").startswith("Counting") and version in line), None)


@pytest.mark.broker
@pytest.mark.slow
def test_status_shows_each_running_version_and_its_last_reload(tmp_path, broker_url, qname, capsys,
                                                               monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    workflows = write_test_workflows(tmp_path / "workflows")
    log = tmp_path / "service.log"
    config = write_config(tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}",
                          broker=broker_url, workflows=workflows, engine={"runner": "local"},
                          listeners=[{"name": "c", "queue": qname("in"), "workflow": "Counting"}],
                          routers=[])
    assert "no running service reports its versions" in _status(config, capsys)

    proc = start_service(config, log)
    try:
        wait_for_log(log, "service ", timeout=180)
        wait_for_log(log, " up: queues", timeout=180)
        first = re.search(r"workflow Counting version (\w{12}) loaded", log.read_text()).group(1)
        out = _wait_status(config, capsys, first)
        row = _row(out, first)
        assert row is not None and "s ago" in row, out
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row), row

        # a changed file is reloaded by the running service: status shows the new version
        path = workflows / "counting.xml"
        path.write_text(path.read_text().replace("</process>", "<!-- changed --></process>"))
        wait_for_log(log, f"(was {first})", timeout=120)
        second = re.search(r"workflow Counting version (\w{12}) loaded from \S+ \(was " + first,
                           log.read_text()).group(1)
        out = _wait_status(config, capsys, second)
        assert _row(out, second) is not None and first not in out, out
    finally:
        kill_group(proc, signal.SIGTERM)
        proc.wait(timeout=120)
    assert "no running service reports its versions" in _status(config, capsys)
