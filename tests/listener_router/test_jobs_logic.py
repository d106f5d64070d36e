"""Pure logic of scheduled jobs and the job log: ticks, ``every``, schedule settings, the
mergeable histogram."""

from __future__ import annotations

import datetime as dt
import math
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from listener_router import ConfigError, ListenerRule, load_settings
from listener_router.jobs import ACCURACY, Sketch, merged
from listener_router.schedules import (
    ScheduleRule,
    Ticks,
    parse_every,
    scheduled_messages,
    tick_label,
    with_schedule_listeners,
)


def _utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp()


def test_every_ticks_at_multiples_of_the_period_since_the_epoch():
    ticks = Ticks(ScheduleRule(name="s", every=30.0))
    t = _utc(2024, 5, 1, 12, 0, 10)
    assert ticks.after(t) == _utc(2024, 5, 1, 12, 0, 30)
    assert ticks.before(t) == _utc(2024, 5, 1, 12, 0, 0)
    assert ticks.after(_utc(2024, 5, 1, 12, 0, 30)) == _utc(2024, 5, 1, 12, 1, 0)
    assert ticks.before(_utc(2024, 5, 1, 12, 0, 30)) == _utc(2024, 5, 1, 12, 0, 0)
    assert ticks.at_or_before(_utc(2024, 5, 1, 12, 0, 30)) == _utc(2024, 5, 1, 12, 0, 30)
    assert ticks.between(_utc(2024, 5, 1, 12, 0, 0), _utc(2024, 5, 1, 12, 2, 0)) == 4


def test_cron_ticks_in_their_time_zone():
    ticks = Ticks(ScheduleRule(name="s", cron="*/5 * * * *"))
    assert ticks.after(_utc(2024, 5, 1, 12, 3)) == _utc(2024, 5, 1, 12, 5)
    assert ticks.before(_utc(2024, 5, 1, 12, 5)) == _utc(2024, 5, 1, 12, 0)
    assert ticks.at_or_before(_utc(2024, 5, 1, 12, 5)) == _utc(2024, 5, 1, 12, 5)
    assert ticks.between(_utc(2024, 5, 1, 12, 0), _utc(2024, 5, 1, 13, 0)) == 12
    berlin = Ticks(ScheduleRule(name="s", cron="0 3 * * *", timezone="Europe/Berlin"))
    assert berlin.after(_utc(2024, 7, 1, 0, 0)) == _utc(2024, 7, 1, 1, 0)  # 03:00 CEST


def test_tick_labels_are_utc_iso_times():
    assert tick_label(_utc(2024, 5, 1, 12, 0, 5)) == "2024-05-01T12:00:05Z"
    assert tick_label(_utc(2024, 5, 1, 12, 0, 5) + 0.25) == "2024-05-01T12:00:05.250Z"


def test_scheduled_messages_carry_batch_size_ids_and_deterministic_ids():
    rule = ScheduleRule(name="nightly", every=60.0, queue="q", batch_size=2)
    tick = _utc(2024, 5, 1)
    messages = scheduled_messages(rule, tick, 4, ["a", "b", "c"])
    assert [m.message_id for m in messages] == ["schedule:nightly:2024-05-01T00:00:00Z:4",
                                                "schedule:nightly:2024-05-01T00:00:00Z:5"]
    assert [m.body for m in messages] == [b'{"records":[{"id":"a"},{"id":"b"}]}',
                                          b'{"records":[{"id":"c"}]}']
    assert messages[0].headers == {"operation": "ADD", "schedule": "nightly",
                                   "tick": "2024-05-01T00:00:00Z"}
    assert scheduled_messages(rule, tick, 4, ["a", "b", "c"]) == messages


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("1h", 3600),
                                               ("2d", 172800), ("1500ms", 1.5), (45, 45)])
def test_every_reads_units(text, seconds):
    assert parse_every(text, "here") == seconds


@pytest.mark.parametrize("bad", ["fast", "0.5s", "10 parsecs", "-1s"])
def test_every_refuses_what_it_cannot_read(bad):
    with pytest.raises(ConfigError) as caught:
        parse_every(bad, "chalk.toml [[schedule]] #1")
    assert "chalk.toml [[schedule]] #1" in str(caught.value)


def _settings(tmp_path, text):
    path = tmp_path / "chalk.toml"
    path.write_text(text)
    return load_settings(path, env={})


def test_a_schedule_with_a_workflow_gets_a_listener_rule_on_its_queue(tmp_path):
    settings = _settings(tmp_path, """
[[schedule]]
name = "reindex"
every = "10m"
workflow = "Demo"
prefix = "doc-"
batch_size = 100
catch_up = "none"
""")
    (rule,) = settings.schedules
    assert (rule.queue, rule.every, rule.prefix, rule.batch_size, rule.catch_up) == (
        "chalk.schedule.reindex", 600.0, "doc-", 100, "none")
    assert [(r.queue, r.workflow, r.condition) for r in settings.listeners] == [
        ("chalk.in", "Demo", None), ("chalk.schedule.reindex", "Demo", None)]


def test_schedules_sharing_a_queue_are_told_apart_by_their_header():
    rules = (ScheduleRule(name="a", every=60.0, queue="q", workflow="A"),
             ScheduleRule(name="b", every=60.0, queue="q", workflow="B"))
    added = with_schedule_listeners((), rules, "here")
    assert [(r.workflow, r.condition) for r in added] == [("A", "$schedule = 'a'"),
                                                          ("B", "$schedule = 'b'")]
    assert with_schedule_listeners(added, rules, "here") == added  # idempotent


def test_a_schedule_on_a_queue_whose_rules_never_run_its_workflow_is_refused():
    listeners = (ListenerRule(name="in", queue="q", workflow="Other"),)
    with pytest.raises(ConfigError) as caught:
        with_schedule_listeners(listeners, (ScheduleRule(name="s", every=60.0, queue="q",
                                                         workflow="Mine"),), "chalk.toml")
    assert "'s'" in str(caught.value) and "Mine" in str(caught.value)


@pytest.mark.parametrize(("body", "says"), [
    ('name = "s"\nqueue = "q"', "either 'cron'"),
    ('name = "s"\ncron = "* * *"', "not a valid cron"),
    ('name = "s"\nevery = "1m"\nids = ["a"]\nprefix = "x"', "leave out prefix"),
    ('name = "s"\nevery = "1m"\ncatch_up = "all"', "catch_up must be"),
    ('name = "s"\nevery = "1m"\ntimezone = "Mars/Olympus"', "unknown timezone"),
    ('name = "s"\nevery = "1m"\nselect = "all"', "unknown key(s) select"),
])
def test_bad_schedules_name_the_file_and_the_entry(tmp_path, body, says):
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, f"[[schedule]]\n{body}\n")
    message = str(caught.value)
    assert says in message and re.search(r"chalk\.toml:\d+: \[\[schedule\]\] #1", message)


# -- the histogram -------------------------------------------------------------------------
def _exact(values: list[float], q: float) -> float:
    """The nearest-rank quantile: the smallest sample at least ``q`` of the samples do not
    exceed."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered) - 1e-9)) - 1]


def test_p99_of_a_few_batches_is_the_slowest_one():
    # one batch ran a second, the next ones 17 ms: p99 is the slow one, p50 a fast one
    sketch = Sketch.of([0.997, 0.017, 0.017])
    assert sketch.quantile(0.99) == pytest.approx(0.997, rel=ACCURACY)
    assert sketch.quantile(0.5) == pytest.approx(0.017, rel=ACCURACY)
    two = Sketch.of([0.011, 1.001])
    assert two.quantile(0.99) == pytest.approx(1.001, rel=ACCURACY)
    assert two.quantile(0.5) == pytest.approx(0.011, rel=ACCURACY)
    assert Sketch.of([0.5]).quantile(0.99) == pytest.approx(0.5, rel=ACCURACY)


@given(st.lists(st.floats(min_value=1e-5, max_value=1e4), min_size=1, max_size=300),
       st.lists(st.floats(min_value=1e-5, max_value=1e4), min_size=1, max_size=300))
def test_merged_histograms_are_the_histogram_of_all_samples(a, b):
    together = Sketch.of(a + b)
    assert Sketch.of(a).merge(Sketch.of(b)) == together
    many = Sketch()
    many.add_many(a + b)
    assert many == together
    assert Sketch.loads(together.dumps(), together.count, together.total) == together
    for q in (0.5, 0.99):
        assert together.quantile(q) == pytest.approx(_exact(a + b, q), rel=ACCURACY * 1.01)


def test_percentiles_stay_within_the_accuracy_over_a_wide_range():
    rng = random.Random(7)
    values = [rng.lognormvariate(-3, 2) for _ in range(20_000)]
    parts = [Sketch.of(values[i::4]) for i in range(4)]   # four members, say
    total = merged(parts)
    assert total.count == len(values)
    for q in (0.5, 0.9, 0.99):
        assert total.quantile(q) == pytest.approx(_exact(values, q), rel=ACCURACY * 1.01)
    assert Sketch().quantile(0.5) is None
