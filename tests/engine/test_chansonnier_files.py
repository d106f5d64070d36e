"""Chansonnier's SMILA pipelines load with only unmapped classes left, and run.

``giorgiosironi/Chansonnier`` (2010) ships sixteen BPEL pipelines of SMILA's
0.9 era, some of SMILA's test pipelines among them in an older form than the
SMILA corpus's (``test_smila_files``): ``SimplePipeline`` and
``SplitterPipeline`` set annotations with both anonymous and named values,
which reach the pipelet as :class:`~blackboard.Annotation` configuration
values.  The files are read from a copy outside the repository
(``CHALK_CHANSONNIER_DIR``, default ``../corpora/chansonnier``, one folder
per bundle); these tests skip when it is absent.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import CHANSONNIER_DIR, records, unknown_class_error

from blackboard import Annotation, Blackboard
from engine import LocalRunner, validate_tree

pytestmark = pytest.mark.skipif(
    not CHANSONNIER_DIR.is_dir(),
    reason=f"Chansonnier's pipelines not found at {CHANSONNIER_DIR}: copy the *.bpel files of "
           "github.com/giorgiosironi/Chansonnier there, one folder per bundle (or set CHALK_CHANSONNIER_DIR)",
)

BPEL_TEST = "org.eclipse.smila.processing.bpel.test"

# What is left of each file once the whole tree is validated: the number of pipelet classes
# or services with no Python counterpart (Chansonnier's own processing services, Solr,
# SMILA's test services and deliberately unknown ones, the HelloWorld web service).
UNKNOWN_PER_FILE = {
    "SMILA.application/addpipeline.bpel": 6,
    "org.eclipse.smila.integration.helloworld/addpipeline.bpel": 2,
    "org.eclipse.smila.integration.solr/addfeedpipeline.bpel": 1,
    "org.eclipse.smila.integration.solr/addpipeline.bpel": 2,
    "org.eclipse.smila.integration.solr/searchpipeline.bpel": 1,
    f"{BPEL_TEST}/conditionalpipeline.bpel": 1,
    f"{BPEL_TEST}/echopipeline.bpel": 0,
    f"{BPEL_TEST}/errorpipeletpipeline.bpel": 1,
    f"{BPEL_TEST}/errorservicepipeline.bpel": 2,
    f"{BPEL_TEST}/helloworldpipeline.bpel": 1,
    f"{BPEL_TEST}/localhelloworldpipeline.bpel": 0,
    f"{BPEL_TEST}/searchpipeletpipeline.bpel": 1,
    f"{BPEL_TEST}/searchservicepipeline.bpel": 3,
    f"{BPEL_TEST}/simplepipeline.bpel": 0,
    f"{BPEL_TEST}/splitterpipeline.bpel": 1,
    f"{BPEL_TEST}/superpipeline.bpel": 0,
}
# Files that invoke a sub-workflow with unmapped classes: that is their only other error.
INVOKES_UNMAPPED = {f"{BPEL_TEST}/superpipeline.bpel": ["SplitterPipeline"]}


@pytest.fixture(scope="module")
def corpus_report() -> Any:
    return validate_tree(CHANSONNIER_DIR)


def test_the_expectations_name_every_file_of_the_corpus() -> None:
    files = sorted(str(p.relative_to(CHANSONNIER_DIR)) for p in CHANSONNIER_DIR.rglob("*.bpel"))
    assert files == sorted(UNKNOWN_PER_FILE)


@pytest.mark.parametrize("name", sorted(UNKNOWN_PER_FILE))
def test_each_file_loads_with_only_unmapped_classes_left(corpus_report: Any, name: str) -> None:
    (entry,) = [f for f in corpus_report.files if f.path == str(CHANSONNIER_DIR / name)]
    unknown = [e for e in entry.errors if unknown_class_error(e)]
    others = [e for e in entry.errors if not unknown_class_error(e)]
    assert len(unknown) == UNKNOWN_PER_FILE[name] == len(entry.unknown), entry.errors
    subs = INVOKES_UNMAPPED.get(name, [])
    assert [e.split("<invokeWorkflow ", 1)[1].split("'")[1] for e in others] == subs, others
    assert all(": the sub-workflow has errors" in e for e in others)
    for sub in subs:
        (file,) = [f for f in corpus_report.files if f.name == sub and f.path.startswith(str(CHANSONNIER_DIR))
                   and f.path.rsplit("/", 2)[-2] == name.split("/")[0]]
        assert file.errors and all(unknown_class_error(e) for e in file.errors)


def _mapped(report: Any) -> tuple[dict[str, str], dict[str, str]]:
    """Tables mapping every unmapped class of the corpus to test code."""
    stand_in = "tests.engine._pipelets.StandIn"
    aliases = {g.name: stand_in for g in report.unknown() if g.kind == "pipelet"}
    services = {g.name: stand_in for g in report.unknown() if g.kind == "service"}
    services["HelloWorld"] = "tests.engine._pipelets.Greeter"
    return aliases, services


def test_with_the_unknown_classes_mapped_every_file_loads_and_runs(corpus_report: Any) -> None:
    aliases, services = _mapped(corpus_report)
    report = validate_tree(CHANSONNIER_DIR, aliases=aliases, services=services)
    assert report.errors == []
    assert len(report.workflows) == len(UNKNOWN_PER_FILE)
    for wf in report.workflows:
        bb = Blackboard.local()
        records(bb, {"a": {"workflow-attribute": "x", "MimeType": "text/plain"}, "b": {"workflow-attribute": "y"}})
        results = LocalRunner().run(wf, bb, [["a"], ["b"]])
        assert all(r.ok for r in results), (wf.path, results)


FIRST = Annotation(["anonvalue1", "anonvalue2"], {"name1": "value1", "name2": "value2"})
SECOND = Annotation(["anonvalue3", "anonvalue4"], {"name3": "value3", "name4": "value4"})


def test_the_simple_pipeline_sets_its_annotations_on_each_record_as_smila_did(corpus_report: Any) -> None:
    simple = corpus_report.workflow(CHANSONNIER_DIR / BPEL_TEST / "simplepipeline.bpel")
    (invoke,) = simple.pipelets()
    assert invoke.config["test-annotation-1"] == FIRST and invoke.config["test-annotation-2"] == SECOND
    bb = Blackboard.local()
    records(bb, {"r": {}, "s": {"x": 1}})
    results = LocalRunner().run(simple, bb, [["r"], ["s"]])
    assert all(r.ok for r in results)
    for rid in ("r", "s"):
        assert bb.get_annotation(rid, None, "test-annotation-1") == FIRST
        assert bb.get_annotation(rid, None, "test-annotation-2") == SECOND
        assert bb.get_attributes(rid)["FirstIsString"] == "FirstValue"


def test_the_splitter_pipeline_gives_its_service_the_annotations_as_configuration(corpus_report: Any) -> None:
    aliases, services = _mapped(corpus_report)
    report = validate_tree(CHANSONNIER_DIR / BPEL_TEST, aliases=aliases, services=services)
    splitter = report.workflow(CHANSONNIER_DIR / BPEL_TEST / "splitterpipeline.bpel")
    (invoke,) = splitter.pipelets()
    assert invoke.config == {
        "test-annotation-1": Annotation(["anonvalue1a", "anonvalue2a"], {"name1": "value1a", "name2": "value2a"}),
        "test-annotation-2": Annotation(["anonvalue3a", "anonvalue4a"], {"name3": "value3a", "name4": "value4a"})}
    superpipeline = report.workflow(CHANSONNIER_DIR / BPEL_TEST / "superpipeline.bpel")
    bb = Blackboard.local()
    records(bb, {"p": {}})
    (result,) = LocalRunner().run(superpipeline, bb, [["p"]])
    assert result.ok and result.result_ids == ["p"]
    assert bb.get_attributes("p")["trail"] == "stand-in"  # the splitter's stand-in, then echo and simple
    assert bb.get_annotation("p", None, "test-annotation-1") == FIRST
