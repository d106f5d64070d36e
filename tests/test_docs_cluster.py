"""docs/cluster.md, "Deploying on N machines": the member's chalk.toml is read as the page
says, with the settings the lab's fault tests run their members with (tests/lab/_lab.py),
and every ``scripts/lab.sh`` command the page shows is one the script has."""

from __future__ import annotations

import importlib.util
import re
import sys
import urllib.parse
from pathlib import Path

from test_docs import DOCS, REPO, block_with, code_blocks

from listener_router import load_settings
from listener_router.broker import broker_urls, node_parameters

PAGE = DOCS / "cluster.md"


def _lab_module():
    spec = importlib.util.spec_from_file_location("lab_settings", REPO / "tests" / "lab" / "_lab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_members_configuration_is_the_one_the_lab_runs_its_members_with(tmp_path: Path):
    lab = _lab_module()
    config = tmp_path / "chalk.toml"
    config.write_text(block_with(PAGE, "toml", 'name = "c1"'))
    settings = load_settings(config, env={})
    nodes = node_parameters(settings.broker_url)
    assert [(p.host, p.port, p.heartbeat) for p in nodes] == [
        (host, 5672, lab.AMQP_HEARTBEAT) for host in lab.MQ]
    assert len(broker_urls(settings.broker_url)) == 3
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(settings.blackboard_url).query))
    assert query == lab.DB_QUERY
    assert (settings.node, settings.heartbeat_seconds, settings.ttl_seconds) == (
        "c1", lab.HEARTBEAT, lab.TTL)
    assert settings.spark_master == "spark://spark:7077"
    assert settings.spark_conf["spark.driver.host"] == "c1"
    # the ports tests/lab/test_warm.py fixes, the warm workers' among them
    assert {k: settings.spark_conf.get(k) for k in lab.DRIVER_PORTS} == lab.DRIVER_PORTS


def test_every_lab_command_on_the_page_is_one_the_script_has():
    usage = (REPO / "scripts" / "lab.sh").read_text(encoding="utf-8").split("set -euo", 1)[0]
    known = set(re.findall(r"scripts/lab\.sh (\w+)", usage))
    shown = [line for block in code_blocks(PAGE, "bash") for line in block.splitlines()
             if "scripts/lab.sh" in line]
    assert shown, "the page shows no lab command"
    for line in shown:
        command = re.search(r"scripts/lab\.sh (\w+)", line)
        assert command is not None and command.group(1) in known, line
