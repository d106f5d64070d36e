"""What the ``chalk`` command tells a newcomer: help, examples, version, clear refusals."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pika
import pytest

from listener_router.broker import AmqpLink, broker_reason, connect, connection_parameters
from listener_router.cli import build_parser, main
from listener_router.cli._help import HELP, examples

REPO = Path(__file__).resolve().parents[2]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_subcommand_has_a_description_and_examples_that_parse():
    commands = _subcommands()
    assert set(commands) <= set(HELP), f"no help text for {sorted(set(commands) - set(HELP))}"
    for name, sub in commands.items():
        assert sub.description and len(sub.description) > 40, name
        assert sub.epilog and sub.epilog.startswith("examples:"), name
        assert f"chalk {name}" in sub.format_help(), name
        assert examples(name), name
        for argv in examples(name):
            assert argv[0] == name, argv
            args = build_parser().parse_args(argv)   # SystemExit (2) when one is wrong
            assert args.command == name


def test_every_option_says_what_it_does():
    for name, sub in _subcommands().items():
        for action in sub._actions:
            if action.option_strings:
                assert action.help, f"chalk {name} {action.option_strings[0]} has no help"
    assert "most recent" in _subcommands()["jobs"].format_help()


def test_version_is_the_package_version():
    out = subprocess.run([sys.executable, "-m", "listener_router.cli._main", "--version"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0
    assert out.stdout.strip() == f"chalk {version('chalk')}"


def test_push_refuses_an_operation_the_service_would_dead_letter(capsys):
    with pytest.raises(SystemExit) as info:
        main(["push", "--id", "a", "--operation", "REPLACE"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "REPLACE" in err and "ADD" in err and "DELETE" in err
    args = build_parser().parse_args(["push", "--id", "a", "--operation", "delete"])
    assert args.operation == "DELETE"
    from listener_router import load_settings
    from listener_router._errors import ConfigError
    from listener_router._records import push_records
    with pytest.raises(ConfigError, match="unknown operation 'REPLACE'; the service accepts ADD"):
        push_records(load_settings(None), "q", [{"id": "a", "attributes": {}}], store=False,
                     operation="REPLACE")   # refused before the broker is asked


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_broker_connection_names_host_port_and_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    port = _closed_port()
    config = tmp_path / "chalk.toml"
    config.write_text(f'[blackboard]\nurl = "sqlite:///{tmp_path / "bb.db"}"\n'
                      f'[broker]\nurl = "amqp://guest:guest@127.0.0.1:{port}/%2F"\n'
                      '[[listener]]\nname = "t"\nqueue = "t.in"\n')
    assert main(["dlq", "list", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "connection refused" in err, err
    link = AmqpLink(f"amqp://guest:guest@127.0.0.1:{port}/%2F", consume=())
    with pytest.raises(ConnectionError) as caught:
        link.start(wait=5)
    link.stop()
    assert "connection refused" in str(caught.value) and not str(caught.value).endswith(": ")


@pytest.mark.broker
def test_a_wrong_password_says_login_refused(broker_url):
    params = pika.URLParameters(broker_url)
    bad = f"amqp://{params.credentials.username}:wrong-{id(params)}@{params.host}:{params.port}/%2F"
    with pytest.raises(ConnectionError) as caught:
        connect(bad)
    assert f"{params.host}:{params.port}" in str(caught.value)
    assert f"login refused for user {params.credentials.username!r}" in str(caught.value)


def test_a_silent_server_times_out_and_says_so():
    with socket.socket() as server:   # accepts the TCP connection, never speaks AMQP
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        url = f"amqp://guest:guest@127.0.0.1:{server.getsockname()[1]}/%2F"
        params = connection_parameters(url)
        params.stack_timeout = 2
        with pytest.raises(ConnectionError) as caught:
            connect(url, params)
    assert "timed out" in str(caught.value)
    assert broker_reason(pika.exceptions.AMQPConnectionError()) == \
        "AMQPConnectionError (pika gave no reason)"


def _command_lines(page: Path) -> list[str]:
    """The ``chalk`` command lines in the page's bash blocks, comments cut off."""
    found, inside = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line == "```bash"
        elif inside and line.startswith((".venv/bin/chalk ", "chalk ")):
            found.append(line.split("#")[0])
    return found


@pytest.mark.parametrize("page", ["README.md", "docs/guide.md", "docs/journal.md",
                                  "docs/operations.md"])
def test_the_documented_commands_parse(page):
    lines = [line.split()[1:] for line in _command_lines(REPO / page)
             if not set("|[") & set(line)]   # no alternatives or optional parts
    assert len(lines) >= 5
    for argv in lines:
        assert build_parser().parse_args(argv).command == argv[0]


def test_every_page_with_chalk_commands_is_one_whose_commands_are_parsed():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    with_commands = {str(p.relative_to(REPO)) for p in pages if _command_lines(p)}
    assert with_commands == {"README.md", "docs/guide.md", "docs/journal.md",
                             "docs/operations.md"}
