"""Metrics and the data behind the dashboard: a real service on Spark and RabbitMQ, scraped
over HTTP; the metrics table and the drawings as pure functions."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from listener_router_helpers import write_test_workflows
from lxml import etree

import engine
from listener_router import BatchReport, ConfigError, Service, load_settings, push_records
from listener_router.dead_letters import dead_letters
from listener_router.watch import METRICS, Live, Metrics, layered_svg
from listener_router.watch._history import History
from listener_router.watch._joblog import JobQuery, job_page
from listener_router.watch._pages import render
from listener_router.watch._panels import QueueRow

REPO = Path(__file__).resolve().parents[2]
TOKEN = "a-token-for-the-watch-test"


def _value(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus' text format (None: absent)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def _live(**changes):
    values = dict(is_leader=lambda: True, members=lambda: 2,
                  workflows=lambda: [("Demo", "abc123", "workflows/demo.xml")],
                  workflow_errors=lambda: 1, batch_size=lambda: 500, in_flight=lambda: 7,
                  sample=lambda: None, last_batch=lambda: 1234.5)
    values.update(changes)
    return Live(**values)


def test_a_batch_report_becomes_counters_and_histograms():
    metrics = Metrics(_live())
    report = BatchReport(messages=6, size_limit=500)
    report.outcome.update({("in", "committed"): 3, ("in", "retrying"): 1, ("in", "dead"): 1,
                           ("in", "deferred"): 1})
    report.count_records("Demo", "committed", 3)
    report.count_records("Demo", "invalidated", 2)
    report.count_sent(["out", "out", "amq.direct/k"])
    report.add_seconds("stage", 0.02)
    report.add_seconds("run", 0.3)
    report.add_run("Demo", "spark", 0.3)
    report.add_run("Demo", "local", 0.01)
    metrics.batch_finished(report)
    text = metrics.exposition().decode()
    assert _value(text, "chalk_messages_in_total", queue="in") == 5  # deferred comes again
    assert _value(text, "chalk_messages_retried_total", queue="in") == 1
    assert _value(text, "chalk_messages_dead_lettered_total", queue="in") == 1
    assert _value(text, "chalk_messages_total", queue="in", state="deferred") == 1
    assert _value(text, "chalk_messages_out_total", queue="out") == 2
    assert _value(text, "chalk_messages_out_total", queue="amq.direct/k") == 1
    assert _value(text, "chalk_records_committed_total", workflow="Demo") == 3
    assert _value(text, "chalk_records_invalidated_total", workflow="Demo") == 2
    assert _value(text, "chalk_batch_messages_sum") == 6
    assert _value(text, "chalk_stage_seconds_count", stage="gather") == 1
    assert _value(text, "chalk_stage_seconds_sum", stage="run") == pytest.approx(0.3)
    assert _value(text, "chalk_spark_job_seconds_count", workflow="Demo") == 1
    assert _value(text, "chalk_local_run_seconds_count", workflow="Demo") == 1
    assert _value(text, "chalk_leader") == 1
    assert _value(text, "chalk_cluster_members") == 2
    assert _value(text, "chalk_workflow_info", workflow="Demo", version="abc123") == 1
    assert _value(text, "chalk_workflow_errors") == 1
    assert _value(text, "chalk_batch_size_limit") == 500
    assert _value(text, "chalk_in_flight") == 7
    assert _value(text, "chalk_queue_depth") is None  # nothing sampled yet: nothing claimed


def test_events_are_not_counted_as_routed_messages_on_the_page_or_in_the_metrics():
    # 3 records committed and routed to "out", with their 3 record.committed events; one
    # message retried, one dead: their copies, and 2 failure events published with them
    report = BatchReport(messages=5, size_limit=497)
    report.outcome.update({("in", "committed"): 3, ("in", "retrying"): 1, ("in", "dead"): 1})
    report.count_sent(["out"] * 3 + ["chalk.events/record.committed.Demo"] * 3)
    report.published = 6 + 2 + 2
    metrics = Metrics(_live(), side_exchanges={"chalk.events"})
    metrics.batch_finished(report)
    text = metrics.exposition().decode()
    assert _value(text, "chalk_messages_out_total", queue="out") == 3
    assert "chalk.events/record.committed.Demo" not in text
    assert _value(text, "chalk_events_published_total") == 5

    history = History(side_exchanges={"chalk.events"})
    history.batch_finished(report)
    (batch,) = history.batches()
    assert (batch.routed, batch.published.events, batch.published.copies) == (3, 5, 2)
    assert history.totals()[1] == {"out": 3}
    html = render("batches.html", batches=[batch])
    assert '<td class="num routed">3</td><td class="num events">5</td>' in html
    assert "of 497 allowed" in html and "/ 497" not in html


def test_an_input_queues_dead_letter_and_retry_queues_fold_under_it():
    def row(name, role, under=None, waiting=0):
        return QueueRow(name, role, 0, 1, None, None, "<svg></svg>", under, waiting)

    html = render("queues.html", every=5, broker_up=True, rows=[
        row("q.in", "input", waiting=3), row("q.in.dlq", "dead letters", "q.in"),
        row("q.in.retry.1", "retry 1", "q.in"), row("q.out", "output")])
    rows = etree.fromstring(f"<div>{html}</div>", etree.HTMLParser()).findall(".//tr[@data-queue]")
    shown = {r.get("data-queue"): r.get("hidden") is None for r in rows}
    assert shown == {"q.in": True, "q.in.dlq": False, "q.in.retry.1": False, "q.out": True}
    (fold,) = rows[0].findall(".//button")
    assert (fold.get("data-fold"), fold.text.strip()) == ("q.in", "▸ 2 more")
    assert "3 dead letter(s)" in etree.tostring(rows[0], encoding="unicode")
    assert not rows[3].findall(".//button")


def test_every_metric_in_the_table_is_documented_on_the_watching_page():
    page = (REPO / "docs" / "watching.md").read_text()
    missing = [name for name in METRICS if f"`{name}" not in page]
    assert not missing, f"docs/watching.md's metric list lacks {missing}"


def test_http_listen_must_be_host_and_port(tmp_path):
    config = tmp_path / "chalk.toml"
    config.write_text('[http]\nlisten = "9187"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(config, env={})
    assert "[http] listen" in str(e.value) and "host:port" in str(e.value)
    config.write_text('[http]\nlisten = "[::1]:9187"\ntoken = "t"\n')
    settings = load_settings(config, env={})
    assert (settings.http_listen, settings.http_token) == ("[::1]:9187", "t")
    assert load_settings(config, env={"CHALK_HTTP_LISTEN": "0.0.0.0:80"}).http_listen == \
        "0.0.0.0:80"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "tests/workflows/valid").glob("*.xml")))
def test_a_workflow_is_drawn_without_graphviz(name):
    workflow = engine.load_workflow(REPO / "tests/workflows/valid" / name)
    graph = engine.workflow_graph(workflow)
    svg = etree.fromstring(layered_svg(graph).encode())
    texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    for _node, data in graph.nodes(data=True):
        if data["kind"] != "join":  # joins are dots
            assert str(data["label"]).split("\n")[0][:28] in texts
    assert len(svg.findall(".//{http://www.w3.org/2000/svg}path")) >= graph.number_of_edges()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_running_service_serves_metrics_the_page_and_refuses_a_replay_without_token(
        tmp_path, spark, make_settings, declare):
    folder = write_test_workflows(tmp_path / "workflows")
    settings = replace(make_settings("Fragile", workflows_dir=folder, max_retries=0),
                       http_listen="127.0.0.1:0", http_token=TOKEN)
    declare(settings)
    queue = settings.listeners[0].queue
    push_records(settings, queue, [{"id": f"w{i}", "attributes": {}} for i in range(5)])
    push_records(settings, queue, [{"id": "w-bad", "attributes": {"fail": True}}])
    with Service(settings, spark=spark) as service:
        service.run(until=lambda s: s["committed"] + s["dead"] >= 6, idle_exit=60)
        base = service.plugin("watch").url
        status, text = _get(base + "metrics")
        assert status == 200
        assert _value(text, "chalk_messages_in_total", queue=queue) == 6
        assert _value(text, "chalk_messages_dead_lettered_total", queue=queue) == 1
        assert _value(text, "chalk_records_committed_total", workflow="Fragile") == 5
        assert _value(text, "chalk_spark_job_seconds_count", workflow="Fragile") >= 1
        assert _value(text, "chalk_messages_out_total", queue=settings.routers[0].queue) == 5
        assert _value(text, "chalk_leader") == 1
        version = service.registry.get("Fragile").version
        assert _value(text, "chalk_workflow_info", workflow="Fragile", version=version) == 1
        sample = service.plugin("watch").sampler.sample()  # what the sampler thread does every 5 s
        assert sample.depth[f"{queue}.dlq"] == 1 and sample.consumers[queue] >= 1
        status, text = _get(base + "metrics")
        assert _value(text, "chalk_queue_depth", queue=f"{queue}.dlq") == 1
        assert _value(text, "chalk_dead_letters", queue=queue) == 1
        assert _value(text, "chalk_broker_up") == 1

        status, page = _get(base)
        assert status == 200 and "w3" in page and "w-bad" in page and "Fragile" in page
        status, panel = _get(base + "panel/jobs?record=w3")
        assert "w3" in panel and "w4" not in panel
        for token in ("", "wrong", TOKEN + "-but-longer"):
            request = urllib.request.Request(base + "dlq/replay", method="POST",
                                             data=f"token={token}&target=%5B%22{queue}%22%2C%22%22%5D"
                                             .encode())
            try:
                urllib.request.urlopen(request, timeout=30)
                raise AssertionError("a replay without the right token was accepted")
            except urllib.error.HTTPError as e:
                assert e.code == 403
        # still there: chalk dlq moves it off Q.dlq into the store (looking redelivers nothing)
        assert [b"w-bad" in d.body for d in dead_letters(settings, [queue])] == [True]
        assert service.plugin("watch").sampler.sample().depth[f"{queue}.dlq"] == 0
        # the queue is empty, the dead letter still waits: the gauge says so
        assert _value(_get(base + "metrics")[1], "chalk_dead_letters", queue=queue) == 1
        assert _get(base + "panel/nothing")[0] == 404
        jobs = job_page(service.store, JobQuery(record="w3")).jobs   # the panel reads the job log
        assert [(j.entry.state, j.records) for j in jobs] == [("committed", ("w3",))]
        assert sorted(j.entry.state for j in job_page(service.store, JobQuery()).jobs) == \
            ["committed"] * 5 + ["dead"]
        status, panel = _get(base + "panel/jobs?record=w-bad")   # routed nowhere, still found
        assert status == 200 and "dead" in panel and "asked to fail" in panel
        replay = urllib.request.Request(base + "dlq/replay", method="POST",
                                        data=f"token={TOKEN}&target=%5B%22{queue}%22%2C%22%22%5D"
                                        .encode())
        assert urllib.request.urlopen(replay, timeout=30).status == 200
        service.plugin("watch").sampler.sample()
        assert _value(_get(base + "metrics")[1], "chalk_dead_letters", queue=queue) == 0
