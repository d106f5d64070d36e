"""Runs in the service's process: who is the culprit of a crash, and a suspect's run alone.

Pure logic on a real SQLite store: runs written down by an earlier incarnation
are what a crash leaves behind; no service is started.
"""

from __future__ import annotations

import threading
import time

from listener_router.pipeline._in_process import CRASHED_ALONE, InProcess
from listener_router.store import RunMessage, ServiceStore


def _left_by_a_crash(tmp_path, *runs: list[str]) -> InProcess:
    """A store where an earlier incarnation began ``runs`` (message IDs each) and died."""
    store = ServiceStore.connect(f"sqlite:///{tmp_path / 'chalk.db'}")
    earlier = InProcess(store, "m1")
    earlier.trail.path = str(tmp_path / "trail")
    earlier.incarnation = "before"
    for ids in runs:
        store.local_runs.begin("m1", "before", "W",
                               [RunMessage("q", mid, 1, {}, (f"r-{mid}",)) for mid in ids])
    now = InProcess(store, "m1")
    now.trail.path = earlier.trail.path
    now.incarnation = "after"
    return now


def test_one_run_of_one_message_left_is_the_culprit(tmp_path):
    now = _left_by_a_crash(tmp_path, ["a"])
    now.recover()
    reason = now.quarantined(["r-a"])["r-a"]
    assert now.culprit(reason), reason


def test_two_runs_left_name_no_culprit(tmp_path):
    # a crash while two lanes each ran one message here: either may have done it
    now = _left_by_a_crash(tmp_path, ["a"], ["b"])
    now.recover()
    reasons = now.quarantined(["r-a", "r-b"])
    assert sorted(reasons) == ["r-a", "r-b"]
    assert not any(CRASHED_ALONE in why for why in reasons.values()), reasons


def test_a_suspect_runs_with_nothing_beside_it(tmp_path):
    store = ServiceStore.connect(f"sqlite:///{tmp_path / 'chalk.db'}")
    here = InProcess(store, "m1")
    events: list[str] = []
    shared_in = threading.Event()
    release = threading.Event()

    def shared(name: str, hold: threading.Event | None) -> None:
        with here.shared():
            events.append(f"{name} in")
            shared_in.set()
            if hold is not None:
                hold.wait(5)
            events.append(f"{name} out")

    def alone() -> None:
        with here.alone():
            events.append("alone in")
            time.sleep(0.05)
            events.append("alone out")

    first = threading.Thread(target=shared, args=("s1", release))
    first.start()
    assert shared_in.wait(5)
    suspect = threading.Thread(target=alone)
    suspect.start()
    time.sleep(0.05)
    later = threading.Thread(target=shared, args=("s2", None))
    later.start()
    time.sleep(0.05)
    assert events == ["s1 in"]          # the suspect waits for s1; s2 waits behind it
    release.set()
    for t in (first, suspect, later):
        t.join(5)
    assert events == ["s1 in", "s1 out", "alone in", "alone out", "s2 in", "s2 out"]


def test_a_suspect_that_runs_long_holds_the_others_back_only_its_window(tmp_path):
    # a hung suspect must not stop the other lanes for its whole timeout
    store = ServiceStore.connect(f"sqlite:///{tmp_path / 'chalk.db'}")
    here = InProcess(store, "m1")
    here.window = 0.2
    started = threading.Event()
    release = threading.Event()

    def hung() -> None:
        with here.alone():
            started.set()
            release.wait(5)

    suspect = threading.Thread(target=hung)
    suspect.start()
    assert started.wait(5)
    t0 = time.monotonic()
    with here.shared():
        waited = time.monotonic() - t0
    release.set()
    suspect.join(5)
    assert 0.1 < waited < 1.0, waited
