"""A stage's input: one thread, highest priority first, in order within a priority, and a
put that waits only behind values of its own priority or higher."""

from __future__ import annotations

import threading

import pytest

from listener_router.pipeline._stage_input import StageInput


class _Stage:
    """A stage whose first value holds its thread until released."""

    def __init__(self, backlog: int):
        self.handled: list[str] = []
        self.release = threading.Event()
        self.busy = threading.Event()
        self.input: StageInput[str] = StageInput("test-stage", self.handle, backlog)
        self.input.put("first")
        assert self.busy.wait(10)        # being handled: nothing overtakes it

    def handle(self, value: str) -> None:
        if value == "first":
            self.busy.set()
            assert self.release.wait(10)
        self.handled.append(value)


def test_a_higher_value_goes_before_the_lower_ones_waiting_and_order_holds_within_one():
    held = _Stage(backlog=10)
    stage = held.input
    for i in range(3):
        stage.put(f"low{i}")
    stage.put("high0", priority=5)
    stage.put("high1", priority=5)
    held.release.set()
    stage.drain()
    stage.close()
    assert held.handled == ["first", "high0", "high1", "low0", "low1", "low2"]


def test_a_higher_put_does_not_wait_behind_a_lower_backlog():
    held = _Stage(backlog=2)
    stage = held.input
    stage.put("low0")                        # with the one being handled: the backlog
    done = threading.Event()
    threading.Thread(target=lambda: (stage.put("low1"), done.set()), daemon=True).start()
    assert not done.wait(0.3)                # past the backlog: the low put waits
    stage.put("high", priority=1)            # returns at once, though three wait before it
    held.release.set()
    assert done.wait(10)
    stage.drain()
    stage.close()
    assert held.handled == ["first", "high", "low0", "low1"]


def test_what_a_handler_raises_surfaces_in_drain_and_close_handles_the_rest():
    seen: list[int] = []

    def handle(value: int) -> None:
        if value == 1:
            raise ValueError("bad value 1")
        seen.append(value)

    stage: StageInput[int] = StageInput("test-stage", handle)
    for value in range(3):
        stage.put(value)
    with pytest.raises(ValueError, match="bad value 1"):
        stage.drain()
    stage.put(3)
    stage.close()
    assert seen == [0, 2, 3]
    with pytest.raises(RuntimeError, match="put after close"):
        stage.put(4)
