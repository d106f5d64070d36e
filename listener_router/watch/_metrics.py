"""Prometheus metrics of one service process.

Two kinds, by where they come from:

- **per batch**, from each :class:`~listener_router.BatchReport` (this is a
  batch observer): messages in, out, retried and dead-lettered by queue,
  messages by queue and state, records committed and invalidated by
  workflow, the batch size, the seconds of each stage, each workflow run
  (Spark job or the service's own workers);
- **when scraped**, read from what the service already keeps (:class:`Live`):
  the leader flag and the members (``Membership``), the running workflow
  versions (the registry), the batch size limit, records and messages in
  flight, and the last sample of queue depths and leases (the watch's
  sampler thread takes those from the broker and the store every few
  seconds, never on the pipeline's threads).

The metrics live in a registry of their own (not prometheus_client's global
one), so several services in one process do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from listener_router.broker import dlq_name
from listener_router.pipeline import BatchObserver, BatchReport
from listener_router.watch._history import Published, Sample

__all__ = ["Live", "Metrics", "METRICS", "STAGES"]

# BatchReport.seconds keys → the stage label (the gathering is "stage" in reports)
STAGES = {"stage": "gather", "receive": "receive", "inbox": "inbox", "load": "load",
          "screen": "screen", "wait": "wait", "run": "run", "route": "route", "commit": "commit",
          "publish": "publish", "batch": "batch"}

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0, 120.0, 300.0)
_SIZES = (1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000)

# name → help; docs/watching.md's list is checked against this table
METRICS: dict[str, str] = {
    "chalk_messages_in_total": "Messages taken from the queue and settled (committed, duplicate, "
                               "retrying or dead), by queue",
    "chalk_messages_out_total": "Routed messages published (by the router rules), by target "
                                "queue (exchange/key for an exchange); events are not counted here",
    "chalk_events_published_total": "Events published with the batches (record.committed, "
                                    "record.invalidated, message.dead_lettered)",
    "chalk_messages_retried_total": "Messages whose instance failed and that wait in a delay queue "
                                    "for another attempt, by input queue",
    "chalk_messages_dead_lettered_total": "Messages sent to the dead-letter queue, by input queue",
    "chalk_messages_total": "Messages by input queue and the state they were settled in "
                            "(committed, duplicate, retrying, dead, deferred; unchanged: "
                            "committed without a run, delta processing)",
    "chalk_records_committed_total": "Records committed, by workflow",
    "chalk_records_invalidated_total": "Records invalidated (their instance failed), by workflow",
    "chalk_records_unrun_total": "Records a plug-in settled without running them, by workflow "
                                 "and step (delta processing: unchanged), counted when their "
                                 "message commits",
    "chalk_batches_total": "Batches finished",
    "chalk_batch_messages": "Messages per batch",
    "chalk_stage_seconds": "Seconds a batch spent in each stage (gather, receive, inbox, load, "
                           "screen, wait, run, route, commit, publish, batch)",
    "chalk_spark_job_seconds": "Seconds of each Spark job (one per workflow per batch), by workflow",
    "chalk_local_run_seconds": "Seconds of each workflow run on the service's own workers "
                               "(runner local, or under local_below), by workflow",
    "chalk_queue_depth": "Messages ready in the queue, as the broker last said (sampled every few "
                         "seconds; absent queue: not reported)",
    "chalk_queue_consumers": "Consumers of the queue, as the broker last said",
    "chalk_dead_letters": "Dead letters waiting to be replayed or purged, by input queue: those "
                          "in its .dlq and those moved into the store (last sample)",
    "chalk_broker_up": "1 when the last queue sample reached the broker",
    "chalk_leases_held": "Record leases this process holds in storage (last sample)",
    "chalk_in_flight": "Record IDs and message IDs held by batches in flight",
    "chalk_leader": "1 when this process leads the cluster",
    "chalk_cluster_members": "Live members of the cluster",
    "chalk_workflow": "The running version of each workflow (value 1)",
    "chalk_workflow_errors": "Errors in the workflow files (the last good version keeps running)",
    "chalk_batch_size_limit": "Messages the batch sizing lets a batch take now",
    "chalk_last_batch_timestamp_seconds": "When the last batch finished (Unix time)",
}


@dataclass(frozen=True)
class Live:
    """Where scrape-time values come from (each a cheap call into the running service)."""

    is_leader: Callable[[], bool]
    members: Callable[[], int]
    workflows: Callable[[], list[tuple[str, str, str]]]   # (name, version, path)
    workflow_errors: Callable[[], int]
    batch_size: Callable[[], int]
    in_flight: Callable[[], int]
    sample: Callable[[], Sample | None]
    last_batch: Callable[[], float | None]


class _LiveCollector(Collector):
    def __init__(self, live: Live):
        self.live = live

    def collect(self) -> Iterator[Metric]:
        live = self.live

        def gauge(name: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, METRICS[name], value=value)

        yield gauge("chalk_leader", 1.0 if live.is_leader() else 0.0)
        yield gauge("chalk_cluster_members", live.members())
        info = InfoMetricFamily("chalk_workflow", METRICS["chalk_workflow"],
                                labels=["workflow", "version", "path"])
        for name, version, path in live.workflows():
            info.add_metric([name, version, path], {})
        yield info
        yield gauge("chalk_workflow_errors", live.workflow_errors())
        yield gauge("chalk_batch_size_limit", live.batch_size())
        yield gauge("chalk_in_flight", live.in_flight())
        last = live.last_batch()
        if last is not None:
            yield gauge("chalk_last_batch_timestamp_seconds", last)
        sample = live.sample()
        if sample is None:
            return
        yield gauge("chalk_broker_up", 1.0 if sample.broker_up else 0.0)
        if sample.leases is not None:
            yield gauge("chalk_leases_held", sample.leases)
        depth = GaugeMetricFamily("chalk_queue_depth", METRICS["chalk_queue_depth"],
                                  labels=["queue"])
        consumers = GaugeMetricFamily("chalk_queue_consumers", METRICS["chalk_queue_consumers"],
                                      labels=["queue"])
        for queue, n in sample.depth.items():
            if n is not None:
                depth.add_metric([queue], n)
                consumers.add_metric([queue], sample.consumers.get(queue) or 0)
        yield depth
        yield consumers
        if sample.kept is not None:
            dead = GaugeMetricFamily("chalk_dead_letters", METRICS["chalk_dead_letters"],
                                     labels=["queue"])
            for queue, n in sample.kept.items():
                dead.add_metric([queue], n + (sample.depth.get(dlq_name(queue)) or 0))
            yield dead


class Metrics(BatchObserver):
    """The service's metrics (see module doc); ``exposition()`` is what ``/metrics`` serves."""

    def __init__(self, live: Live, side_exchanges: Collection[str] = ()):
        self.side_exchanges = frozenset(side_exchanges)   # the plug-ins': events, not routed
        registry = self.registry = CollectorRegistry()
        ProcessCollector(registry=registry)

        def counter(name: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name.removesuffix("_total"), METRICS[name], labels, registry=registry)

        self.messages_in = counter("chalk_messages_in_total", ("queue",))
        self.messages_out = counter("chalk_messages_out_total", ("queue",))
        self.events = counter("chalk_events_published_total")
        self.retried = counter("chalk_messages_retried_total", ("queue",))
        self.dead = counter("chalk_messages_dead_lettered_total", ("queue",))
        self.messages = counter("chalk_messages_total", ("queue", "state"))
        self.committed = counter("chalk_records_committed_total", ("workflow",))
        self.invalidated = counter("chalk_records_invalidated_total", ("workflow",))
        self.unrun = counter("chalk_records_unrun_total", ("workflow", "step"))
        self.batches = counter("chalk_batches_total")
        self.batch_messages = Histogram("chalk_batch_messages", METRICS["chalk_batch_messages"],
                                        buckets=_SIZES, registry=registry)
        self.stage_seconds = Histogram("chalk_stage_seconds", METRICS["chalk_stage_seconds"],
                                       ["stage"], buckets=_SECONDS, registry=registry)
        self.run_seconds = {
            "spark": Histogram("chalk_spark_job_seconds", METRICS["chalk_spark_job_seconds"],
                               ["workflow"], buckets=_SECONDS, registry=registry),
            "local": Histogram("chalk_local_run_seconds", METRICS["chalk_local_run_seconds"],
                               ["workflow"], buckets=_SECONDS, registry=registry)}
        registry.register(_LiveCollector(live))

    def batch_finished(self, report: BatchReport) -> None:
        """Count one finished batch (a few label lookups per queue, workflow and stage)."""
        self.batches.inc()
        self.batch_messages.observe(report.messages)
        for (queue, state), n in report.outcome.items():
            self.messages.labels(queue, state).inc(n)
            if state != "deferred":
                self.messages_in.labels(queue).inc(n)
            if state == "retrying":
                self.retried.labels(queue).inc(n)
            elif state == "dead":
                self.dead.labels(queue).inc(n)
        with report.lock:
            published = Published.of(report, self.side_exchanges)
        for target, n in published.routed.items():
            self.messages_out.labels(target).inc(n)
        if published.events:
            self.events.inc(published.events)
        for (workflow, kind), n in report.records.items():
            if kind == "committed":
                self.committed.labels(workflow).inc(n)
            elif kind == "invalidated":
                self.invalidated.labels(workflow).inc(n)
            else:  # a step of records settled without a run
                self.unrun.labels(workflow, kind).inc(n)
        for key, seconds in report.seconds.items():
            self.stage_seconds.labels(STAGES.get(key, key)).observe(seconds)
        for run in report.runs:
            self.run_seconds[run.runner].labels(run.workflow).observe(run.seconds)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
