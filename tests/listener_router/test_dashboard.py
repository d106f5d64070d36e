"""The dashboard in a real browser (Debian's chromium, headless, driven by playwright) on a
real ``chalk run --http`` process on RabbitMQ, as an operator uses it: records pushed appear
on the page, a lane held back by its output queue says so, a lane is paused (refused
without the token, done with it) and resumed, a message waiting in the paused lane is
cancelled, a schedule's tick is cancelled and the cancellation withdrawn, the job log is
filtered and paged, a record's page and a dead letter's body are opened, the event stream
shows the commits, and the dead letter is replayed once its workflow is fixed.

Screenshots of each step are saved under the test's tmp dir and, when CHALK_ARTIFACTS is
set, there too; with CHALK_DOCS_SCREENSHOTS=1 the ones the docs show are written into
docs/ (docs/watching.md shows them)."""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import (
    free_port,
    kill_group,
    start_service,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)

from blackboard import Annotation, Blackboard, SqlStore
from listener_router import load_settings, push_records
from listener_router.dead_letters import dead_letters

TOKEN = "operator-token-for-the-test"
DOCS = Path(__file__).resolve().parents[2] / "docs"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


class Shots:
    """Screenshots, numbered in the order taken, in tmp and in $CHALK_ARTIFACTS; those with
    a ``doc`` name also in docs/ when CHALK_DOCS_SCREENSHOTS=1."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.artifacts = os.environ.get("CHALK_ARTIFACTS")
        self.docs = os.environ.get("CHALK_DOCS_SCREENSHOTS") == "1"

    def __call__(self, page: Any, name: str, *, part: str | None = None,
                 doc: str | None = None, full: bool = True, height: int | None = None) -> Path:
        """The page (or the element ``part`` selects, its top ``height`` pixels; ``full``:
        the whole page, not what the window shows) as ``NN-name.png``."""
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        if part is None:
            page.screenshot(path=str(path), full_page=full)
        elif height is None:
            page.locator(part).screenshot(path=str(path))
        else:
            box = page.locator(part).bounding_box()     # in the window, which may be scrolled
            x, y = page.evaluate("() => [window.scrollX, window.scrollY]")
            page.screenshot(path=str(path), full_page=True, clip={
                "x": box["x"] + x, "y": box["y"] + y, "width": box["width"],
                "height": min(box["height"], height)})
        if doc is not None and self.docs:
            shutil.copy(path, DOCS / doc)
        if self.artifacts:
            target = Path(self.artifacts) / "dashboard"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target / path.name)
        return path


@contextmanager
def _served(config: Path, log: Path) -> Iterator[str]:
    """``chalk run --http`` on a free port with ``config``: its base URL while it runs, then
    stopped (SIGTERM, SIGKILL after a minute)."""
    port = free_port()
    service = start_service(config, log, "--http", f"127.0.0.1:{port}")
    try:
        wait_for_log(log, "metrics and dashboard on")
        yield f"http://127.0.0.1:{port}/"
    finally:
        kill_group(service, 15)
        try:
            service.wait(timeout=60)
        except Exception:
            kill_group(service, 9)


def _version(base: str, workflow: str) -> str | None:
    with urllib.request.urlopen(base + "metrics", timeout=30) as response:
        text = response.read().decode()
    match = re.search(r'chalk_workflow_info\{[^}]*version="(\w+)",workflow="%s"' % workflow, text)
    return match.group(1) if match else None


def _shows(page: Any, selector: str, text: str, timeout: float = 120_000) -> None:
    """Wait until the element ``selector`` (refreshed by the page's script) holds ``text``."""
    page.wait_for_function(
        "([sel, text]) => (document.querySelector(sel) || {}).textContent?.includes(text)",
        arg=[selector, text], timeout=timeout)


def _post(url: str, data: str) -> int:
    request = urllib.request.Request(url, method="POST", data=data.encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def _store_a_record_with_an_attachment(url: str) -> None:
    bb = Blackboard(SqlStore(url), own_store=True)
    try:
        bb.load("doc-1")
        bb.set_literal("doc-1", "title", "doc-1")
        bb.set_literal("doc-1", "lang", "en")
        bb.set_annotation("doc-1", "lang[-1]", "detected", Annotation(["en"], {"confidence": 0.9}))
        bb.set_annotation("doc-1", None, "origin", Annotation(["crawler"]))
        bb.set_attachment("doc-1", "page.html", b"<html>" + b"x" * 2042 + b"</html>")
        bb.commit("doc-1")
    finally:
        bb.close()


def test_an_operator_drives_the_dashboard_in_a_browser(tmp_path, chromium, broker, broker_url,
                                                       qname):
    folder = write_test_workflows(tmp_path / "workflows")
    queue, out, held, held_out = qname("in"), qname("out"), qname("held"), qname("held-out")
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    config = write_config(
        tmp_path / "chalk.toml", db=db, broker=broker_url,
        workflows=folder, engine={"runner": "local"}, http={"token": TOKEN},
        node={"name": "dash-1"}, events={"committed": True}, dead_letters={"move_every": 1},
        listeners=[{"name": "t", "queue": queue, "workflow": "Fragile", "max_retries": 0,
                    "batch_size": 50, "max_wait_ms": 100, "priority": 5},
                   {"name": "h", "queue": held, "workflow": "Counting", "batch_size": 1,
                    "max_wait_ms": 50, "max_output_depth": 1, "rate_limit": 100}],
        routers=[{"queue": out, "attributes": ["count"], "workflow": "Fragile"},
                 {"queue": held_out, "workflow": "Counting"}])
    nightly = qname("nightly")
    with open(config, "a") as f:
        f.write(f'\n[[schedule]]\nname = "nightly"\nevery = "1d"\nqueue = "{nightly}"\n'
                'ids = ["doc-1"]\n')
    _store_a_record_with_an_attachment(db)
    shots = Shots(tmp_path / "screenshots")
    with _served(config, tmp_path / "service.log") as base:
        settings = load_settings(config, env={})
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.goto(base)   # the event stream follows from now on
        good = [f"doc-{i}" for i in range(1, 31)]
        push_records(settings, queue, [{"id": rid, "attributes": {"title": rid}}
                                       for rid in good[1:]])
        push_records(settings, queue, [{"id": "doc-1", "attributes": {"title": "doc-1"}}])
        push_records(settings, queue, [{"id": "doc-bad", "attributes": {"fail": True}}])
        push_records(settings, held, [{"id": f"h-{i}", "attributes": {}} for i in range(3)])

        # the panels refresh themselves: the records arrive without reloading the page
        page.wait_for_function(
            "ids => ids.every(id => (document.querySelector('#job-table') || {}).textContent"
            "?.includes(id))", arg=["doc-1", "doc-bad", "h-2"], timeout=120_000)
        _shows(page, "#dead-letter-table", "doc-bad")
        assert "asked to fail" in page.inner_text("#dead-letter-table")
        assert page.inner_text(".leader") == "dash-1"
        assert page.locator("#queue-table tr[data-queue='%s'] svg" % queue).count() == 1
        # its dead-letter and retry queues fold under it, and unfold on a click
        dlq = page.locator("#queue-table tr[data-queue='%s.dlq']" % queue)
        assert dlq.is_hidden()
        page.click("#queue-table button[data-fold='%s']" % queue)
        assert dlq.is_visible()
        assert page.locator(".wf[data-workflow='Fragile'] svg").count() == 1
        # the lane whose output nobody reads is held back by it
        _shows(page, f"#lane-table tr[data-lane='{held}'] .backpressure", "held back")
        assert held_out in page.inner_text(f"#lane-table tr[data-lane='{held}']")
        # the schedule, and the commits on the event stream (kept while the page is open)
        _shows(page, "#schedule-table", "nightly")
        _shows(page, "#event-table", "record.committed")
        # the statistics come from the job log's table (every member, kept across restarts)
        _shows(page, f"#stats-table tr[data-queue='{queue}'] .committed", "30", 60_000)
        assert page.locator(f"#stats-table tr[data-queue='{queue}'] svg").count() == 2
        page.wait_for_function("() => document.querySelector('#batch-table') !== null",
                               timeout=60_000)
        shots(page, "records-lanes-and-a-dead-letter", doc="dashboard.png", full=False)

        # pausing needs the token: refused without it, done with it
        assert _post(base + "lanes/pause", f"queue={queue}&token=wrong") == 403
        lane = f"#lane-table tr[data-lane='{queue}']"
        page.fill("#token", TOKEN)
        page.fill(f"{lane} input[name=reason]", "maintenance")
        page.click(f"{lane} button:has-text('Pause')")
        page.wait_for_selector("#notice")
        assert f"paused {queue}" in page.inner_text("#notice")
        # the store says paused at once; this member obeys within a second
        page.wait_for_selector(f"{lane}[data-paused='true'][data-here='paused']", timeout=30_000)
        _shows(page, f"{lane} .state", "maintenance")
        assert "the dashboard" in page.inner_text(f"{lane} .state")

        # a message waits in the paused lane; it is cancelled before it runs
        broker.publish(queue, b'{"id": "doc-2"}', message_id="cancel-me")
        page.fill("#cancel-form input[name=messages]", "cancel-me")
        page.click("#cancel-form button")
        page.wait_for_selector("#notice")
        assert "cancelled 1" in page.inner_text("#notice")
        _shows(page, "#cancel-table", "cancel-me")
        page.wait_for_selector(f"{lane}[data-here='paused']", timeout=30_000)
        shots(page, "a-paused-lane", part="#lanes", doc="dashboard-lanes.png")
        page.click(f"{lane} button:has-text('Resume')")
        page.wait_for_selector("#notice")
        assert f"resumed {queue}" in page.inner_text("#notice")
        page.wait_for_selector(f"{lane}[data-paused='false'][data-here='running']",
                               timeout=30_000)
        page.wait_for_selector("#job-table tr[data-message='cancel-me'][data-state='cancelled']",
                               timeout=120_000)

        # a schedule's next tick, cancelled and withdrawn
        tick = page.inner_text("#schedule-table tr[data-schedule='nightly'] td:nth-child(6)")
        page.locator("#schedule-table tr[data-schedule='nightly']") \
            .get_by_role("button", name="Cancel the next tick").click()
        page.wait_for_selector("#notice")
        assert f"nightly tick {tick.strip()}" in page.inner_text("#notice")
        _shows(page, "#cancel-table", f"schedule:nightly:{tick.strip()}:")
        page.locator("#cancel-table tr", has_text="schedule:nightly") \
            .get_by_role("button", name="Withdraw").click()
        page.wait_for_selector("#notice")
        assert "withdrew 1" in page.inner_text("#notice")
        assert "schedule:nightly" not in page.inner_text("#cancel")

        # the job log, filtered and paged: 30 committed in pages of 25
        page.select_option("#job-search select[name=state]", "committed")
        page.select_option("#job-search select[name=queue]", queue)
        page.select_option("#job-search select[name=since]", "1h")
        page.click("#job-search button")
        page.wait_for_url(re.compile(r".*state=committed.*"))
        states = page.locator("#job-table tr[data-state]")
        assert states.count() == 25
        assert {states.nth(i).get_attribute("data-state") for i in range(25)} == {"committed"}
        shots(page, "job-log-filtered", part="#jobs", doc="dashboard-jobs.png", height=330)
        page.click("#jobs a#older")
        page.wait_for_url(re.compile(r".*before=.*"))
        assert page.locator("#job-table tr[data-state]").count() == 5
        assert page.locator("#jobs a[rel=first]").count() == 1
        page.fill("#job-search input[name=record]", "doc-3")
        page.select_option("#job-search select[name=state]", "")
        page.click("#job-search button")
        page.wait_for_url(re.compile(r".*record=doc-3.*"))
        rows = page.locator("#job-table tr").all_inner_texts()[1:]
        assert len(rows) == 1 and "doc-3" in rows[0]

        # a record's page: what is stored of it and its history
        page.goto(base + "?record=doc-1#jobs")
        page.locator("#job-table a", has_text="doc-1").first.click()
        page.wait_for_selector("#record-id")
        assert page.inner_text("#record-id") == "doc-1"
        attributes = page.inner_text("#attributes")
        assert "title" in attributes and "detected: en; confidence=0.9" in attributes
        assert "origin: crawler" in page.inner_text("#annotations")
        assert "page.html" in page.inner_text("#attachments")
        assert "2.0 KB" in page.inner_text("#attachments")
        history = page.inner_text("#history")
        assert "committed" in history and "Fragile" in history
        shots(page, "a-record", doc="dashboard-record.png")

        # a dead letter's body, a click away
        page.goto(base + "#dead-letters")
        page.locator("#dead-letter-table tr", has_text="doc-bad").locator("a").first.click()
        page.wait_for_selector("#letter-body")
        assert "doc-bad" in page.inner_text("#letter-body")
        assert "asked to fail" in page.inner_text("#letter-error")
        shots(page, "a-dead-letter", doc="dashboard-dead-letter.png")

        # the cause is fixed: the workflow no longer fails flagged records
        old = _version(base, "Fragile")
        fragile = folder / "fragile.xml"
        fragile.write_text(re.sub(r"\s*<proc:invokePipelet name=\"s1\">.*?</proc:invokePipelet>",
                                  "", fragile.read_text(), flags=re.S))
        wait_until(lambda: _version(base, "Fragile") not in (None, old), 120,
                   "the fixed workflow to load", every=0.3)

        page.goto(base)
        page.fill("#token", "not-the-token")
        page.locator("#dead-letter-table tr", has_text="doc-bad") \
            .get_by_role("button", name="Replay").click()
        page.wait_for_selector("#refused")
        assert "wrong token" in page.inner_text("#refused")
        # still kept (the page moved it off Q.dlq into the store: looking redelivers nothing)
        assert [d.message_id for d in dead_letters(settings, [queue])] != []

        page.goto(base)
        page.fill("#token", TOKEN)
        page.locator("#dead-letter-table tr", has_text="doc-bad") \
            .get_by_role("button", name="Replay").click()
        page.wait_for_selector("#notice")
        assert "replayed 1 dead letter(s)" in page.inner_text("#notice")
        page.wait_for_function(
            "() => document.querySelector('#dead-letter-table') === null", timeout=120_000)
        _shows(page, "#job-table", "doc-bad")

        # nothing the page asked for came from anywhere but the service
        assert requested and all(url.startswith(base) for url in requested), requested
    assert sorted(p.name for p in shots.folder.iterdir()) == [
        "01-records-lanes-and-a-dead-letter.png", "02-a-paused-lane.png",
        "03-job-log-filtered.png", "04-a-record.png", "05-a-dead-letter.png"]


# Any element of the page whose right edge is past the window's (or the page scrolling
# sideways), with what it is, for the failure message.
_OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  if (document.documentElement.scrollWidth > width) {
    out.push('the page scrolls sideways: ' + document.documentElement.scrollWidth + ' > ' + width);
  }
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    if (box.width && box.right > width + 1 && !el.closest('[hidden]')) {
      let inside = el.parentElement, clipped = false;
      while (inside && inside !== document.body) {   // cut by a box that scrolls: not out
        const style = getComputedStyle(inside);
        if (['auto', 'scroll', 'hidden'].includes(style.overflowX)
            && inside.getBoundingClientRect().right <= width + 1) { clipped = true; break; }
        inside = inside.parentElement;
      }
      if (!clipped) {
        out.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
                 (el.className && el.className.baseVal === undefined ? '.' + el.className : '') +
                 ' right ' + Math.round(box.right));
      }
    }
  }
  return out.slice(0, 20);
}"""


def test_the_page_fits_1280_and_1920_pixels_and_cancels_only_messages_still_to_come(
        tmp_path, chromium, broker_url, qname, monkeypatch):
    from listener_router.cli import main

    folder = write_test_workflows(tmp_path / "workflows")
    queue, waiting, out = qname("in"), qname("waiting"), qname("out")
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    config = write_config(
        tmp_path / "chalk.toml", db=db, broker=broker_url, workflows=folder,
        engine={"runner": "local"}, http={"token": TOKEN}, node={"name": "fit-1"},
        events={"committed": True},
        listeners=[{"name": "t", "queue": queue, "workflow": "Fragile", "max_retries": 1,
                    "backoff_ms": [50], "max_wait_ms": 50},
                   {"name": "w", "queue": waiting, "workflow": "Fragile", "max_retries": 2,
                    "backoff_ms": [600_000], "max_wait_ms": 50}],
        routers=[{"queue": out, "attributes": ["count"]}])
    # a chalk process run: its statistics row is (process)
    monkeypatch.chdir(tmp_path)
    records = tmp_path / "in.jsonl"
    records.write_text('{"id": "p1", "attributes": {}}\n'
                       '{"id": "p2", "attributes": {"fail": true}}\n')
    assert main(["process", "--workflow", "Fragile", "--input", str(records), "--local",
                 "--config", str(config)]) == 1
    shots = Shots(tmp_path / "screenshots")
    with _served(config, tmp_path / "service.log") as base:
        settings = load_settings(config, env={})
        push_records(settings, queue, [{"id": f"doc-{i}", "attributes": {"title": "t" * 40}}
                                       for i in range(20)])
        push_records(settings, queue, [{"id": "died", "attributes": {"fail": True}}])
        push_records(settings, waiting, [{"id": "waits", "attributes": {"fail": True}}])
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base)
        page.wait_for_selector("#job-table tr[data-message][data-state='dead']", timeout=120_000)
        page.wait_for_function(
            "() => document.querySelectorAll(\"#job-table tr[data-state='retrying']\").length >= 2",
            timeout=120_000)
        _shows(page, "#stats-table", "(process)", 60_000)

        # a Cancel button only where the message is still to come
        retrying = page.locator("#job-table tr[data-state='retrying']")
        buttons = {retrying.nth(i).locator("td").nth(7).inner_text().strip():
                   retrying.nth(i).locator("button", has_text="Cancel").count()
                   for i in range(retrying.count())}
        assert buttons == {"died": 0, "waits": 1}

        # the (process) row: the run's records, failed (not dead), no latency shown as "/"
        row = page.locator("#stats-table tr[data-queue='(process)']")
        assert row.locator(".committed").inner_text() == "1"
        assert row.locator(".dead").inner_text() == "1 failed"
        assert row.locator(".records").inner_text() == "1"
        assert row.locator(".latency").inner_text().strip() not in ("/", "", " / ")

        for width in (1280, 1920):
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(base)
            page.wait_for_selector("#stats-table svg", timeout=60_000)
            page.wait_for_selector("#job-table", timeout=60_000)
            shots(page, f"the-page-at-{width}")
            overflowing = page.evaluate(_OVERFLOW)
            assert overflowing == [], f"at {width} px: " + "; ".join(overflowing)
    assert sorted(p.name for p in shots.folder.iterdir()) == [
        "01-the-page-at-1280.png", "02-the-page-at-1920.png"]
