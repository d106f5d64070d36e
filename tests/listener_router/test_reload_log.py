"""A running ``chalk run`` whose workflow file is broken and then fixed says so: after the
error, ``workflow X loaded (version N), replacing the broken one`` — also when the fix
brings back the very version that kept running, so the log's last word is not the error."""

from __future__ import annotations

import re

import pytest
from listener_router_helpers import (
    kill_group,
    start_service,
    wait_for_log,
    write_config,
    write_test_workflows,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_a_fixed_workflow_file_is_logged_as_replacing_the_broken_one(tmp_path, broker_url,
                                                                     qname):
    workflows = write_test_workflows(tmp_path / "workflows")
    config = write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=workflows, engine={"runner": "local"},
        listeners=[{"name": "t", "queue": qname("in"), "workflow": "Counting"}], routers=[])
    log = tmp_path / "service.log"
    counting = workflows / "counting.xml"
    good = counting.read_text()
    service = start_service(config, log)
    try:
        wait_for_log(log, "consuming")
        counting.write_text(good.replace("</process>", "<empty/></process>"))
        wait_for_log(log, "must hold exactly one activity")
        counting.write_text(good)             # the fix: the version that kept running
        wait_for_log(log, "replacing the broken one")
    finally:
        kill_group(service, 15)
        service.wait(timeout=120)
    text = log.read_text(errors="replace")
    version = re.search(r"workflow Counting version (\w+) loaded from ", text).group(1)
    assert f"workflow Counting loaded (version {version}), replacing the broken one" in text
    after_fix = text[text.index("replacing the broken one"):]
    assert "ERROR" not in after_fix and "exactly one activity" not in after_fix
