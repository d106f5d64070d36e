"""The SMILA alias table, checked against real SMILA workflow files."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from pipelets import Pipelet, PipeletConfigurationError
from pipelets.aliases import SMILA_ALIASES

SMILA_DIR = Path(__file__).resolve().parents[3] / "shared" / "smila-workflows"
PROC = "{http://www.eclipse.org/smila/processor}"


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _value(el: Any) -> Any:
    local = etree.QName(el).localname
    if local == "Seq":
        return [_value(c) for c in el if isinstance(c.tag, str)]
    if local == "Map":
        return {c.get("key"): _value(c) for c in el if isinstance(c.tag, str)}
    text = "".join(el.itertext()).strip()
    if (el.get("type") or "").lower() == "boolean":
        return text.lower() == "true"
    return text


def _config(configuration: Any) -> dict[str, Any]:
    """A ``proc:configuration`` as the engine hands it over (str / list / dict)."""
    config: dict[str, Any] = {}
    for item in configuration:
        if not isinstance(item.tag, str):
            continue
        if etree.QName(item).localname == "Property":   # the old proc:Property/Value form
            vals = [v.text.strip() for v in item if isinstance(v.tag, str)]
            config[item.get("name")] = vals[0] if len(vals) == 1 else vals
        else:
            config[item.get("key") or item.get("name")] = _value(item)
    return config


def _aliased_invocations() -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path in sorted(SMILA_DIR.rglob("*.bpel")):
        tree = etree.parse(str(path), etree.XMLParser(resolve_entities=False, no_network=True))
        for invoke in tree.iter(f"{PROC}invokePipelet"):
            cls = invoke.find(f"{PROC}pipelet").get("class")
            if cls in SMILA_ALIASES:
                configuration = invoke.find(f"{PROC}configuration")
                config = _config(configuration) if configuration is not None else {}
                found.append((f"{path.relative_to(SMILA_DIR)}:{invoke.sourceline}", cls, config))
    return found


INVOCATIONS = _aliased_invocations() if SMILA_DIR.is_dir() else []
# one case per aliased invocation; without the files, one case that says so
CASES = [pytest.param(*i, id=i[0]) for i in INVOCATIONS] or [
    pytest.param(None, None, None, id="no-smila-files",
                 marks=pytest.mark.skip(reason="SMILA workflow files not present"))]


@pytest.mark.parametrize("java, target", sorted(SMILA_ALIASES.items()))
def test_every_alias_names_a_pipelet_class(java, target):
    assert java.startswith("org.eclipse.smila.")
    assert issubclass(_resolve(target), Pipelet)


@pytest.mark.skipif(not SMILA_DIR.is_dir(), reason="SMILA workflow files not present")
def test_the_smila_files_use_the_aliased_pipelets():
    used = {cls for _, cls, _ in INVOCATIONS}
    assert len(INVOCATIONS) >= 20
    assert {"org.eclipse.smila.processing.pipelets.HtmlToTextPipelet",
            "org.eclipse.smila.processing.pipelets.MimeTypeIdentifyPipelet",
            "org.eclipse.smila.processing.pipelets.AddValuesPipelet",
            "org.eclipse.smila.processing.pipelets.xmlprocessing.XPathExtractorPipelet"} <= used


@pytest.mark.parametrize("where, java, config", CASES)
def test_real_smila_configurations_are_accepted(where, java, config, tmp_path):
    pipelet = _resolve(SMILA_ALIASES[java])()
    if config.get("inputType", "").lower() == "attribute" and java.endswith("XmlSplitterPipelet"):
        # a splitter reading the path a message names needs the folder those files are in
        with pytest.raises(PipeletConfigurationError, match="baseDirectory"):
            pipelet.configure(config)
        config = {**config, "baseDirectory": str(tmp_path)}
    pipelet.configure(config)


@pytest.mark.skipif(not SMILA_DIR.is_dir(), reason="SMILA workflow files not present")
def test_the_smila_addpipeline_pipelets_run_with_their_own_configuration(bb):
    configs = {cls: config for where, cls, config in INVOCATIONS
               if where.startswith("SMILA.application/addpipeline.bpel")}
    mime = _resolve(SMILA_ALIASES["org.eclipse.smila.processing.pipelets.MimeTypeIdentifyPipelet"])()
    mime.configure(configs["org.eclipse.smila.processing.pipelets.MimeTypeIdentifyPipelet"])
    html = _resolve(SMILA_ALIASES["org.eclipse.smila.processing.pipelets.HtmlToTextPipelet"])()
    html.configure(configs["org.eclipse.smila.processing.pipelets.HtmlToTextPipelet"])
    bb.create("file:/docs/a.html")
    bb.set_literal("file:/docs/a.html", "Extension", "html")
    bb.set_attachment("file:/docs/a.html", "Content",
                      b"<html><head><title>Hi</title></head><body><p>Text</p></body></html>")
    ids = ["file:/docs/a.html"]
    assert html.process(bb, mime.process(bb, ids)) == ids
    assert bb.get_attributes(ids[0]) == {"Extension": "html", "MimeType": "text/html",
                                         "Content": "Text", "Title": "Hi"}
