"""The dashboard in a real browser (Debian's chromium, headless, driven by playwright) on a
real ``chalk run --http`` process on RabbitMQ: records pushed appear on the page, a record
that fails is dead-lettered, its workflow is fixed, and the dead letter is replayed from
the page — refused without the token, done with it.  Screenshots of each step are saved
under the test's tmp dir and, when CHALK_ARTIFACTS is set, there too."""

from __future__ import annotations

import os
import re
import shutil
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import (
    kill_group,
    start_service,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)

from listener_router import load_settings, push_records
from listener_router.dead_letters import dead_letters

CHROMIUM = "/usr/bin/chromium"
# What works on this machine as root: without the background-networking flags the
# browser's own connections are refused many at a time.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
TOKEN = "replay-token-for-the-test"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _unavailable(message: str) -> None:
    if os.environ.get("CHALK_TEST_REQUIRE_SERVICES") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Headless chromium through playwright (a new empty profile; never a downloaded browser)."""
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} is missing (scripts/install.sh installs Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        _unavailable(f"playwright is not installed (pip install -e '.[dev]'): {e}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Shots:
    """Screenshots, numbered in the order taken, in tmp and in $CHALK_ARTIFACTS."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.artifacts = os.environ.get("CHALK_ARTIFACTS")

    def __call__(self, page: Any, name: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        if self.artifacts:
            target = Path(self.artifacts) / "dashboard"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target / path.name)
        return path


def _version(base: str, workflow: str) -> str | None:
    with urllib.request.urlopen(base + "metrics", timeout=30) as response:
        text = response.read().decode()
    match = re.search(r'chalk_workflow_info\{[^}]*version="(\w+)",workflow="%s"' % workflow, text)
    return match.group(1) if match else None


def test_the_dashboard_shows_records_and_replays_a_dead_letter_in_a_browser(
        tmp_path, chromium, broker_url, qname):
    folder = write_test_workflows(tmp_path / "workflows")
    queue, out = qname("in"), qname("out")
    port = _free_port()
    config = write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=folder, engine={"runner": "local"}, http={"token": TOKEN},
        node={"name": "dash-1"},
        listeners=[{"name": "t", "queue": queue, "workflow": "Fragile", "max_retries": 0,
                    "batch_size": 50, "max_wait_ms": 100}],
        routers=[{"queue": out, "attributes": ["count"]}])
    log = tmp_path / "service.log"
    service = start_service(config, log, "--http", f"127.0.0.1:{port}")
    shots = Shots(tmp_path / "screenshots")
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_for_log(log, "metrics and dashboard on")
        settings = load_settings(config, env={})
        good = [f"doc-{i}" for i in range(1, 6)]
        push_records(settings, queue, [{"id": rid, "attributes": {"title": rid}} for rid in good])
        push_records(settings, queue, [{"id": "doc-bad", "attributes": {"fail": True}}])

        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.goto(base)
        # the panels refresh themselves: the records arrive without reloading the page
        page.wait_for_function(
            "ids => ids.every(id => (document.querySelector('#job-table') || {}).textContent"
            "?.includes(id))", arg=good, timeout=120_000)
        page.wait_for_function(
            "() => (document.querySelector('#dead-letter-table') || {}).textContent"
            "?.includes('doc-bad')", timeout=120_000)
        assert "asked to fail" in page.inner_text("#dead-letter-table")
        assert page.inner_text(".leader") == "dash-1"
        assert page.locator("#queue-table tr[data-queue='%s'] svg" % queue).count() == 1
        # its dead-letter and retry queues fold under it, and unfold on a click
        dlq = page.locator("#queue-table tr[data-queue='%s.dlq']" % queue)
        assert dlq.is_hidden()
        page.click("#queue-table button[data-fold='%s']" % queue)
        assert dlq.is_visible()
        assert page.locator(".wf[data-workflow='Fragile'] svg").count() == 1
        page.wait_for_function("() => document.querySelector('#batch-table') !== null",
                               timeout=60_000)
        shots(page, "records-and-a-dead-letter")

        page.fill("input[name=record]", "doc-3")
        page.click("#job-search button")
        page.wait_for_url(re.compile(r".*record=doc-3.*"))
        rows = page.locator("#job-table tr").all_inner_texts()[1:]
        assert len(rows) == 1 and "doc-3" in rows[0]
        shots(page, "job-log-search")

        # the cause is fixed: the workflow no longer fails flagged records
        old = _version(base, "Fragile")
        fragile = folder / "fragile.xml"
        fragile.write_text(re.sub(r"\s*<proc:invokePipelet name=\"s1\">.*?</proc:invokePipelet>",
                                  "", fragile.read_text(), flags=re.S))
        wait_until(lambda: _version(base, "Fragile") not in (None, old), 120, "the fixed workflow to load",
                   every=0.3)

        page.goto(base)
        row = page.locator("#dead-letter-table tr", has_text="doc-bad")
        page.fill("input[name=token]", "not-the-token")
        row.get_by_role("button", name="Replay").click()
        page.wait_for_selector("#refused")
        assert "wrong token" in page.inner_text("#refused")
        shots(page, "replay-refused")
        # still kept (the page moved it off Q.dlq into the store: looking redelivers nothing)
        assert [d.message_id for d in dead_letters(settings, [queue])] != []

        page.goto(base)
        page.fill("input[name=token]", TOKEN)
        page.locator("#dead-letter-table tr", has_text="doc-bad") \
            .get_by_role("button", name="Replay").click()
        page.wait_for_selector("#notice")
        assert "replayed 1 dead letter(s)" in page.inner_text("#notice")
        page.wait_for_function(
            "() => (document.querySelector('#job-table') || {}).textContent?.includes('doc-bad')",
            timeout=120_000)
        page.wait_for_function(
            "() => document.querySelector('#dead-letter-table') === null", timeout=120_000)
        shots(page, "after-replay")

        # nothing the page asked for came from anywhere but the service
        assert requested and all(url.startswith(base) for url in requested), requested
    finally:
        kill_group(service, 15)
        try:
            service.wait(timeout=60)
        except Exception:
            kill_group(service, 9)
    assert sorted(p.name for p in shots.folder.iterdir()) == [
        "01-records-and-a-dead-letter.png", "02-job-log-search.png", "03-replay-refused.png",
        "04-after-replay.png"]
