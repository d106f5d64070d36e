"""Workflows run as DataFrame transformations: the same records as the interpreter."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import BPEL_HEADER, pipelet

from blackboard import Blackboard, Literal
from engine import LocalRunner, SparkRunner, load_workflow
from engine._frames import frame_plan

pytestmark = pytest.mark.spark


def _invoke(name: str, cls: str, **params: str) -> str:
    conf = "".join(f'<proc:param name="{k}">{v}</proc:param>' for k, v in params.items())
    return (f'<proc:invokePipelet name="{name}"><proc:pipelet class="pipelets.{cls}"/>'
            f"<proc:configuration>{conf}</proc:configuration></proc:invokePipelet>")


TEXT_FLOW = (
    "<sequence>"
    + _invoke("norm", "text.NormalizeWhitespace", attribute="text", lowercase="true")
    + _invoke("count", "text.WordCount", attribute="text", output="words")
    + _invoke("long", "text.RegexExtract", attribute="text", pattern=r"\b(\w{6,})\b", output="long")
    + "<if><condition>$record/Val[@key='lang'] = 'de'</condition>"
    + _invoke("de", "text.Replace", attribute="text", pattern=r"\bund\b", replacement="and")
    + "<elseif><condition>$record/Val[@key='lang']</condition>"
    + _invoke("tag", "values.SetValue", attribute="label", value="known")
    + "</elseif><else>"
    + _invoke("none", "values.SetValue", attribute="label", value="unknown")
    + "</else></if>"
    + _invoke("title", "text.Lowercase", attribute="title", output="lower_title")
    + _invoke("first", "text.RegexExtract", attribute="title", pattern=r"[A-Z]\w*", output="cap", all="false")
    + "</sequence>"
)


def _workflow(tmp_path: Path, body: str, name: str = "Frames") -> Any:
    path = tmp_path / f"{name}.xml"
    path.write_text(BPEL_HEADER.format(name=name) + body + "</process>")
    return load_workflow(path)


WORDS = ["und", "Der", "alpha", "Beta", "information", "e-mail", "don't", "x_y", "2024", "Straße",
         "naïve", "tab\there", "line\nbreak", "sep\x1cx", "quote\"s", "back\\slash", "$1", "  ", ""]


def _records(n: int, seed: int) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    out: dict[str, dict[str, Any]] = {}
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
            attrs["text"] = ["two", "values"]  # not one string: the interpreter takes it
        if rng.random() < 0.05:
            attrs["words"] = 7  # a number where the frame writes: the interpreter takes it
        if rng.random() < 0.05:
            attrs["label"] = "kept?"
        out[f"r{i:03d}"] = attrs
    return out


def _run(runner: Any, wf: Any, spec: dict[str, dict[str, Any]], typed: bool = True) -> tuple[list[Any], dict]:
    bb = Blackboard.local()
    for rid, attrs in spec.items():
        bb.create(rid)
        bb.set_attributes(rid, attrs)
    if typed:  # a literal with a semantic type must keep it: the interpreter takes that record
        bb.set_literal("r000", "title", Literal("Typed Title", "name"))
    results = runner.run(wf, bb, [[rid] for rid in spec])
    return results, {rid: bb.document(rid)["meta"] for rid in spec}


def test_frame_plan_covers_a_text_workflow_with_if(tmp_path: Path) -> None:
    plan, why = frame_plan(_workflow(tmp_path, TEXT_FLOW))
    assert plan is not None, why
    assert set(plan.columns) == {"text", "words", "long", "lang", "label", "title", "lower_title", "cap"}
    assert dict(plan.types) == {"text": "string", "words": "int", "long": "array<string>", "label": "string",
                                "lower_title": "string", "cap": "array<string>"}


@pytest.mark.parametrize(("body", "reason"), [
    ("<sequence>" + _invoke("lang", "language.LanguageIdentify", attribute="text") + "</sequence>",
     "has no DataFrame form"),
    ("<sequence>" + _invoke("fp", "fingerprint.Fingerprint") + "</sequence>", "has no DataFrame form"),
    ("<sequence>" + _invoke("x", "text.Replace", attribute="text", pattern="(?P&lt;w&gt;a)", replacement="b")
     + "</sequence>", "has no DataFrame form"),
    ("<if><condition>string-length($record/Val[@key='a']) &gt; 2</condition>"
     + _invoke("l", "text.Lowercase", attribute="a") + "</if>", "not a simple comparison"),
    ("<sequence>" + _invoke("c", "text.WordCount", attribute="a", output="n")
     + _invoke("l", "text.Lowercase", attribute="n") + "</sequence>", "reads 'n', a int column"),
    ("<if><condition>$record/Val[@key='k'] = 'v'</condition>"
     + _invoke("c", "text.WordCount", attribute="a", output="n") + "</if>", "different types"),
    ("<while><condition>$record/Val[@key='k'] = 'v'</condition>"
     + _invoke("l", "text.Lowercase", attribute="k") + "</while>", "no DataFrame form"),
])
def test_frame_plan_declines_what_it_cannot_run_exactly(tmp_path: Path, body: str, reason: str) -> None:
    plan, why = frame_plan(_workflow(tmp_path, body))
    assert plan is None
    assert reason in why


def test_spark_frames_leave_the_same_records_as_the_interpreter(tmp_path: Path, spark: Any) -> None:
    wf = _workflow(tmp_path, TEXT_FLOW)
    spec = _records(300, seed=11)
    local_results, local_docs = _run(LocalRunner(), wf, spec)
    runner = SparkRunner(spark, batch_timeout=120)
    spark_results, spark_docs = _run(runner, wf, spec)
    assert spark_docs == local_docs
    assert [(r.index, r.ok, r.result_ids, r.record_ids) for r in spark_results] == [
        (r.index, r.ok, r.result_ids, r.record_ids) for r in local_results]
    # most records went through the frame, the rest (non-ASCII, lists, numbers, typed) did not
    assert 100 < runner.frame_records < 300
    assert spark_docs["r000"]["attrs"]["title"] == [{"lit": "Typed Title", "type": "name"}]


def test_frames_off_runs_everything_in_the_interpreter(tmp_path: Path, spark: Any) -> None:
    wf = _workflow(tmp_path, TEXT_FLOW)
    spec = _records(40, seed=3)
    runner = SparkRunner(spark, batch_timeout=120, frames=False)
    _, docs = _run(runner, wf, spec)
    assert runner.frame_records == 0
    assert docs == _run(LocalRunner(), wf, spec)[1]


def test_a_reloaded_workflow_replaces_its_plan(tmp_path: Path, spark: Any) -> None:
    runner = SparkRunner(spark, batch_timeout=120)
    first = _workflow(tmp_path, "<sequence>" + _invoke("a", "text.Lowercase", attribute="t") + "</sequence>")
    other = _workflow(tmp_path, "<sequence>" + _invoke("a", "text.Lowercase", attribute="u") + "</sequence>",
                      name="Other")
    plans = [runner._plan(first), runner._plan(other)]
    second = _workflow(tmp_path, "<sequence>" + _invoke("b", "text.Lowercase", attribute="v") + "</sequence>")
    assert second.version != first.version
    assert runner._plan(second).columns == ("v",)
    assert runner._plan(second) is runner._plan(second)
    assert sorted(runner._plans) == sorted([(second.name, second.version), (other.name, other.version)])
    assert runner._plan(other) is plans[1]


def test_a_failing_frame_job_falls_back_to_the_interpreter(tmp_path: Path, spark: Any) -> None:
    body = "<sequence>" + pipelet("broken", "BrokenFrame") + "</sequence>"
    wf = _workflow(tmp_path, body, name="Broken")
    assert frame_plan(wf)[0] is not None
    runner = SparkRunner(spark, batch_timeout=120)
    results, docs = _run(runner, wf, {"a": {"t": "1"}, "b": {}}, typed=False)
    assert all(r.ok for r in results)
    assert runner.frame_records == 0
    assert docs["a"]["attrs"]["x"] == ["y"] and docs["b"]["attrs"]["x"] == ["y"]


def test_run_stream_mixes_frame_and_interpreter_batches(tmp_path: Path, spark: Any) -> None:
    wf = _workflow(tmp_path, TEXT_FLOW)
    spec = _records(120, seed=5)
    bb = Blackboard.local()
    for rid, attrs in spec.items():
        bb.create(rid)
        bb.set_attributes(rid, attrs)
    ids = list(spec)
    batches = [[[rid] for rid in ids[i:i + 40]] for i in range(0, 120, 40)]
    runner = SparkRunner(spark, batch_timeout=120)
    seen = [r for results in runner.run_stream(wf, bb, batches) for r in results]
    assert len(seen) == 120 and all(r.ok for r in seen)
    assert {rid: bb.document(rid)["meta"] for rid in ids} == _run(LocalRunner(), wf, spec, typed=False)[1]


@pytest.mark.parametrize("params", [
    {"attributes": "text,title,missing"},
    {"attributes": "text", "normalize": "true", "algorithm": "md5", "output": "h"},
    {"attributes": "title", "algorithm": "sha512"},
])
def test_fingerprint_in_the_frame_matches_python(tmp_path: Path, spark: Any, params: dict[str, str]) -> None:
    wf = _workflow(tmp_path, "<sequence>" + _invoke("fp", "fingerprint.Fingerprint", **params) + "</sequence>")
    assert frame_plan(wf)[0] is not None
    spec = _records(150, seed=8)
    runner = SparkRunner(spark, batch_timeout=120)
    assert _run(runner, wf, spec)[1] == _run(LocalRunner(), wf, spec)[1]
    assert runner.frame_records > 30  # values holding \x1c are declined (see the next test)


def test_values_a_form_declines_run_in_the_interpreter(tmp_path: Path, spark: Any) -> None:
    """Fingerprint's form escapes the common characters; a rarer control character is declined."""
    body = ("<sequence>" + _invoke("fp", "fingerprint.Fingerprint", attributes="text")
            + _invoke("low", "text.Lowercase", attribute="text", output="low") + "</sequence>")
    wf = _workflow(tmp_path, body)
    plan = frame_plan(wf)[0]
    assert plan is not None and plan.declines
    spec = {f"r{i:02d}": {"text": text} for i, text in enumerate(
        ["plain", 'say "hi"\\', "tab\tline\nret\r", "bell\x07", "unit\x1fsep", "nul\x00", "Ok"] * 4)}
    runner = SparkRunner(spark, batch_timeout=120)
    results, spark_records = _run(runner, wf, spec, typed=False)
    assert spark_records == _run(LocalRunner(), wf, spec, typed=False)[1]
    assert all(r.ok for r in results) and len(results) == len(spec)
    assert runner.frame_records == 4 * 4  # the bell, unit separator and NUL values were declined
