"""The README's walk-through, done as a reader does it: its files written where it says, its
commands run by bash, in order, with the real ``chalk`` command on the test broker.

Only the queue names change (each test gets its own), and the broker's address comes from
the environment (``CHALK_BROKER_URL``), as the configuration reference allows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
HEADING = "## Your first workflow in 15 minutes"

pytestmark = [pytest.mark.slow]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
_SAVE_AS = re.compile(r"`([\w./-]+)`:\s*$")


def walkthrough() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{HEADING}\n")
    return text[start:text.index("\n## ", start + 1)]


def steps() -> list[tuple[str, str]]:
    """The section's fenced blocks in order: ("file", path) with its text, or ("bash", lines).

    A block that is a file follows a line ending in "`path`:" (``Save it as `greet.py`:``);
    every ``bash`` block is commands."""
    section = walkthrough()
    found: list[tuple[str, str]] = []
    for match in _FENCE.finditer(section):
        language, body = match.groups()
        before = section[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        saved = _SAVE_AS.search(before)
        if saved:
            found.append((saved.group(1), body))
        else:
            assert language == "bash", f"a {language} block that is no file: {body[:60]!r}"
            found.append(("bash", body))
    return found


def block(name: str) -> str:
    """The text of the file the walk-through saves as ``name``."""
    (text,) = [body for kind, body in steps() if kind == name]
    return text


def test_the_walkthrough_is_a_pipelet_a_workflow_a_rule_push_run_and_look() -> None:
    files = [kind for kind, _ in steps() if kind != "bash"]
    assert files == ["greet.py", "workflows/welcome.xml", "records.jsonl", "chalk.toml"]
    commands = [line.split("#")[0].split()[:2] for kind, body in steps() if kind == "bash"
                for line in body.splitlines() if line.strip()]
    assert [c for c in commands if c[0] == "chalk"] == [
        ["chalk", "validate"], ["chalk", "process"], ["chalk", "push"], ["chalk", "run"],
        ["chalk", "jobs"], ["chalk", "status"]]


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _stored(db: Path, ids: list[str]) -> dict[str, dict[str, Any]]:
    from blackboard import Blackboard

    with Blackboard.connect(f"sqlite:///{db}") as bb:
        bb.load_many(ids)
        return {rid: bb.get_attributes(rid) for rid in ids}


def test_the_readme_walkthrough_runs_with_the_real_chalk_command(
        tmp_path: Path, amqp_queues: Any) -> None:
    queue_in, queue_out = amqp_queues("hello.in"), amqp_queues("hello.out")

    def ours(text: str) -> str:
        return text.replace("hello.in", queue_in).replace("hello.out", queue_out)

    # The reader's checkout: a .venv with chalk in it (this interpreter's).
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    assert (tmp_path / ".venv" / "bin" / "chalk").exists(), "chalk is not installed in the venv"
    env = dict(os.environ, CHALK_BROKER_URL=amqp_queues.url, PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               COLUMNS="200")
    for name in ("VIRTUAL_ENV", "CHALK_CONFIG"):
        env.pop(name, None)
    activate = ". ../.venv/bin/activate\n"

    (first_kind, setup), *rest = steps()
    assert first_kind == "bash" and "mkdir hello && cd hello" in setup
    done = _bash(setup + "\npwd\ncommand -v chalk\n", tmp_path, env)
    assert done.returncode == 0, done.stderr
    hello = tmp_path / "hello"
    where, chalk = done.stdout.splitlines()
    assert (where, Path(chalk).resolve()) == (str(hello), (Path(sys.prefix) / "bin" / "chalk").resolve())
    assert [p.name for p in hello.iterdir()] == ["workflows"]     # what the text made

    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    for kind, body in rest:
        if kind == "bash":
            done = _bash(activate + ours(body), hello, env)
            assert done.returncode == 0, f"{body}\n{done.stdout}\n{done.stderr}"
            outputs[body.split()[1]] = done          # by its first command's verb
        else:   # as a reader saves it: into folders the text made, none made here
            path = hello / kind
            assert path.parent.is_dir(), f"the text saves {kind} before it makes {path.parent.name}/"
            path.write_text(ours(body), encoding="utf-8")

    # 2. the workflow: valid, and the try without a broker greets as the README says
    assert "valid: 1 workflow(s)" in outputs["validate"].stdout
    assert "Welcome" in outputs["validate"].stdout
    tried = [json.loads(line) for line in (hello / "tried.jsonl").read_text().splitlines()]
    greetings = {r["id"]: r["attributes"]["greeting"] for r in tried}
    assert greetings == {"ada": "Hello, Ada", "bob": "Hello, Bob Smith", "clara": "Hallo, Clara"}
    for said in greetings.values():
        assert f"`{said}`" in walkthrough()
    assert outputs["validate"].stdout.count('"greeting"') == 3   # `cat tried.jsonl`

    # 4. push, 5. run: the lines the README quotes
    assert f"pushed 3 record(s) in 3 message(s) to {queue_in}" in outputs["push"].stdout
    assert "pushed 3 record(s) in 3 message(s) to hello.in" in \
        " ".join(walkthrough().split())
    assert "received=3, committed=3," in outputs["run"].stdout, outputs["run"].stderr

    # the records are committed with their greetings, and hello.out holds the results
    stored = _stored(hello / "chalk.db", ["ada", "bob", "clara"])
    assert {rid: a["greeting"] for rid, a in stored.items()} == greetings
    channel = amqp_queues.connection().channel()
    results = []
    while True:
        method, _props, body = channel.basic_get(queue_out, auto_ack=True)
        if method is None:
            break
        results += json.loads(body)["records"]
    assert sorted((r["id"], r["attributes"]) for r in results) == sorted(
        (rid, {"name": stored[rid]["name"], "greeting": greetings[rid]}) for rid in greetings)

    # 6. look: `chalk jobs --record clara` then `chalk status`, one block
    look = outputs["jobs"].stdout
    steps_of_clara = [line for line in look.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]
    committed = [line for line in steps_of_clara if " committed " in line]
    assert len(committed) == 1 and " clara " in committed[0] and queue_in in committed[0]
    assert look.startswith("job log: ")    # a title, a header, a line a step
    # in a pipe the queues table is plain columns: name, messages, rate
    assert re.search(r"^" + re.escape(queue_out) + r"\s+3(\s|$)", look, re.M), look
    assert "3 record(s), 3 processed message(s)" in look
