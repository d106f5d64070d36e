"""The operator's panels as data and HTML, on a fresh SQLite store: the job log's pages and
filters, a record's page, the lanes and subscribers as drawn, the controls' token, and
``chalk status``'s lanes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from lxml import etree
from sqlalchemy import insert
from starlette.applications import Starlette

from blackboard import Annotation
from listener_router import ListenerRule, RouterRule, Settings
from listener_router._control import cancel, lane_rows, set_paused
from listener_router.cli._status import lanes_report
from listener_router.jobs import JobLogTables
from listener_router.journal import Head, SubscriberView
from listener_router.pipeline import LaneView
from listener_router.store import INBOX, ServiceStore
from listener_router.watch._console import JournalView, LaneRow, statistics
from listener_router.watch._controls import control_routes
from listener_router.watch._guard import Throttle
from listener_router.watch._joblog import PAGE, JobQuery, job_page
from listener_router.watch._pages import render
from listener_router.watch._record import record_view


@pytest.fixture
def store(sqlite_url):
    store = ServiceStore.connect(sqlite_url)
    store.tables(JobLogTables)   # the job log's tables, as the service makes them
    yield store
    store.close()


def _settings(url: str, **lane) -> Settings:
    return Settings(blackboard_url=url, listeners=(
        ListenerRule(name="a", queue="q.in", workflow="W", **lane),),
        routers=(RouterRule(queue="q.out"),))


def _commits(store: ServiceStore, n: int, at: float, queue: str = "q.in") -> None:
    """``n`` committed messages logged on their inbox rows, all at one time (one batch)."""
    with store.engine.begin() as conn:
        conn.execute(insert(INBOX), [
            {"queue": queue, "message_id": f"m-{at}-{i:03d}", "status": "committed",
             "processed_at": at, "member": "a", "workflow": "W", "record": f"r-{i}",
             "records": 1, "attempt": 0, "round": 0, "received_at": at - 1, "outgoing": 0}
            for i in range(n)])


def _pages(store: ServiceStore, query: JobQuery) -> list[list[str]]:
    pages = []
    while True:
        page = job_page(store, query)
        pages.append([j.entry.message_id for j in page.jobs])
        if page.older is None:
            return pages
        assert len(page.jobs) == PAGE
        query = replace(query, before=JobQuery.of({"before": page.older}).before)
        back = job_page(store, query).newer
        assert back is not None   # the next page links back


def test_job_log_pages_cover_every_entry_once_even_when_a_batch_shares_a_time(store):
    now = time.time()
    _commits(store, 3, now - 10)
    _commits(store, 40, now - 5)          # one batch: 40 entries of one time
    _commits(store, 4, now - 1)
    pages = _pages(store, JobQuery())
    seen = [m for page in pages for m in page]
    assert len(seen) == 47 and len(set(seen)) == 47
    assert [len(p) for p in pages] == [PAGE, 47 - PAGE]
    # the second page's "newer" leads back to the newest page
    second = job_page(store, JobQuery.of({"before": job_page(store, JobQuery()).older}))
    assert second.newer == ""


def test_job_log_filters_by_state_queue_workflow_and_time(store):
    now = time.time()
    _commits(store, 2, now - 7200)
    _commits(store, 3, now - 60)
    _commits(store, 1, now - 30, queue="q.other")
    with store.engine.begin() as conn:
        JobLogTables.write(conn, [(now - 20, "dead", "q.in", "m-dead", 0, 0, "W", "a", None,
                                   now - 21, "r-9", 1, 0, "it broke")])
    assert len(job_page(store, JobQuery()).jobs) == 7
    assert len(job_page(store, JobQuery(since="1h")).jobs) == 5
    assert [j.entry.state for j in job_page(store, JobQuery(state="dead")).jobs] == ["dead"]
    assert len(job_page(store, JobQuery(queue="q.other")).jobs) == 1
    assert len(job_page(store, JobQuery(workflow="nope")).jobs) == 0
    assert [j.records for j in job_page(store, JobQuery(record="r-9")).jobs] == [("r-9",)]
    # what a browser sends: unknown values are ignored, not trusted
    assert JobQuery.of({"state": "<script>", "since": "99y", "before": "x"}) == JobQuery()


def test_a_records_page_shows_attributes_annotations_attachments_and_history(store):
    bb = store.blackboard("test", 30)
    bb.load("doc")
    bb.set_literal("doc", "title", "Hello <b>")
    bb.set_annotation("doc", "title[-1]", "lang", Annotation(["en"], {"p": 0.5}))
    bb.set_annotation("doc", None, "origin", Annotation(["crawler"]))
    bb.set_attachment("doc", "raw.bin", b"\0" * 3000)
    bb.commit("doc")
    now = time.time()
    with store.engine.begin() as conn:
        conn.execute(insert(INBOX).values(
            queue="q.in", message_id="m1", status="committed", processed_at=now, member="a",
            workflow="W", record="doc", records=1, attempt=0, round=0, received_at=now,
            outgoing=0))
    view = record_view(store, "doc")
    assert view.found and [(a.name, a.values) for a in view.attributes] == [
        ("title", ["Hello <b>"])]
    assert view.attributes[0].annotations == ["lang: en; p=0.5"]
    assert view.annotations == ["origin: crawler"]
    assert view.attachments == [("raw.bin", 3000)]
    assert [(s.entry.state, s.entry.workflow) for s in view.history] == [("committed", "W")]
    html = render("record.html", r=view)
    assert "Hello &lt;b&gt;" in html and "2.9 KB" in html
    missing = record_view(store, "nobody")
    assert not missing.found and missing.history == []


def _lane(**changes) -> LaneRow:
    view = LaneView("q.in", False, 0, None, None, None, None, 0, 100, 3)
    return LaneRow(replace(view, **changes), None, 5, 9)


def test_the_lanes_panel_says_paused_and_held_back():
    html = render("lanes.html", rows=[_lane(), _lane(queue="q.b", backed_up="q.out",
                                                     paused=True, rate_limit=10.0, share=5.0)])
    rows = etree.fromstring(f"<div>{html}</div>", etree.HTMLParser()).findall(".//tr[@data-lane]")
    assert [(r.get("data-lane"), r.get("data-paused")) for r in rows] == [
        ("q.in", "false"), ("q.b", "true")]
    text = etree.tostring(rows[1], method="text", encoding="unicode")
    assert "held back" in text and "q.out" in text and "holds 9 of 5" in text
    assert "here 5.0" in text
    assert rows[0].find(".//form").get("action") == "/lanes/pause"
    assert rows[1].find(".//form").get("action") == "/lanes/resume"


def test_the_journal_panel_shows_lag_blocked_and_errors():
    view = SubscriberView("index", "blocked", 41, 9, 12.5, 2, 3.0, "entry 42 failed", "h1")
    html = render("journal.html", journals=[JournalView("docs", Head(50, 50, 0.0), [view]),
                                            JournalView("other", None, [], "no stream")])
    assert "last offset 50" in html and "BLOCKED" not in html
    assert "blocked: entry 42 failed" in html and "12.5" in html and "no stream" in html


def test_the_statistics_charts_sum_every_members_rows(store, sqlite_url):
    settings = _settings(sqlite_url)
    now = time.time()
    with store.engine.begin() as conn:
        JobLogTables.add_counts(conn, "a", {(now - 120, "q.in", "W", "committed"): 4})
        JobLogTables.add_counts(conn, "b", {(now - 120, "q.in", "W", "committed"): 6,
                                            (now - 60, "q.in", "W", "dead"): 1})
    (row,) = statistics(settings, store, "1h", now)
    assert (row.queue, row.counts["committed"], row.counts["dead"], row.members) == (
        "q.in", 10, 1, 2)
    assert "committed/s" in row.rates and "failed/s" in row.rates


def test_lanes_are_paused_and_cancelled_through_the_store(store, sqlite_url):
    settings = _settings(sqlite_url, max_output_depth=5)
    set_paused(settings, "q.in", True, reason="maintenance", by="me", store=store)
    (row,) = lane_rows(settings, store)
    assert (row["paused"], row["changed_by"], row["reason"]) == (True, "me", "maintenance")
    (lane,) = lanes_report(settings, store, {"q.out": 7})
    assert lane["held_back_by"] == "q.out" and lane["outputs"] == [{"queue": "q.out",
                                                                    "messages": 7}]
    assert lanes_report(settings, store, {"q.out": 5})[0]["held_back_by"] is None
    assert cancel(settings, messages=["m1"], schedule="s", tick="t", store=store) == 2
    assert {c.value for c in store.cancellations.active()} == {"m1", "schedule:s:t:"}


def _watch(store, settings, token):
    return SimpleNamespace(live=SimpleNamespace(settings=settings), store=store, token=token,
                           link=None, throttle=Throttle(free=100), notice_key=b"k" * 16)


def _post(watch, path: str, form: str) -> tuple[int, dict[str, str], str]:
    """POST ``form`` to the controls' application, as a browser would."""
    app = Starlette(routes=control_routes(watch))
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": form.encode(), "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "http_version": "1.1", "method": "POST", "path": path,
                     "raw_path": path.encode(), "query_string": b"", "root_path": "",
                     "scheme": "http", "server": ("test", 80), "client": ("127.0.0.1", 1),
                     "headers": [(b"content-type", b"application/x-www-form-urlencoded"),
                                 (b"content-length", str(len(form)).encode())]},
                    receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body.decode()


@pytest.mark.parametrize("path,form", [
    ("/lanes/pause", "queue=q.in"), ("/lanes/resume", "queue=q.in"),
    ("/cancel", "messages=m1"), ("/uncancel", "kind=message&value=m1"),
    ("/dlq/replay", "target=%5B%22q.in%22%2C%22%22%5D")])
def test_every_control_needs_the_token(store, sqlite_url, path, form):
    settings = _settings(sqlite_url)
    for token, data in ((None, f"{form}&token=x"), ("right", form),
                        ("right", f"{form}&token=wrong"), ("right", f"{form}&token=right-but-longer")):
        status, _headers, _text = _post(_watch(store, settings, token), path, data)
        assert status == 403, (token, data)
    assert store.lanes.all() == {} and store.cancellations.active() == []
    if path != "/dlq/replay":   # replay needs a broker: the dashboard test does it
        status, headers, _text = _post(_watch(store, settings, "right"), path,
                                       f"{form}&token=right")
        assert status == 303 and headers["location"].startswith("/?did=")


def test_a_paused_lane_and_a_wrong_queue_are_told_apart(store, sqlite_url):
    settings = _settings(sqlite_url)
    status, _headers, text = _post(_watch(store, settings, "t"), "/lanes/pause",
                                   "queue=nope&token=t")
    assert status == 400 and "not a queue of the listener rules" in text


def test_chalk_status_names_the_paused_and_held_back_lanes(store, sqlite_url, capsys):
    from listener_router.cli._show import Out
    from listener_router.cli._status import _print_lanes

    settings = _settings(sqlite_url, max_output_depth=5)
    _print_lanes(lanes_report(settings, store, {"q.out": 2}), Out())
    assert "none paused or held back" in capsys.readouterr().out
    set_paused(settings, "q.in", True, reason="maintenance", by="me", store=store)
    _print_lanes(lanes_report(settings, store, {"q.out": 7}), Out())
    out = capsys.readouterr().out
    assert "paused" in out and "by me: maintenance" in out
    assert "held back" in out and "q.out holds 7 message(s), over its max_output_depth 5" in out
