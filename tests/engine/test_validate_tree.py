"""``validate_tree``: a whole tree of files, sub-workflows across it, each error once, the summary."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from engine_helpers import BPEL_HEADER, VALID_DIR

from engine import load_workflow, validate_path, validate_tree


def write(path: Path, name: str, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BPEL_HEADER.format(name=name) + body + "</process>")
    return path


def invoke(name: str) -> str:
    return f'<proc:invokeWorkflow workflow="{name}"/>'


def java(cls: str, line_name: str = "j") -> str:
    return (f'<extensionActivity><proc:invokePipelet name="{line_name}"><proc:pipelet class="{cls}"/>'
            "</proc:invokePipelet></extensionActivity>")


def test_files_in_subfolders_are_validated(tmp_path: Path) -> None:
    write(tmp_path / "top.bpel", "Top", "<empty/>")
    bad = write(tmp_path / "a" / "b" / "deep.bpel", "Deep", "<bogus/>")
    write(tmp_path / ".hidden" / "skipped.bpel", "Hidden", "<bogus/>")
    report = validate_tree(tmp_path)
    assert [f.name for f in report.files] == ["Top", "Deep"]
    assert report.errors == [f"{bad}:1: unknown element <bogus>; expected one of: " + report.errors[0].split(
        "expected one of: ")[1]]
    assert validate_path(tmp_path) == report.errors


def test_sub_workflows_resolve_to_the_nearest_file_of_that_name(tmp_path: Path) -> None:
    write(tmp_path / "shared" / "child.bpel", "Child", "<empty name='shared'/>")
    write(tmp_path / "app" / "child.bpel", "Child", "<empty name='near'/>")
    write(tmp_path / "lib" / "helper.bpel", "Helper", "<empty/>")
    parent = write(tmp_path / "app" / "parent.bpel", "Parent", f"<sequence>{invoke('Child')}{invoke('Helper')}</sequence>")
    report = validate_tree(tmp_path)
    assert report.errors == []
    subs = dict(report.workflow(parent).subworkflows)
    assert subs["Child"].body.name == "near" and subs["Helper"].path.endswith("lib/helper.bpel")
    # validating the one file resolves across the tree of its folder (app/), and reports only the file
    (alone,) = validate_tree(parent).errors
    assert alone.startswith(f"{parent}:1: <invokeWorkflow 'Helper'>: unknown sub-workflow; known workflows: Child,")


def test_two_equally_near_candidates_are_an_error_naming_both(tmp_path: Path) -> None:
    write(tmp_path / "a" / "x.bpel", "Twin", "<empty/>")
    write(tmp_path / "b" / "x.bpel", "Twin", "<empty/>")
    parent = write(tmp_path / "c" / "p.bpel", "P", invoke("Twin"))
    (error,) = validate_tree(tmp_path).errors
    assert error.startswith(f"{parent}:1: <invokeWorkflow 'Twin'>: 2 workflows of that name are equally near")
    assert str(tmp_path / "a" / "x.bpel") in error and str(tmp_path / "b" / "x.bpel") in error


def test_a_name_twice_in_one_folder_is_an_error_and_recursion_across_folders_too(tmp_path: Path) -> None:
    write(tmp_path / "one.bpel", "Same", "<empty/>")
    second = write(tmp_path / "two.bpel", "Same", "<empty/>")
    a = write(tmp_path / "x" / "a.bpel", "A", invoke("B"))
    b = write(tmp_path / "y" / "b.bpel", "B", invoke("A"))
    errors = validate_tree(tmp_path).errors
    assert f"{second}:1: process name 'Same' is already defined in {tmp_path / 'one.bpel'}" in "\n".join(errors)
    assert any(e.startswith(f"{a}:1: <invokeWorkflow 'B'>: sub-workflow recursion A -> B -> A") for e in errors)
    assert any(e.startswith(f"{b}:1: <invokeWorkflow 'A'>: sub-workflow recursion") for e in errors)


def test_every_error_is_reported_once_and_nothing_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "child.bpel", "Child", "<bogus/>")
    write(tmp_path / "p1.bpel", "P1", invoke("Child"))
    write(tmp_path / "p2.bpel", "P2", invoke("Child"))
    with caplog.at_level(logging.DEBUG, logger="engine"):
        report = validate_tree(tmp_path)
    assert len(report.errors) == len(set(report.errors)) == 3
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_summary_groups_unknown_classes_with_counts_and_places(tmp_path: Path) -> None:
    body = (f"<sequence>{java('com.acme.Indexer', 'a')}{java('com.acme.Indexer', 'b')}"
            f"{java('com.acme.Crawler', 'c')}</sequence>")
    write(tmp_path / "one.bpel", "One", body)
    write(tmp_path / "sub" / "two.bpel", "Two", java("com.acme.Indexer"))
    report = validate_tree(tmp_path)
    groups = report.unknown()
    assert [(g.name, g.count, len(g.files)) for g in groups] == [("com.acme.Indexer", 3, 2), ("com.acme.Crawler", 1, 1)]
    lines = report.summary()
    assert lines[0].startswith("2 unknown pipelet class(es) and service(s), 4 use(s) in 2 file(s)")
    assert lines[2:4] == ["    3  pipelet  com.acme.Indexer", f"{'':>15} one.bpel:1"]
    assert f"{'':>15} sub/two.bpel:1" in lines
    mapped = validate_tree(tmp_path, aliases={"com.acme.Indexer": "tests.engine._pipelets.StandIn",
                                              "com.acme.Crawler": "tests.engine._pipelets.StandIn"})
    assert mapped.errors == [] and mapped.summary() == ["no unknown pipelet classes or services"]


def test_notes_say_where_a_dataframe_form_cannot_run(tmp_path: Path) -> None:
    lower = ('<extensionActivity><proc:invokePipelet name="lower"><proc:pipelet class="pipelets.text.Lowercase"/>'
             '<proc:configuration><proc:param name="attribute">title</proc:param></proc:configuration>'
             "</proc:invokePipelet></extensionActivity>")
    loop = write(tmp_path / "loop.bpel", "Loop", f"<forEach parallel='yes'><scope>{lower}</scope></forEach>")
    write(tmp_path / "plain.bpel", "Plain", f"<sequence>{lower}</sequence>")
    report = validate_tree(tmp_path, notes=True)
    assert report.errors == []
    (note,) = report.notes
    assert note.startswith(f"{loop}:1: note: <invokePipelet 'lower'> has a DataFrame form, but this workflow runs "
                           "in the interpreter on Spark: <forEach> at line 1 has no DataFrame form")


def test_the_valid_fixtures_are_all_found(tmp_path: Path) -> None:
    report = validate_tree(VALID_DIR)
    assert report.valid and [wf.name for wf in report.workflows] == ["Mixed"]


def test_a_missing_path_is_an_error() -> None:
    assert validate_tree("/no/such/place").errors == ["/no/such/place:0: no such file or directory"]


def test_the_same_file_with_other_alias_tables_is_another_version(tmp_path: Path) -> None:
    path = write(tmp_path / "w.bpel", "W", java("com.acme.Thing"))
    one = load_workflow(path, aliases={"com.acme.Thing": "tests.engine._pipelets.StandIn"})
    two = load_workflow(path, aliases={"com.acme.Thing": "tests.engine._pipelets.Upper"})
    assert one.version != two.version


def test_lines_are_what_chalk_validate_prints(tmp_path: Path) -> None:
    one = write(tmp_path / "one.bpel", "One", f"<sequence>{java('com.acme.X')}<bogus/></sequence>")
    report = validate_tree(tmp_path)
    plain = report.lines()
    assert len(plain) == 2 and plain[1].startswith(f"{one}:1: <invokePipelet 'j'>: unknown pipelet class")
    grouped = report.lines(summary=True)
    assert grouped[0].startswith(f"{one}:1: unknown element <bogus>")  # the class error is in the table
    assert grouped[1].startswith("1 unknown pipelet class(es)") and "    1  pipelet  com.acme.X" in grouped
    write(tmp_path / "one.bpel", "One", "<empty/>")
    assert validate_tree(tmp_path).lines(label="flows") == ["flows: valid: 1 workflow(s)", "  One  one.bpel"]
