"""Real SMILA workflow files load unchanged and run (aliases map their Java pipelets).

The files are shared test data (``../shared/smila-workflows/``, read in
place); these tests skip when the folder is absent.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import SMILA_DIR, records, snapshot, unknown_class_error

from blackboard import Blackboard
from engine import LocalRunner, SparkRunner, WorkflowDefinitionError, load_workflow, validate_tree

pytestmark = pytest.mark.skipif(
    not SMILA_DIR.is_dir(), reason=f"SMILA workflow files not found at {SMILA_DIR} (shared test data)"
)

LUCENE = {"org.eclipse.smila.lucene.pipelets.LuceneIndexPipelet": "tests.engine._pipelets.RecordIndex"}

# What is left of each file once the whole tree is validated: the number of
# pipelet classes (or services) with no Python counterpart.  Project pipelets
# of the repository the files come from (it.polimi.*), SMILA pipelets that
# need a server (Solr, Sesame) or belong to search, SMILA's deliberately
# unknown UnknownPipelet, and the HelloWorld web service.
UNKNOWN_PER_FILE = {
    "SMILA.application/addfeedpipeline.bpel": 0,
    "SMILA.application/addpipeline.bpel": 0,
    "SMILA.application/deletepipeline.bpel": 0,
    "SMILA.application/mypipeline.bpel": 2,
    "SMILA.application/searchpipeline.bpel": 1,
    "SMILA.application/solraddpipeline_X.bpel": 4,
    "SMILA.application/solrsearchpipeline.bpel": 1,
    "SMILA.application/umlpipeline.bpel": 13,
    "SMILA.application/umlpipeline_A.bpel": 2,
    "SMILA.application/umlpipeline_B.bpel": 2,
    "SMILA.application/umlpipeline_C.bpel": 4,
    "SMILA.application/umlpipeline_D.bpel": 5,
    "SMILA.application/webmlpipeline_B.bpel": 4,
    "SMILA.application/webmlpipeline_C.bpel": 5,
    "SMILA.application/webmlsearchpipeline.bpel": 3,
    "SMILA.application/xmldumpaddpipeline.bpel": 0,
    "SMILA.application/xmldumpsplitterpipeline.bpel": 0,
    "org.eclipse.smila.connectivity.framework.test/echopipeline.bpel": 0,
    "org.eclipse.smila.connectivity.queue.worker.test/echopipeline.bpel": 0,
    "org.eclipse.smila.connectivity.queue.worker.test/errorpipeline.bpel": 1,
    "org.eclipse.smila.connectivity.queue.worker.test/simplepipeline.bpel": 0,
    "org.eclipse.smila.integration.helloworld/addpipeline.bpel": 0,
    "org.eclipse.smila.integration.solr/addfeedpipeline.bpel": 1,
    "org.eclipse.smila.integration.solr/addpipeline.bpel": 1,
    "org.eclipse.smila.integration.solr/searchpipeline.bpel": 1,
    "org.eclipse.smila.ontology.test/createfileuripipeline.bpel": 0,
    "org.eclipse.smila.ontology.test/createrelationpipeline.bpel": 1,
    "org.eclipse.smila.ontology.test/createresourcepipeline.bpel": 1,
    "org.eclipse.smila.ontology.test/sesamememoryreadpipeline.bpel": 1,
    "org.eclipse.smila.ontology.test/sesamereadpipeline.bpel": 1,
    "org.eclipse.smila.ontology.test/sesamewritepipeline.bpel": 2,
    "org.eclipse.smila.processing.bpel.test/conditionalpipeline.bpel": 0,
    "org.eclipse.smila.processing.bpel.test/echopipeline.bpel": 0,
    "org.eclipse.smila.processing.bpel.test/errorpipeline.bpel": 1,
    "org.eclipse.smila.processing.bpel.test/helloworldpipeline.bpel": 1,
    "org.eclipse.smila.processing.bpel.test/localhelloworldpipeline.bpel": 0,
    "org.eclipse.smila.processing.bpel.test/searchpipeletpipeline.bpel": 1,
    "org.eclipse.smila.processing.bpel.test/splitterpipeline.bpel": 0,
    "org.eclipse.smila.processing.bpel.test/superpipeline.bpel": 0,
    "org.eclipse.smila.processing.pipelets.test/AddValuesPipeline.bpel": 0,
    "org.eclipse.smila.processing.pipelets.test/MimeTypeIdentifyPipeline.bpel": 0,
    "org.eclipse.smila.search.api.test/searchpipeletpipeline.bpel": 1,
}

# SMILA's helloworld integration sample ships conditions with a typo
# (``rec:Val@key="MimeType"]``, the predicate's "[" lost): invalid XPath, which
# SMILA's engine (Apache ODE) refused too.  They are reported with the fix.
TYPO_FILE = "org.eclipse.smila.integration.helloworld/addpipeline.bpel"
TYPO_LINES = [37, 63, 68]


@pytest.fixture(scope="module")
def corpus_report() -> Any:
    return validate_tree(SMILA_DIR)


def test_the_expectations_name_every_file_of_the_corpus() -> None:
    files = sorted(str(p.relative_to(SMILA_DIR)) for p in SMILA_DIR.rglob("*.bpel"))
    assert files == sorted(UNKNOWN_PER_FILE)


@pytest.mark.parametrize("name", sorted(UNKNOWN_PER_FILE))
def test_each_file_loads_with_only_unmapped_java_classes_left(corpus_report: Any, name: str) -> None:
    path = str(SMILA_DIR / name)
    (entry,) = [f for f in corpus_report.files if f.path == path]
    unknown = [e for e in entry.errors if unknown_class_error(e)]
    others = [e for e in entry.errors if not unknown_class_error(e)]
    assert len(unknown) == UNKNOWN_PER_FILE[name] == len(entry.unknown), entry.errors
    if name == TYPO_FILE:
        assert [int(e.split(":")[1]) for e in others] == TYPO_LINES
        assert all("lacks its '[': write rec:Val[@key=...]" in e for e in others)
    elif name == DUMP_SPLITTER:
        # reads the file a message names, with no folder to keep it in
        assert len(others) == 1 and ":62: " in others[0] and "'baseDirectory'" in others[0]
    else:
        assert others == []
    assert (entry.workflow is not None) == (not entry.errors)


def test_the_summary_groups_the_unknown_classes_by_name(corpus_report: Any) -> None:
    groups = {g.name: g for g in corpus_report.unknown()}
    assert sum(g.count for g in groups.values()) == sum(UNKNOWN_PER_FILE.values())
    solr = groups["it.polimi.mdir.solr.SolrIndexerPipelet"]
    assert solr.count == 9 and solr.kind == "pipelet" and len(solr.files) == 6
    assert groups["HelloWorld"].kind == "partner"
    assert "org.eclipse.smila.processing.bpel.pipelet.UnknownPipelet" in groups
    lines = corpus_report.summary()
    assert lines[0].startswith(f"{len(groups)} unknown pipelet class(es)")
    assert any(line.strip() == "9  pipelet  it.polimi.mdir.solr.SolrIndexerPipelet" for line in lines)


def test_sub_workflows_resolve_across_the_tree(corpus_report: Any) -> None:
    wf = corpus_report.workflow(SMILA_DIR / "org.eclipse.smila.processing.bpel.test" / "superpipeline.bpel")
    subs = dict(wf.subworkflows)
    assert subs["SimplePipeline"].path.endswith("connectivity.queue.worker.test/simplepipeline.bpel")
    # three EchoPipelines in the tree: the one in the invoking file's folder wins
    assert subs["EchoPipeline"].path == str(SMILA_DIR / "org.eclipse.smila.processing.bpel.test" / "echopipeline.bpel")


DUMP_SPLITTER = "SMILA.application/xmldumpsplitterpipeline.bpel"


def _confine_dump_splitter(path: Path, folder: Path) -> None:
    """Give SMILA's dump splitter the ``baseDirectory`` Chalk asks of a splitter reading paths.

    A path in a message is read only inside that folder: SMILA's file has no such
    parameter, so it does not load unchanged (the error names it).
    """
    text = path.read_text()
    line = '<rec:Val key="inputType">ATTRIBUTE</rec:Val>'
    assert line in text
    path.write_text(text.replace(line, f'{line}<rec:Val key="baseDirectory">{folder}</rec:Val>'))


def _mapped_corpus(tmp: Path, report: Any) -> tuple[Path, dict[str, str], dict[str, str]]:
    """The corpus in ``tmp`` (the helloworld typo fixed) and tables mapping every unknown to test code."""
    target = tmp / "smila"
    shutil.copytree(SMILA_DIR, target)
    typo = target / TYPO_FILE
    typo.write_text(re.sub(r"rec:Val@key=", "rec:Val[@key=", typo.read_text()))
    _confine_dump_splitter(target / DUMP_SPLITTER, tmp)
    aliases = {g.name: "tests.engine._pipelets.StandIn" for g in report.unknown() if g.kind == "pipelet"}
    services = {"HelloWorld": "tests.engine._pipelets.Greeter"}
    return target, aliases, services


def _sample(bb: Blackboard) -> list[list[str]]:
    records(bb, {
        "doc.html": {"MimeType": "text/html", "Extension": "html", "workflow-attribute": "split", "Title": "T"},
        "doc.txt": {"MimeType": "text/plain", "workflow-attribute": "keep",
                    "Content": "<page><title>Plain</title><revision><text>words</text></revision></page>"},
        "pair-1": {"Extension": "xml", "workflow-attribute": "keep", "Content": "<page><title>P</title><revision><text>x</text></revision></page>"},
        "pair-2": {"Extension": "png"},
    })
    bb.set_attachment("doc.html", "Content", b"<html><head><title>Hi</title></head><body><p>Text</p></body></html>")
    bb.set_attachment("pair-2", "Content", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    return [["doc.html"], ["doc.txt"], ["pair-1", "pair-2"]]


@pytest.mark.spark
def test_with_the_unknown_classes_mapped_every_file_loads_and_runs_on_spark(corpus_report: Any, tmp_path: Path,
                                                                           spark: Any) -> None:
    root, aliases, services = _mapped_corpus(tmp_path, corpus_report)
    report = validate_tree(root, aliases=aliases, services=services)
    assert report.errors == []
    assert len(report.workflows) == len(UNKNOWN_PER_FILE)
    runner = SparkRunner(spark)
    ran = 0
    for wf in report.workflows:
        bb = Blackboard.local()
        results = runner.run(wf, bb, _sample(bb))
        assert all(r.ok for r in results), (wf.path, results)
        ran += 1
    assert ran == 42


def test_the_test_pipelines_do_what_smila_s_tests_expect(corpus_report: Any) -> None:
    bpel = SMILA_DIR / "org.eclipse.smila.processing.bpel.test"
    splitter = corpus_report.workflow(bpel / "splitterpipeline.bpel")
    bb = Blackboard.local()
    records(bb, {"r": {"x": 1}})
    results = LocalRunner().run(splitter, bb, [["r"]])
    assert results[0].result_ids == ["r#fragment0", "r#fragment1", "r#fragment2"]
    assert bb.get_attributes("r#fragment2") == {"x": 1}
    simple = corpus_report.workflow(SMILA_DIR / "org.eclipse.smila.connectivity.queue.worker.test"
                                    / "simplepipeline.bpel")
    bb = Blackboard.local()
    records(bb, {"s": {}})
    LocalRunner().run(simple, bb, [["s"]])
    assert bb.get_attributes("s") == {"single-config-value": "value1", "multi-config-value": ["value-a", "value-b"],
                                      "sub-config": {"sub-config-value": "sub-value"}}
    superpipeline = corpus_report.workflow(bpel / "superpipeline.bpel")
    bb = Blackboard.local()
    records(bb, {"p": {}})
    results = LocalRunner().run(superpipeline, bb, [["p"]])
    assert results[0].ok and len(results[0].result_ids) == 3
    assert all(bb.get_attributes(rid)["multi-config-value"] == ["value-a", "value-b"]
               for rid in results[0].result_ids)


def test_the_hello_world_pipeline_calls_its_web_service_through_the_service_table(tmp_path: Path) -> None:
    wf = load_workflow(SMILA_DIR / "org.eclipse.smila.processing.bpel.test" / "helloworldpipeline.bpel",
                       services={"HelloWorld": "tests.engine._pipelets.Greeter"})
    bb = Blackboard.local()
    records(bb, {"r": {"workflow-attribute": "SMILA"}})
    results = LocalRunner().run(wf, bb, [["r"]])
    assert results[0].ok and bb.get_attributes("r")["workflow-attribute"] == "Hello SMILA"


def test_the_xml_dump_pipelines_split_and_extract(tmp_path: Path) -> None:
    dump = tmp_path / "dump.xml"
    dump.write_text("<mediawiki><siteinfo/><page><title>Alpha</title><revision><text>first</text></revision>"
                    "</page><page><title>Beta</title><revision><text>second</text></revision></page></mediawiki>")
    app = SMILA_DIR / "SMILA.application"
    with pytest.raises(WorkflowDefinitionError, match="baseDirectory"):
        load_workflow(app / "xmldumpsplitterpipeline.bpel")
    confined = tmp_path / "xmldumpsplitterpipeline.bpel"
    shutil.copy(app / "xmldumpsplitterpipeline.bpel", confined)
    _confine_dump_splitter(confined, tmp_path)
    split = load_workflow(confined)
    add = load_workflow(app / "xmldumpaddpipeline.bpel")
    bb = Blackboard.local()
    records(bb, {"dump": {"Path": str(dump), "MimeType": "text/xml"}})
    results = LocalRunner().run(split, bb, [["dump"]])
    assert results[0].result_ids == ["dump", "dump#Alpha", "dump#Beta"]
    LocalRunner().run(add, bb, [["dump#Alpha"], ["dump#Beta"]])
    assert bb.get_attributes("dump#Beta")["Title"] == "Beta"
    assert bb.get_attributes("dump#Beta")["Content"] == "second"


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
        assert all(r.ok for r in results)
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


def test_smila_file_with_a_broken_condition_is_reported_with_its_line_and_the_fix() -> None:
    path = SMILA_DIR / TYPO_FILE
    with pytest.raises(WorkflowDefinitionError) as info:
        load_workflow(path)
    errors = info.value.errors
    assert f"{path}:37: <if 'conditionHasMimeType'>: condition is not valid XPath 1.0" in "\n".join(errors)
    assert "the predicate after rec:Val lacks its '['" in errors[0]


def test_smila_java_pipelets_without_an_equivalent_are_unknown_pipelets() -> None:
    path = SMILA_DIR / "SMILA.application" / "mypipeline.bpel"
    with pytest.raises(WorkflowDefinitionError) as info:
        load_workflow(path)
    assert [e.split(": ", 2)[0] for e in info.value.errors] == [f"{path}:47", f"{path}:58"]
    assert "it.polimi.mdir.dummybundle.DummyPipelet" in info.value.errors[0]
    assert "HighlightingPipelet" in info.value.errors[1]
