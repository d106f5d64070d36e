"""Every example of docs/operations.md's section on delta processing runs: its listener rule
is the configuration, its commands two full crawls of the README's project (workflow
``Welcome``), and the service then runs changed records, skips unchanged ones and deletes
the unseen ones, each once."""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import stored_attributes, write_test_workflows

from listener_router import load_settings
from listener_router.cli import main

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operations.md"

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text.split("## Delta processing", 1)[1].split("\n## ", 1)[0]


def block(lang: str) -> str:
    (found,) = re.findall(rf"^```{lang}\n(.*?)^```", section(), re.S | re.M)
    return str(found)


def commands() -> list[list[str]]:
    """The section's ``chalk`` lines, as arguments."""
    return [shlex.split(line, comments=True)[1:] for line in block("bash").splitlines()
            if line.startswith("chalk ")]


def _write(path: Path, records: dict[str, dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps({"id": rid, "attributes": attrs}) + "\n"
                            for rid, attrs in records.items()))


def _routed(broker: Any, queue: str) -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    for props, body in broker.drain(queue):
        for record in json.loads(body)["records"]:
            found[(record["id"], props.headers["operation"])] += 1
    return found


def test_every_delta_example_on_the_operations_page_runs(
        tmp_path, sqlite_url, broker_url, qname, run_service, broker, monkeypatch, capsys):
    found = commands()
    assert [a[:2] for a in found] == [["delta", "start"], ["push", "crawl.jsonl"],
                                      ["delta", "finish"], ["delta", "status"],
                                      ["delta", "status"]]
    workflows = write_test_workflows(tmp_path / "workflows")
    (workflows / "welcome.xml").write_text(
        (workflows / "counting.xml").read_text().replace('name="Counting"', 'name="Welcome"'))
    queue, out = qname("in"), qname("out")
    rules = block("toml").replace('"web.in"', f'"{queue}"').replace('"web.out"', f'"{out}"')
    (tmp_path / "chalk.toml").write_text(
        f'[blackboard]\nurl = "{sqlite_url}"\n[broker]\nurl = "{broker_url}"\n'
        f'[workflows]\ndir = "{workflows}"\n\n{rules}')
    monkeypatch.chdir(tmp_path)   # chalk.toml in the working directory, as in the README
    settings = load_settings("chalk.toml")
    (rule,) = settings.listeners
    assert (rule.delta, rule.delta_attributes, rule.delta_unchanged) == (
        "hash", ("title", "body"), "skip")

    def crawl(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        _write(tmp_path / "crawl.jsonl", records)
        for argv in found:
            argv = [queue if a == "web.in" else a for a in argv]
            assert main(argv) == 0, argv
        lines = capsys.readouterr().out.splitlines()   # delta status --json: one array
        return [row for line in lines if line.startswith("[") for row in json.loads(line)]

    pages = {f"p{i}": {"title": f"T{i}", "body": f"B{i}", "lang": "en"} for i in range(6)}
    (first,) = crawl(pages)
    assert (first["state"], first["deletions"], first["seen"]) == ("finished", 0, 6)
    stats = run_service(settings, until=lambda s: s["committed"] >= 6)
    assert (stats["committed"], stats["unchanged"]) == (6, 0)
    assert sum(_routed(broker, out).values()) == 6

    # the second crawl: p0 as it was, p1 with another lang (not content), p2 and p3 changed,
    # p4 and p5 gone
    again = {"p0": pages["p0"], "p1": {**pages["p1"], "lang": "de"},
             "p2": {**pages["p2"], "body": "new"}, "p3": {**pages["p3"], "title": "new"}}
    second, older = crawl(again)
    assert (second["state"], second["deletions"], second["seen"]) == ("finished", 2, 4)
    assert older["crawl"] == first["crawl"]
    stats = run_service(settings, until=lambda s: s["committed"] + s["unchanged"] >= 6)
    assert (stats["committed"], stats["unchanged"]) == (4, 2)   # p2, p3 and two DELETEs
    counts = stored_attributes(sqlite_url, sorted(pages), ["count"])
    assert {r: (a or {}).get("count") for r, a in counts.items()} == {
        "p0": 1, "p1": 1, "p2": 2, "p3": 2, "p4": None, "p5": None}
    assert _routed(broker, out) == Counter({("p2", "ADD"): 1, ("p3", "ADD"): 1,
                                            ("p4", "DELETE"): 1, ("p5", "DELETE"): 1})
    assert main(["delta", "status", "web", "--json"]) == 0
    (now, _first) = json.loads(capsys.readouterr().out)
    assert {k: now[k] for k in ("state", "deletions", "deleted", "kept", "pending")} == {
        "state": "finished", "deletions": 2, "deleted": 2, "kept": 0, "pending": 0}
