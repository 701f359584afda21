"""Issue 36, item 4, agent side without Spark: the shuffle's disk figure is walked off the heartbeat
loop (a walk blocked on an event leaves every payload answered at once, with the last total), and
the shuffle service waits for its application id for as long as the agent runs, saying so."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from arrowbeat_base.clock import ManualClock
from spark_plugin.processes import executor
from spark_plugin.processes.executor import LazyShuffleService
from spark_plugin.settings.config import load
from spark_plugin.shuffle.agent.disk_usage import SLOW_WALK_S, DiskUsage

DEADLINE_S = 30.0
AT_ONCE_S = 5.0
"""A payload that waited for the hung walk would wait until the test releases it (after these
checks), so any bound tells; 5 s, not 0.5 s, leaves room for a thread starved on a loaded machine."""


class FakeService:
    """The figures ``MapOutputService.metrics`` gives, without a server or a directory."""

    def __init__(self) -> None:
        self.walked_inline = 0
        self.closed = False

    def metrics(self, walk_disk: bool = True) -> dict[str, float]:
        if walk_disk:
            self.walked_inline += 1
        return {"shuffle_pool_segments": 4.0}

    def close(self) -> None:
        self.closed = True


class BlockingWalk:
    """A disk walk that blocks until released: a hung disk."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.entered = threading.Event()
        self.release = threading.Event()
        self.walks = 0

    def __call__(self, _service: Any = None) -> int:
        self.walks += 1
        self.entered.set()
        assert self.release.wait(DEADLINE_S)
        return self.total


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


@pytest.fixture
def fake_service(monkeypatch: pytest.MonkeyPatch) -> FakeService:
    service = FakeService()
    monkeypatch.setattr(executor, "start_shuffle_service", lambda *args, **kwargs: service)
    return service


def test_a_hung_disk_walk_never_blocks_a_heartbeat_payload(fake_service: FakeService) -> None:
    walk = BlockingWalk(total=1234)
    lazy = LazyShuffleService(load({}), {"spark.app.id": "app-1"}, "1", "h", walk=walk)
    lazy.start_when_app_known(link=None)  # type: ignore[arg-type]  # the id is known: no link needed
    try:
        assert walk.entered.wait(DEADLINE_S)  # the first walk hangs
        for _ in range(3):
            figures, took = timed(lazy.metrics)
            assert took < AT_ONCE_S, took
            assert figures == {"shuffle_pool_segments": 4.0}  # no total yet: left out, not waited for
        assert fake_service.walked_inline == 0  # the service never walks on the payload's thread
        walk.release.set()
        deadline = time.monotonic() + DEADLINE_S
        while "shuffle_disk_bytes" not in lazy.metrics() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lazy.metrics()["shuffle_disk_bytes"] == 1234.0
    finally:
        walk.release.set()
        lazy.close()
    assert fake_service.closed


def test_a_payload_carries_the_last_total_while_a_later_walk_hangs(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    totals = iter([10, 20])
    usage = DiskUsage(lambda: next(totals), every_s=3600.0, clock=clock)
    usage.refresh()
    assert usage.bytes() == 10
    walk = BlockingWalk(total=30)
    usage._walk = walk  # the next walk hangs
    hung = threading.Thread(target=usage.refresh, daemon=True)
    hung.start()
    try:
        assert walk.entered.wait(DEADLINE_S)
        total, took = timed(usage.bytes)
        assert total == 10 and took < AT_ONCE_S
        with caplog.at_level(logging.WARNING, "arrowbeat.agent"):
            clock.jump(SLOW_WALK_S + 1.0)
            assert usage.bytes() == 10
            clock.jump(1.0)
            assert usage.bytes() == 10  # within the minute: not said again
        slow = [r.getMessage() for r in caplog.records if "walked for" in r.getMessage()]
        assert slow == [
            "the shuffle directory's disk use has been walked for 61 s (a slow or hung disk?); heartbeats "
            "carry the last total meanwhile"
        ]
    finally:
        walk.release.set()
        hung.join(DEADLINE_S)
    assert usage.bytes() == 30


class NeverAssigned:
    """``JvmLink.app_assigned`` that stays unset for ``misses`` waits, recording each timeout."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return len(self.timeouts) > self.misses


def test_the_shuffle_service_waits_for_its_app_id_past_600_s_saying_so(
    fake_service: FakeService, caplog: pytest.LogCaptureFixture
) -> None:
    """It used to wait 600 s once and then end silently: no shuffle service for the executor's
    life. Now it waits on with a WARNING after each wait (60, 120, 300, then 600 s), and starts."""
    lazy = LazyShuffleService(load({}), {}, "3", "h", walk=lambda _service: 0)
    assigned = NeverAssigned(misses=6)
    with caplog.at_level(logging.WARNING, "arrowbeat.agent"):
        lazy.wait_then_start(assigned, lambda: "app-late")
    try:
        assert assigned.timeouts == [60.0, 120.0, 300.0, 600.0, 600.0, 600.0, 600.0]
        said = [r.getMessage() for r in caplog.records if "waits on" in r.getMessage()]
        assert len(said) == 6 and "has waited 2280 s for the application id" in said[-1], said
        assert lazy.metrics().get("shuffle_pool_segments") == 4.0  # started, with the late id
    finally:
        lazy.close()


def test_a_closed_agent_stops_waiting_for_its_app_id(fake_service: FakeService) -> None:
    lazy = LazyShuffleService(load({}), {}, "3", "h", walk=lambda _service: 0)
    lazy.close()
    assigned = NeverAssigned(misses=10**9)
    lazy.wait_then_start(assigned, lambda: "never")
    assert len(assigned.timeouts) == 1 and lazy.metrics() == {}
