"""Spark's Python daemon as Chalk runs it (engine._daemon): a worker whose connection the
JVM closed ends without a traceback; anything else is Spark's as before.  The service's
own log is checked in tests/listener_router/test_shutdown.py."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark import daemon

import engine._daemon as quiet


def test_the_daemon_s_workers_go_through_chalk_s_wrapper() -> None:
    assert daemon.worker is quiet.worker


@pytest.mark.parametrize("error", [BrokenPipeError, ConnectionResetError])
def test_a_connection_the_jvm_closed_ends_the_worker_quietly(monkeypatch: Any, capsys: Any,
                                                            error: type[OSError]) -> None:
    def closed(sock: Any, authenticated: bool) -> int:
        raise error(32, "Broken pipe")

    monkeypatch.setattr(quiet, "_worker", closed)
    assert quiet.worker(None, True) == 1
    assert capsys.readouterr().err == ""


def test_other_errors_and_exit_codes_are_spark_s(monkeypatch: Any) -> None:
    monkeypatch.setattr(quiet, "_worker", lambda sock, authenticated: 0)
    assert quiet.worker(None, True) == 0

    def broken(sock: Any, authenticated: bool) -> int:
        raise ValueError("not a pipe")

    monkeypatch.setattr(quiet, "_worker", broken)
    with pytest.raises(ValueError, match="not a pipe"):
        quiet.worker(None, True)
