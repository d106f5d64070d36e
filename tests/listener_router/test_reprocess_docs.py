"""Every ``chalk reprocess`` example of docs/operations.md runs, in the README's project
(workflow ``Welcome``), and a service then runs each selected record once per run."""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import stored_attributes, write_test_workflows
from reprocess_helpers import store_docs, write_reprocess_config

from listener_router import load_settings
from listener_router.cli import main
from listener_router.reprocess import Reprocess, Runs, RunSelection, begin
from listener_router.store import ServiceStore

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operations.md"

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def examples() -> list[list[str]]:
    """The ``chalk reprocess`` lines of the page's section on reprocessing, as arguments."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Reprocessing stored records", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    return [shlex.split(line, comments=True)[1:] for line in block.splitlines()
            if line.startswith("chalk reprocess")]


def _stopped_run(settings: Any, store: ServiceStore) -> str:
    """A run of ``doc-0*`` stopped by Ctrl-C after its first page (the one to resume)."""
    begun = begin(settings, store, workflow="Welcome", selection=RunSelection(prefix="doc-0"))

    def ctrl_c(_run: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Reprocess(settings, store, begun.run, progress=ctrl_c, page=4).run()
    return begun.run.id


def test_every_reprocess_example_on_the_operations_page_runs(
        tmp_path, sqlite_url, broker_url, qname, run_service, monkeypatch, capsys):
    found = examples()
    assert len(found) == 7 and {a[0] for a in found} == {"reprocess"}
    workflows = write_test_workflows(tmp_path / "workflows")
    (workflows / "welcome.xml").write_text(
        (workflows / "counting.xml").read_text().replace('name="Counting"', 'name="Welcome"'))
    queue = qname("in")
    write_reprocess_config(tmp_path / "chalk.toml", db=sqlite_url, broker=broker_url,
                           queue=queue, workflow="Welcome", workflows=str(workflows))
    docs = store_docs(sqlite_url, 40, langs=("de", "en"), source="crawler", every=4,
                      digits=2)
    (tmp_path / "failed.txt").write_text("img-03\ndoc-11\n")
    monkeypatch.chdir(tmp_path)   # chalk.toml in the working directory, as in the README
    settings = load_settings("chalk.toml")
    chosen = {
        "--prefix": {r for r in docs if r.startswith("doc-")},
        "--source": {r for r, d in docs.items() if d["source"] == "crawler"},
        "--xpath": {r for r, d in docs.items() if d["lang"] == "de"},
        "--ids-from": {"img-03", "doc-11"},
        "--resume": {r for r in docs if r.startswith("doc-0")},
    }
    expected: Counter[str] = Counter()
    store = ServiceStore.connect(sqlite_url)
    for argv in found:
        argv = [queue if a == "hello.in" else a for a in argv]
        if "--resume" in argv:
            argv[argv.index("--resume") + 1] = _stopped_run(settings, store)
        assert main(argv) == 0, argv
        option = next((a for a in argv if a in chosen), None)
        if option is not None:
            expected.update(chosen[option])
        elif "--list" not in argv:
            expected.update(list(docs))              # every stored record
    capsys.readouterr()
    runs = store.tables(Runs).recent(20)
    assert len(runs) == 6 and {r.state for r in runs} == {"finished"}
    published = sum(r.published for r in runs)
    assert published == sum(expected.values())
    stats = run_service(settings, until=lambda s: s["committed"] >= published, idle_exit=60)
    assert stats["committed"] == published
    counts = stored_attributes(sqlite_url, sorted(docs), ["count"])
    assert {r: a["count"] for r, a in counts.items()} == dict(expected)
    assert main(["reprocess", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert all(v["committed"] == v["published"] for v in listed)
    store.close()
