"""A Spark standalone master and worker (pyspark's own launcher) commit the
records ``local[2]`` commits, and fail the same instances.

The same driver script (``_cluster_driver.py``, what ``chalk process`` does:
load, run, invalidate the failed, commit the rest) runs once on ``local[2]``
and once on the standalone master, each in a process of its own (one
SparkContext per process), over the same records: an interpreter workflow
with an ``<if>``, a split, pipelets that fail some instances by name and
anonymously, an XSLT stylesheet named by a relative path and pipelets from a
module next to the workflow; and a workflow that runs as DataFrame
transformations.

The cluster's executors run the "worker host's" interpreter
(``spark.pyspark.python``: a wrapper around this one) and cannot import from
the driver's directories (the workflow directory, the driver's working
directory), as on a host of their own: the workflow's pipelet module reaches
them only because the runner ships it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from _spark_cluster import SparkCluster
from engine_helpers import BPEL_HEADER

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_cluster_driver.py"
MODULE = "standalone_pipelets"  # tests/engine/_pipelets.py, copied next to the workflows


def _invoke(name: str, cls: str, **params: str) -> str:
    conf = "".join(f'<proc:param name="{k}">{v}</proc:param>' for k, v in params.items())
    return (f'<extensionActivity><proc:invokePipelet name="{name}"><proc:pipelet class="{cls}"/>'
            f"<proc:configuration>{conf}</proc:configuration></proc:invokePipelet></extensionActivity>")


MIXED = (
    "<sequence>"
    + _invoke("norm", "pipelets.text.NormalizeWhitespace", attribute="text")
    + _invoke("upper", f"{MODULE}.Upper", attribute="text")
    + "<if name='bySize'><condition>$record/Val[@key='size'] = 'big'</condition>"
    + _invoke("split", f"{MODULE}.SplitInTwo")
    + "<else>" + _invoke("small", f"{MODULE}.Mark", value="small") + "</else></if>"
    + "<if name='howToFail'><condition>$record/Val[@key='kind'] = 'anonymous'</condition>"
    + _invoke("failAnonymously", f"{MODULE}.FailWhen", named="false")
    + "<else>" + _invoke("failByName", f"{MODULE}.FailWhen") + "</else></if>"
    + _invoke("count", f"{MODULE}.Increment")
    + _invoke("bees", "pipelets.xml.XsltTransform", xslFile="stylesheets/bees.xsl", input="Content",
              inputType="attachment", output="bees")
    + _invoke("drop", f"{MODULE}.DropMarked")
    + "</sequence>"
)

FRAMES = (
    "<sequence>"
    + _invoke("norm", "pipelets.text.NormalizeWhitespace", attribute="text", lowercase="true")
    + _invoke("count", "pipelets.text.WordCount", attribute="text", output="words")
    + _invoke("long", "pipelets.text.RegexExtract", attribute="text", pattern=r"\b(\w{6,})\b", output="long")
    + "<if><condition>$record/Val[@key='lang'] = 'de'</condition>"
    + _invoke("de", "pipelets.text.Replace", attribute="text", pattern=r"\bund\b", replacement="and")
    + "<elseif><condition>$record/Val[@key='lang']</condition>"
    + _invoke("tag", "pipelets.values.SetValue", attribute="label", value="known")
    + "</elseif><else>"
    + _invoke("none", "pipelets.values.SetValue", attribute="label", value="unknown")
    + "</else></if>"
    + _invoke("title", "pipelets.text.Lowercase", attribute="title", output="lower_title")
    + "</sequence>"
)

STYLESHEET = """<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:output method="text"/>
  <xsl:template match="/">bees=<xsl:value-of select="count(//b)"/></xsl:template>
</xsl:stylesheet>
"""

WORDS = ["und", "Der", "alpha", "Beta", "information", "e-mail", "don't", "2024", "Straße",
         "naïve", "tab\there", "line\nbreak", "quote\"s", "back\\slash", "  ", ""]


def _mixed_records(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` records in instances of one to three; some fail, by name, anonymously or in XSLT."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    instance = 0
    while len(out) < n:
        for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 3)):
            i = len(out)
            attrs: dict[str, Any] = {"text": "  ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))}
            if rng.random() < 0.25:
                attrs["size"] = "big"
            if rng.random() < 0.05:
                attrs["fail"] = True
                if rng.random() < 0.5:
                    attrs["kind"] = "anonymous"
            if rng.random() < 0.05:
                attrs["drop"] = True
            if rng.random() < 0.2:
                attrs["counter"] = rng.randint(0, 5)
            record: dict[str, Any] = {"id": f"m{i:04d}", "instance": instance, "attributes": attrs}
            if rng.random() < 0.3:
                xml = "<a>" + "<b/>" * rng.randint(0, 4) + "</a>"
                record["attachments"] = {"Content": xml if rng.random() > 0.05 else "<a><b>"}
            out.append(record)
        instance += 1
    return out


def _frame_records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        attrs: dict[str, Any] = {}
        if rng.random() < 0.9:
            attrs["text"] = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.8:
            attrs["title"] = rng.choice(WORDS).title() + " " + rng.choice(WORDS)
        lang = rng.random()
        if lang < 0.4:
            attrs["lang"] = "de"
        elif lang < 0.7:
            attrs["lang"] = "en"
        if rng.random() < 0.05:
            attrs["text"] = ["two", "values"]  # not one string: the interpreter takes the record
        if rng.random() < 0.05:
            attrs["words"] = 7  # a number where the frame writes a string: the interpreter again
        out.append({"id": f"f{i:04d}", "instance": i, "attributes": attrs})
    return out


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


SITECUSTOMIZE = '''"""Python workers of the "worker host": the directories in CHALK_TEST_HIDDEN do not
exist for imports here, as on a host that has the project installed but not the
driver's files."""
import os
import sys

_HIDDEN = tuple(os.path.realpath(d) for d in os.environ.get("CHALK_TEST_HIDDEN", "").split(os.pathsep) if d)


class _NothingHere:
    def __init__(self, path):
        self.path = path

    def find_spec(self, fullname, target=None):
        return None

    def invalidate_caches(self):
        pass


def _hide(path):
    real = os.path.realpath(path or ".")
    if any(real == h or real.startswith(h + os.sep) for h in _HIDDEN):
        return _NothingHere(path)
    raise ImportError(path)  # not hidden: the next hook takes it


if _HIDDEN:
    sys.path_hooks.insert(0, _hide)
    sys.path_importer_cache.clear()
'''


def _worker_host_python(base: Path, hidden: list[Path]) -> Path:
    """A wrapper around this interpreter that hides ``hidden`` from imports (see SITECUSTOMIZE)."""
    site = base / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    wrapper = base / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        export CHALK_TEST_WORKER_PYTHON=1
        export CHALK_TEST_HIDDEN='{os.pathsep.join(map(str, hidden))}'
        export PYTHONPATH='{site}'"${{PYTHONPATH:+:$PYTHONPATH}}"
        exec '{sys.executable}' "$@"
        """))
    wrapper.chmod(0o755)
    return wrapper


def _stored(db: Path) -> tuple[dict[str, Any], dict[tuple[str, str], str]]:
    """Committed documents (with their versions) and attachment digests of a SQLite blackboard."""
    with sqlite3.connect(db) as conn:
        docs = {rid: (json.loads(doc), version)
                for rid, doc, version in conn.execute("SELECT id, doc, version FROM chalk_records")}
        chunks: dict[tuple[str, str], Any] = {}
        for rid, name, data in conn.execute(
                "SELECT record_id, name, data FROM chalk_attachments ORDER BY record_id, name, chunk"):
            chunks.setdefault((rid, name), hashlib.sha256()).update(data)
    return docs, {key: h.hexdigest() for key, h in chunks.items()}


class Run:
    """One driver process's outcome: its summary and what it committed."""

    def __init__(self, summary: dict[str, Any], db: Path, seconds: float) -> None:
        self.summary = summary
        self.docs, self.attachments = _stored(db)
        self.seconds = seconds

    def results(self, workflow: str) -> list[list[Any]]:
        return self.summary["runs"][workflow]["results"]

    def failed(self, workflow: str) -> dict[int, str]:
        return {index: error for index, ok, error, _, _ in self.results(workflow) if not ok}


def _drive(work: Path, name: str, master: str, conf: dict[str, str], env: dict[str, str],
           probe: bool) -> subprocess.Popen[str]:
    plan = {
        "master": master,
        "conf": conf,
        "blackboard": f"sqlite:///{work / f'{name}.db'}",
        "workflows": "workflows",
        "runs": [
            {"workflow": "ClusterMixed", "input": "mixed.jsonl", "batch_size": 100, "stream": True},
            {"workflow": "ClusterFrames", "input": "frames.jsonl", "batch_size": 150},
        ],
        "probe_module": MODULE if probe else None,
        "summary": str(work / f"{name}.json"),
    }
    (work / f"{name}-plan.json").write_text(json.dumps(plan))
    log = open(work / f"{name}.log", "w")  # noqa: SIM115  (closed by the caller's wait)
    return subprocess.Popen([sys.executable, str(DRIVER), str(work / f"{name}-plan.json")],
                            cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def _finish(work: Path, name: str, proc: subprocess.Popen[str], timeout: float) -> Run:
    started = time.monotonic()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if proc.poll() is None:  # its Spark JVM ends with it (py4j's gateway watches stdin)
            proc.kill()
            proc.wait()
    seconds = time.monotonic() - started
    if rc != 0:
        tail = "\n".join((work / f"{name}.log").read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"the {name} driver ended with {rc} after {seconds:.0f}s:\n{tail}", pytrace=False)
    return Run(json.loads((work / f"{name}.json").read_text()), work / f"{name}.db", seconds)


@pytest.fixture(scope="module")
def runs(spark_cluster: SparkCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The same plan on local[2] and on the standalone master, each in a driver process."""
    work = tmp_path_factory.mktemp("standalone")
    workflows = work / "workflows"
    workflows.mkdir()
    shutil.copy(HERE / "_pipelets.py", workflows / f"{MODULE}.py")
    (workflows / "ClusterMixed.xml").write_text(BPEL_HEADER.format(name="ClusterMixed") + MIXED + "</process>")
    (workflows / "ClusterFrames.xml").write_text(BPEL_HEADER.format(name="ClusterFrames") + FRAMES + "</process>")
    (work / "stylesheets").mkdir()
    (work / "stylesheets" / "bees.xsl").write_text(STYLESHEET)  # relative to the driver's directory
    _write_jsonl(work / "mixed.jsonl", _mixed_records(400, seed=18))
    _write_jsonl(work / "frames.jsonl", _frame_records(300, seed=11))
    python = _worker_host_python(work / "worker-host", hidden=[workflows, work])

    env = spark_cluster.driver_env()
    # one after the other: on a 2-core machine, two drivers at once only take turns
    out = {"local": _finish(work, "local", _drive(work, "local", "local[2]", {}, env, probe=False), 300)}
    out["cluster"] = _finish(work, "cluster", _drive(work, "cluster", spark_cluster.master_url, {
        "spark.pyspark.python": str(python),
        "spark.executor.memory": "1g",
    }, env, probe=True), 300)
    timing = {name: {"wall": round(run.seconds, 1),
                     "session": round(run.summary["session_seconds"], 1),
                     "warm_up": round(run.summary["warm_up_seconds"], 1),
                     **{wf: round(r["seconds"], 1) for wf, r in run.summary["runs"].items()}}
              for name, run in out.items()}
    print(f"\nstandalone vs local[2] (s): {timing}", file=sys.stderr)
    return out


def test_the_standalone_master_commits_what_local_spark_commits(runs: dict[str, Run]) -> None:
    local, cluster = runs["local"], runs["cluster"]
    assert cluster.summary["master"].startswith("spark://")
    assert len(local.docs) > 600  # inputs, fragments of the split records
    assert sorted(cluster.docs) == sorted(local.docs)
    for rid, (doc, version) in local.docs.items():
        assert cluster.docs[rid] == (doc, version), rid
    assert cluster.attachments == local.attachments


def test_the_standalone_master_fails_the_same_instances_with_the_same_errors(runs: dict[str, Run]) -> None:
    local, cluster = runs["local"], runs["cluster"]
    for workflow in ("ClusterMixed", "ClusterFrames"):
        assert cluster.failed(workflow) == local.failed(workflow), workflow
        # [instance, ok, error, result IDs (for routing), record IDs], instance by instance
        assert cluster.results(workflow) == local.results(workflow), workflow
    errors = list(cluster.failed("ClusterMixed").values())
    # each way to fail happened, and each failed only its own instance
    assert any("PipeletError: record" in e for e in errors)
    assert any("RuntimeError: something failed" in e for e in errors)
    assert any("XsltTransform" in e or "XML" in e for e in errors), errors
    assert 5 < len(errors) < len(cluster.results("ClusterMixed")) // 4
    assert cluster.failed("ClusterFrames") == {}


def test_relative_paths_in_pipelet_configuration_resolve_on_the_executors(runs: dict[str, Run]) -> None:
    # stylesheets/bees.xsl is relative to the driver's working directory; executors start elsewhere
    attrs = [doc["meta"].get("attrs", {}) for doc, _ in runs["cluster"].docs.values()]
    bees = [a["bees"] for a in attrs if "bees" in a]
    assert len(bees) > 50
    assert all(len(b) == 1 and b[0].startswith("bees=") for b in bees), bees


def test_dataframe_workflows_run_as_dataframes_on_the_cluster(runs: dict[str, Run]) -> None:
    local, cluster = runs["local"], runs["cluster"]
    framed = cluster.summary["runs"]["ClusterFrames"]["frame_records"]
    assert framed == local.summary["runs"]["ClusterFrames"]["frame_records"]
    assert 50 < framed < 300  # the rest took the interpreter (values a frame cannot hold)
    assert cluster.summary["runs"]["ClusterMixed"]["frame_records"] == 0


def test_the_workflows_pipelet_module_is_shipped_to_executors_that_cannot_see_its_directory(
    runs: dict[str, Run],
) -> None:
    executors = runs["cluster"].summary["executors"]
    assert executors
    for seen in executors:
        assert seen["wrapped"], seen  # spark.pyspark.python chose the executors' interpreter
        assert seen["hidden"] and not seen["hidden_but_visible"], seen
        assert f"chalk-{MODULE}-" in (seen["module_file"] or ""), seen
        assert ".zip" in seen["module_file"], seen


def test_a_cluster_s_parallelism_is_its_executors_cores(
    runs: dict[str, Run], spark_cluster: SparkCluster
) -> None:
    summary = runs["cluster"].summary
    assert summary["conf_parallelism"] is None  # not the driver host's core count
    assert summary["default_parallelism"] == spark_cluster.status()["cores"] == spark_cluster.cores
