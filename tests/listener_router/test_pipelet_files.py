"""Pipelets that read files, in a real ``chalk run`` on RabbitMQ: a message can no longer make
``XmlSplit`` read a file outside its ``baseDirectory`` (a private file's content used to end
up in a routed record), and a stylesheet that includes a local file is refused when its
workflow is validated or loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from listener_router_helpers import (
    start_service,
    stop_service,
    wait_for_log,
    wait_until,
    write_config,
)

from listener_router import load_settings, push_records
from listener_router.broker import dlq_name

pytestmark = [pytest.mark.slow]

SPLIT = """<?xml version="1.0"?>
<process name="Splitting" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="split">
      <proc:pipelet class="pipelets.XmlSplit"/>
      <proc:configuration>
        <proc:param name="beginTagName">page</proc:param>
        <proc:param name="endTagName">page</proc:param>
        <proc:param name="keyTagName">title</proc:param>
        <proc:param name="inputType">attribute</proc:param>
        <proc:param name="inputName">Path</proc:param>
        <proc:param name="baseDirectory">{base}</proc:param>
      </proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""

INCLUDING = """<?xml version="1.0"?>
<process name="Including" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="transform">
      <proc:pipelet class="pipelets.XsltTransform"/>
      <proc:configuration>
        <proc:param name="stylesheet"><![CDATA[<xsl:stylesheet version="1.0"
            xmlns:xsl="http://www.w3.org/1999/XSL/Transform"><xsl:include href="{secret}"/>
          </xsl:stylesheet>]]></proc:param>
      </proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""


def test_a_message_cannot_make_xml_split_read_a_file_outside_its_folder(tmp_path, broker,
                                                                       broker_url, qname):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "dump.xml").write_text("<w><page><title>Alpha</title><text>a</text></page></w>")
    private = tmp_path / "private.xml"
    private.write_text("<w><page><title>SECRET</title><text>the private key</text></page></w>")
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "split.xml").write_text(SPLIT.format(base=dumps))
    queue, out = qname("in"), qname("out")
    config = write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=folder, engine={"runner": "local"},
        listeners=[{"name": "s", "queue": queue, "workflow": "Splitting", "max_retries": 0,
                    "batch_size": 10, "max_wait_ms": 50}],
        routers=[{"queue": out, "attributes": ["Content"]}])
    log = tmp_path / "service.log"
    service = start_service(config, log)
    try:
        wait_for_log(log, "service")
        settings = load_settings(config, env={})
        push_records(settings, queue, [{"id": "fine", "attributes": {"Path": "dump.xml"}}])
        for rid, path in (("steal", str(private)), ("climb", "../private.xml"),
                          ("environ", "/proc/self/environ")):
            push_records(settings, queue, [{"id": rid, "attributes": {"Path": path}}])
        wait_until(lambda: broker.depth(dlq_name(queue)) >= 3 and broker.depth(out) >= 1, 120,
                   "three dead letters and the fine record routed",
                   explain=lambda: log.read_text()[-3000:])
    finally:
        stop_service(service)
    routed = [json.loads(body) for _props, body in broker.drain(out)]
    assert sorted(r["id"] for m in routed for r in m["records"]) == ["fine", "fine#Alpha"]
    assert "SECRET" not in json.dumps(routed) and "private key" not in json.dumps(routed)
    reasons = {props.message_id: props.headers["x-chalk-error"]
               for props, _body in broker.drain(dlq_name(queue))}
    assert len(reasons) == 3
    assert all("outside baseDirectory" in reason for reason in reasons.values()), reasons


def test_a_stylesheet_that_includes_a_local_file_is_refused(tmp_path):
    secret = tmp_path / "secret.xsl"
    secret.write_text('<xsl:stylesheet version="1.0" '
                      'xmlns:xsl="http://www.w3.org/1999/XSL/Transform"/>')
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "including.xml").write_text(INCLUDING.format(secret=secret))
    done = subprocess.run([sys.executable, "-m", "listener_router", "validate", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "including.xml:5:" in done.stdout + done.stderr
    assert "<xsl:include" in done.stdout + done.stderr and "may not read files" in \
        done.stdout + done.stderr
