"""Operator tools that bad input cannot break, on a real ``chalk run`` (RabbitMQ, PostgreSQL)
and in a real browser: a body of 200,000 nested ``[`` and a 5 MB body are dead-lettered
beside ordinary ones; the dead-letters panel lists every letter (the bad ones say why their
records cannot be read), a letter's page shows the first 64 KB of a body with its size and
a download behind the token, Replay works, ``chalk dlq show`` exits 0, malformed or
ambiguous queries answer 400, and looking at the page opens no database engine and no
broker connection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _services import RABBITMQCTL, _ctl_env
from listener_router_helpers import (
    free_port,
    start_service,
    stop_service,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.postgres]

TOKEN = "a-token-for-the-dead-letter-test"
NESTED = b"[" * 200_000
HUGE = json.dumps({"id": "huge", "attributes": {"text": "x" * (5 << 20)}}).encode()


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=60) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def _connections_made() -> int:
    """Connections the broker has accepted since it started (its churn counter)."""
    done = subprocess.run([RABBITMQCTL, "eval", "ets:tab2list(connection_churn_metrics)."],
                          capture_output=True, text=True, timeout=60, env=_ctl_env())
    return int(done.stdout.split(",")[1])


def _sessions(url: str) -> int:
    """Sessions PostgreSQL has opened to the database at ``url`` (a cumulative counter)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT sessions FROM pg_stat_database "
                                         "WHERE datname = current_database()")).scalar_one())
    finally:
        engine.dispose()


def _documents(out: str) -> list[dict]:
    """``--json`` output: one document (a list), or one document a line."""
    try:
        found = json.loads(out)
    except ValueError:
        return [json.loads(line) for line in out.splitlines() if line.strip()]
    return found if isinstance(found, list) else [found]


def _chalk(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "listener_router", *args, "--config",
                           str(config)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="200"))


def test_bad_dead_letters_leave_the_tools_working(tmp_path, chromium, broker, broker_url,
                                                  pg_url, qname):
    folder = write_test_workflows(tmp_path / "workflows")
    queue, out = qname("in"), qname("out")
    port = free_port()
    config = write_config(
        tmp_path / "chalk.toml", db=pg_url, broker=broker_url, workflows=folder,
        engine={"runner": "local"}, http={"listen": f"127.0.0.1:{port}", "token": TOKEN},
        node={"name": "dlq-1"}, dead_letters={"move_every": 1},
        listeners=[{"name": "t", "queue": queue, "workflow": "Fragile", "max_retries": 0,
                    "batch_size": 20, "max_wait_ms": 50}],
        routers=[{"queue": out, "attributes": ["count"]}])
    log = tmp_path / "service.log"
    base = f"http://127.0.0.1:{port}/"
    service = start_service(config, log)
    try:
        wait_for_log(log, "metrics and dashboard on")
        broker.publish(queue, NESTED, message_id="nested-1")
        broker.publish(queue, HUGE, message_id="huge-1")
        for n in (1, 2):
            broker.publish(queue, json.dumps({"id": f"doc-amb-{n}",
                                              "attributes": {"fail": True}}),
                           message_id=f"amb-{n}")
        # what held before: text from a message is escaped wherever the page shows it
        broker.publish(queue, json.dumps({"id": "<img src=x onerror=alert(1)>",
                                          "attributes": {"fail": True}}),
                       message_id="<b>bold</b>")

        # every letter is listed; the two that cannot be read say why, in their own row
        ids = ("nested-1", "huge-1", "amb-1", "amb-2")
        panel = wait_until(lambda: (lambda p: p if all(i in p for i in ids) else None)(
            _get(base + "panel/dead_letters")[1]), 120, "the four dead letters on the panel",
            explain=lambda: _get(base + "panel/dead_letters")[1][-2000:])
        assert "dead letters unavailable" not in panel
        wait_until(lambda: "&lt;b&gt;bold&lt;/b&gt;" in _get(base + "panel/dead_letters")[1],
                   60, "the HTML-named letter, escaped")
        panel = _get(base + "panel/dead_letters")[1]
        assert "&lt;img src=x onerror=alert(1)&gt;" in panel and "<img" not in panel
        assert "<b>bold" not in panel
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "#dead-letters")
        rows = "#dead-letter-table tr[data-message='{}']"
        assert "unreadable body (" in page.inner_text(rows.format("nested-1"))
        assert "body of 5,2" in page.inner_text(rows.format("huge-1"))
        assert "records are not read here" in page.inner_text(rows.format("huge-1"))
        assert "doc-amb-1" in page.inner_text(rows.format("amb-1"))

        # a 5 MB letter's page: its first 64 KB, its size, the whole body a download away
        page.locator(rows.format("huge-1")).locator("a").first.click()
        page.wait_for_selector("#letter-body")
        assert "5.0 MB: the first 64.0 KB shown" in page.inner_text("#letter-size")
        assert len(page.content()) < 200_000
        page.click("#letter-download")        # no token typed: refused, and it says so
        page.wait_for_function("() => document.querySelector('#download-note').textContent")
        assert "token" in page.inner_text("#download-note")
        page.fill("#token", TOKEN)
        with page.expect_download() as download:
            page.click("#letter-download")
        assert Path(download.value.path()).read_bytes() == HUGE
        assert _get(base + f"dead-letter/body?queue={queue}&message=huge-1")[0] == 401
        assert _get(base + f"dead-letter/body?queue={queue}&message=huge-1", "wrong" * 4)[0] \
            == 401

        # the nested one's page says why its body is not shown as JSON
        page.goto(base + "#dead-letters")
        page.locator(rows.format("nested-1")).locator("a").first.click()
        page.wait_for_selector("#letter-body-note")
        assert "unreadable body" in page.inner_text("#letter-body-note")

        # malformed or ambiguous questions are answered 400 with the reason, never 500
        for query, words in [(f"queue={queue}&message=", "say which dead letter"),
                             ("message=amb-1", "say which dead letter"),
                             (f"queue={queue}&queue=other&message=amb-1", "more than once"),
                             (f"queue={queue}&message=amb", "amb-1"),
                             ("queue=nope&message=amb-1", "not an input queue")]:
            status, body = _get(base + "dead-letter?" + query)
            assert (status, words in body) == (400, True), (query, status, body[:300])
        assert _get(base + "panel/jobs?state=dead&state=committed")[0] == 400
        for path in ("", "panel/jobs", "panel/stats", "record/x", "dead-letter",
                     "dead-letter/body"):
            for junk in ("?%ff%fe=%00", "?before=nan_x&since=-1&stats=%00", "?a=1&a=2",
                         "?queue=" + "q" * 5000):
                assert _get(base + path + junk, TOKEN)[0] < 500, (path, junk)

        # looking opens no database engine and no broker connection (the leader moves
        # dead letters on its timer; the pages read the service's store)
        made, sessions = _connections_made(), _sessions(pg_url)
        for _ in range(10):
            for path in ("", "panel/dead_letters", f"dead-letter?queue={queue}&message=amb-1"):
                assert _get(base + path)[0] == 200
        assert _connections_made() - made <= 1
        assert _sessions(pg_url) - sessions <= 2    # the counter's own two reads

        # Replay still works beside the bad letters
        page.goto(base)
        page.fill("#token", TOKEN)
        page.locator(rows.format("amb-1")).get_by_role("button", name="Replay").click()
        page.wait_for_selector("#notice")
        assert "replayed 1 dead letter(s)" in page.inner_text("#notice")

        # chalk dlq show prints each letter, the unreadable one with its reason, and exits 0
        done = _chalk(config, "dlq", "show", "nested-1")
        assert done.returncode == 0, done.stderr
        assert "unreadable body" in done.stdout
        done = _chalk(config, "dlq", "show", "--json")
        assert done.returncode == 0, done.stderr
        shown = {d["message_id"]: d for d in _documents(done.stdout)}
        assert {"nested-1", "huge-1", "amb-2"} <= set(shown)
        assert shown["nested-1"]["body_error"].startswith("unreadable body")
        assert shown["amb-2"]["body"] == {"id": "doc-amb-2", "attributes": {"fail": True}}
    finally:
        stop_service(service)
