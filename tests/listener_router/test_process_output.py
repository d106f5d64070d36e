"""``chalk process --output``: one-element lists stay lists, annotations are kept."""

from __future__ import annotations

import json

from listener_router.cli import main

PIPELETS = '''
from blackboard import Annotation
from pipelets import Pipelet


class Annotate(Pipelet):
    """Annotates the record and its "tags" attribute; adds a one-valued attribute."""

    def process(self, blackboard, ids):
        for rid in ids:
            blackboard.set_annotation(rid, None, "nextDestination", Annotation(["out.q"]))
            blackboard.set_annotation(rid, "tags[-1]", "source", Annotation(["feed"], {"weight": 2}))
            blackboard.set_annotation(rid, "author[0]", "checked", Annotation(["yes"]))
            blackboard.set_literal(rid, "seen", True)
        return ids
'''

WORKFLOW = """<?xml version="1.0"?>
<process name="Annotating" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="a">
      <proc:pipelet class="out_test_pipelets.Annotate"/>
    </proc:invokePipelet>
  </sequence>
</process>
"""


def test_output_keeps_lists_and_annotations(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "flows"))
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "out_test_pipelets.py").write_text(PIPELETS)
    (tmp_path / "flows" / "annotating.xml").write_text(WORKFLOW)
    records = [{"id": "r1", "attributes": {"tags": ["only"], "title": "T", "many": ["a", "b"],
                                           "author": [{"name": "N"}]}},
               {"id": "r2", "attributes": {"tags": "one"}}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["process", "--workflow", "Annotating", "--input", str(source), "--output",
                 "out.jsonl", "--workflows", str(tmp_path / "flows"), "--local"]) == 0, \
        capsys.readouterr().err
    out = {r["id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    one = out["r1"]
    assert one["attributes"] == {"tags": ["only"], "title": "T", "many": ["a", "b"],
                                 "author": [{"name": "N"}], "seen": True}
    assert out["r2"]["attributes"]["tags"] == "one"   # given as a scalar: stays one
    assert one["annotations"] == {
        "": {"nextDestination": [{"values": ["out.q"]}]},
        "tags[-1]": {"source": [{"values": ["feed"], "named": {"weight": 2}}]},
        "author[0]": {"checked": [{"values": ["yes"]}]}}
    # the keys are the paths the blackboard takes: the annotations read back from the store
    from blackboard import Blackboard
    with Blackboard.connect(f"sqlite:///{tmp_path / 'chalk.db'}") as bb:
        bb.load("r1")
        for path, annmap in one["annotations"].items():
            for name, anns in annmap.items():
                assert [a.to_json() for a in bb.get_annotations("r1", path or None, name)] == anns
        bb.invalidate("r1")
