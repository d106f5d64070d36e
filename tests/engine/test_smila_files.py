"""Real SMILA workflow files load unchanged and run (aliases map their Java pipelets)."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import SMILA_DIR, records, snapshot

from blackboard import Blackboard
from engine import LocalRunner, SparkRunner, WorkflowDefinitionError, load_workflow

pytestmark = pytest.mark.skipif(
    not SMILA_DIR.is_dir(), reason=f"SMILA workflow files not found at {SMILA_DIR} (shared test data)"
)

LUCENE = {"org.eclipse.smila.lucene.pipelets.LuceneIndexPipelet": "tests.engine._pipelets.RecordIndex"}


def _addpipeline_batch(bb: Blackboard) -> list[list[str]]:
    records(bb, {"html": {"Extension": "html"}, "txt": {"MimeType": "text/plain"}, "img": {"Extension": "png"}})
    bb.set_attachment("html", "Content", b"<html><head><title>Hi there</title></head><body><p>Some   text</p></body></html>")
    bb.set_attachment("txt", "Content", b"plain words")
    bb.set_attachment("img", "Content", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    return [["html"], ["txt"], ["img"]]


@pytest.mark.spark
def test_smila_addpipeline_runs_mime_detection_html_to_text_and_indexing(spark: Any) -> None:
    wf = load_workflow(SMILA_DIR / "SMILA.application" / "addpipeline.bpel", aliases=LUCENE)
    assert wf.name == "AddPipeline"
    outcomes = []
    for runner in (LocalRunner(), SparkRunner(spark)):
        bb = Blackboard.local()
        results = runner.run(wf, bb, _addpipeline_batch(bb))
        assert all(r.ok for r in results), results
        outcomes.append(snapshot(bb))
    assert outcomes[0] == outcomes[1]
    after = outcomes[1]
    assert after["html"]["MimeType"] == "text/html" and after["html"]["Title"] == "Hi there"
    assert after["html"]["Content"] == "Some text" and after["html"]["indexed"] == "test_index:ADD"
    assert after["txt"]["Content"] == "plain words"
    assert after["img"]["MimeType"] == "image/png" and "indexed" not in after["img"]


def test_smila_local_hello_world_assign_writes_the_record() -> None:
    wf = load_workflow(SMILA_DIR / "org.eclipse.smila.processing.bpel.test" / "localhelloworldpipeline.bpel")
    bb = Blackboard.local()
    records(bb, {"r": {"workflow-attribute": "SMILA"}})
    results = LocalRunner().run(wf, bb, [["r"]])
    assert results[0].ok and bb.get_attributes("r")["workflow-attribute"] == "Hello SMILA"


def test_smila_conditional_pipeline_splits_when_the_attribute_says_so() -> None:
    wf = load_workflow(
        SMILA_DIR / "org.eclipse.smila.processing.bpel.test" / "conditionalpipeline.bpel",
        aliases={"org.eclipse.smila.processing.bpel.pipelet.SplitterPipelet": "tests.engine._pipelets.SplitInTwo"},
    )
    bb = Blackboard.local()
    records(bb, {"s": {"workflow-attribute": "split"}, "k": {"workflow-attribute": "keep"}})
    results = LocalRunner().run(wf, bb, [["s"], ["k"]])
    assert [r.result_ids for r in results] == [["s#a", "s#b"], ["k"]]


def test_smila_echo_pipeline_passes_records_through() -> None:
    wf = load_workflow(SMILA_DIR / "org.eclipse.smila.processing.bpel.test" / "echopipeline.bpel")
    bb = Blackboard.local()
    records(bb, {"e": {"x": 1}})
    results = LocalRunner().run(wf, bb, [["e"]])
    assert results[0].ok and results[0].result_ids == ["e"]


def test_smila_file_with_a_broken_condition_is_reported_with_its_line() -> None:
    path = SMILA_DIR / "org.eclipse.smila.integration.helloworld" / "addpipeline.bpel"
    with pytest.raises(WorkflowDefinitionError) as info:
        load_workflow(path, aliases=LUCENE)
    errors = info.value.errors
    assert f"{path}:37: <if 'conditionHasMimeType'>: condition is not valid XPath 1.0" in "\n".join(errors)


def test_smila_java_pipelets_without_an_equivalent_are_unknown_pipelets() -> None:
    path = SMILA_DIR / "SMILA.application" / "addpipeline.bpel"
    with pytest.raises(WorkflowDefinitionError) as info:
        load_workflow(path)
    assert info.value.errors == [
        e for e in info.value.errors if e.startswith(f"{path}:99: ") and "LuceneIndexPipelet" in e
    ]
