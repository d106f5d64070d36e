"""Plug-ins: the built-in features are found through their entry points, start in order and
stop in reverse, and a plug-in of one's own (docs/plugins.md, run as written) plugs in
through a distribution's entry point without a line of Chalk changed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from listener_router import ConfigError, Plugin, Service, Settings, load_settings, push_records
from listener_router._entry_points import plugin_classes
from listener_router._plugin import hooked, ordered

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "plugins.md"


def _blocks(language: str) -> list[str]:
    text = GUIDE.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def test_the_built_in_features_are_plug_ins_found_by_their_entry_points():
    names = [cls.name for cls in plugin_classes()]
    assert names == ["dead_letters", "delta", "events", "jobs", "journal", "schedules", "watch"]
    settings = Settings()
    built = [p.name for cls in plugin_classes() if (p := cls.build(settings)) is not None]
    assert built == ["dead_letters", "jobs"]       # the defaults turn the rest off
    on = Settings(events_committed=True, http_listen="127.0.0.1:0", journals=(),
                  job_log=False)
    assert [p.name for cls in plugin_classes() if (p := cls.build(on)) is not None] == [
        "dead_letters", "events", "watch"]


class _Named(Plugin):
    def __init__(self, name: str, requires: tuple[str, ...] = (), after: tuple[str, ...] = ()):
        self.name, self.requires, self.after = name, requires, after  # type: ignore[misc]


def test_plug_ins_start_after_what_they_require_and_a_missing_one_is_an_error():
    order = ordered([_Named("watch", requires=("dead",), after=("jobs",)), _Named("jobs"),
                     _Named("dead")])
    assert [p.name for p in order] == ["dead", "jobs", "watch"]
    with pytest.raises(ConfigError) as caught:
        ordered([_Named("watch", requires=("dead",))])
    assert "requires 'dead'" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        ordered([_Named("a", requires=("b",)), _Named("b", requires=("a",))])
    assert "circle" in str(caught.value)


def test_only_the_hooks_a_plug_in_overrides_are_called():
    class Counting(Plugin):
        name = "counting"

        def batch_finished(self, report):  # overridden: hooked
            pass

    class Off(Counting):
        def __init__(self):
            self.batch_finished = None  # turned off for this run

    assert len(hooked([Counting()], "batch_finished")) == 1
    assert hooked([Counting()], "in_commit") == []
    assert hooked([Off()], "batch_finished") == []


class _Stops(Plugin):
    def __init__(self, name: str, stopped: list[str], fail: bool = False):
        self.name, self.stopped, self.fail = name, stopped, fail  # type: ignore[misc]

    def stop(self) -> None:
        self.stopped.append(self.name)
        if self.fail:
            raise RuntimeError("stop failed")


@pytest.mark.broker
def test_the_service_stops_plug_ins_in_reverse_and_a_failing_stop_stops_nothing_else(
        make_settings, spark):
    stopped: list[str] = []
    plugins = [_Stops("first", stopped), _Stops("second", stopped, fail=True),
               _Stops("third", stopped)]
    with Service(make_settings(), spark=spark, plugins=plugins) as service:
        assert [p.name for p in service.plugins][:3] == ["first", "second", "third"]
        assert service.plugin("jobs") is not None and service.plugin("events") is None
    assert stopped == ["third", "second", "first"]


def _install(project: Path, site: Path) -> None:
    """``pip install`` the project into ``site`` (no network: its build needs setuptools
    alone, which Chalk's environment has)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", "--target", str(site),
                           str(project)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Put a folder of installed distributions on ``sys.path`` and ``PYTHONPATH`` (the
    service's broker process and the ``chalk`` command find them too), for the test."""
    added: list[str] = []

    def add(site: Path) -> None:
        sys.path.insert(0, str(site))
        added.append(str(site))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
        plugin_classes.cache_clear()

    try:
        yield add
    finally:
        for site in added:
            sys.path.remove(site)
        for name in ("audit", "broken_plugin"):
            sys.modules.pop(name, None)
        plugin_classes.cache_clear()


@pytest.fixture
def audit_distribution(tmp_path: Path, on_path: Any) -> Path:
    """The guide's plug-in as the guide lays it out (its ``audit.py`` and its whole
    ``pyproject.toml`` in a folder), installed with pip."""
    (python,) = [b for b in _blocks("python") if "class Audit(Plugin)" in b]
    (project,) = [b for b in _blocks("toml") if "[build-system]" in b]
    folder = tmp_path / "audit-plugin"
    folder.mkdir()
    (folder / "audit.py").write_text(python)
    (folder / "pyproject.toml").write_text(project)
    site = tmp_path / "site"
    _install(folder, site)
    assert any(p.name.startswith("chalk_audit-0.1.0") and p.name.endswith(".dist-info")
               for p in site.iterdir())
    on_path(site)
    return site


@pytest.mark.broker
@pytest.mark.slow
def test_the_guides_plug_in_counts_commits_through_its_own_section_and_table(
        audit_distribution, tmp_path, make_settings, declare, spark):
    (config,) = [b for b in _blocks("toml") if "[audit]" in b]
    path = tmp_path / "chalk.toml"
    path.write_text(config)
    assert load_settings(path, env={}).section("audit").enabled is True
    assert "[audit]" in __import__("listener_router").configuration_reference()
    base = make_settings()
    settings = base.with_section("audit", load_settings(path, env={}).section("audit"))
    declare(settings)
    ids = [f"a{uuid.uuid4().hex[:6]}-{i}" for i in range(7)]
    push_records(settings, settings.listeners[0].queue,
                 [{"id": rid, "attributes": {"text": "hello plug-in"}} for rid in ids])
    with Service(settings, spark=spark) as service:
        assert service.plugin("audit") is not None
        service.run(until=lambda s: s["committed"] >= len(ids), idle_exit=60)
    import audit  # the guide's module, as the service loaded it
    assert audit.counts(create_engine(settings.blackboard_url)) == {"Demo": len(ids)}
    # the guide's way to the engine outside the service, run as written
    (outside,) = [b for b in _blocks("python") if "audit.counts(engine)" in b]
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "chalk.toml").write_text(
        f'[blackboard]\nurl = "{settings.blackboard_url}"\n')
    done = subprocess.run([sys.executable, "-c", outside], cwd=tmp_path / "report",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr({"Demo": len(ids)})


BROKEN = """from listener_router import Plugin
raise ImportError("a dependency of this plug-in is missing")
"""


def test_a_broken_plug_in_is_reported_and_every_command_still_works(tmp_path, on_path):
    folder = tmp_path / "broken-plugin"
    folder.mkdir()
    (folder / "broken_plugin.py").write_text(BROKEN)
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "broken-plugin"\nversion = "1.0"\n'
        '[tool.setuptools]\npy-modules = ["broken_plugin"]\n'
        '[project.entry-points."chalk.plugins"]\nbroken = "broken_plugin:Broken"\n')
    site = tmp_path / "site"
    _install(folder, site)
    on_path(site)
    chalk = Path(sys.executable).parent / "chalk"

    def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(chalk), *argv], cwd=cwd, capture_output=True, text=True,
                              timeout=120)

    project = tmp_path / "project"
    project.mkdir()
    (project / "chalk.toml").write_text(f'[blackboard]\nurl = "sqlite:///{project}/c.db"\n')
    for argv in (["validate", str(REPO / "workflows")], ["jobs"], ["queue", "list"]):
        done = run(*argv, cwd=project)
        assert done.returncode == 0, (argv, done.stderr)
        assert ("plug-in 'broken' (broken_plugin:Broken) cannot be loaded: ImportError: a "
                "dependency of this plug-in is missing; it is left out") in done.stderr, argv
    # a project that turns it on is told why its section is unknown
    (project / "chalk.toml").write_text("[broken]\nenabled = true\n")
    done = run("jobs", cwd=project)
    assert done.returncode == 2
    assert "unknown section" in done.stderr or "[broken]" in done.stderr
    assert "plug-in 'broken' (broken_plugin:Broken) cannot be loaded" in done.stderr
    assert "it may be the one that reads [broken]" in done.stderr
