"""HeartbeatMonitor state machine, driven by a manual clock: no sleeping."""

from __future__ import annotations

import pytest

from heartbeat import HeartbeatMonitor, ManualScheduler, MonitorState

from .fakes import RecordingListener, RecordingTarget

TIMEOUT = 5.0


def make(threshold: int = 3) -> tuple[HeartbeatMonitor[object], RecordingListener, ManualScheduler]:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    monitor: HeartbeatMonitor[object] = HeartbeatMonitor(
        "t1", RecordingTarget(), listener, scheduler.clock, scheduler, TIMEOUT, threshold
    )
    return monitor, listener, scheduler


def test_timeout_fires_exactly_once_at_the_deadline() -> None:
    monitor, listener, scheduler = make()
    scheduler.advance(TIMEOUT - 0.001)
    assert listener.timeouts == []
    scheduler.advance(0.001)
    assert listener.timeouts == ["t1"]
    scheduler.advance(10 * TIMEOUT)
    assert listener.timeouts == ["t1"]
    assert monitor.state is MonitorState.TIMEOUT


def test_heartbeat_just_before_the_deadline_keeps_the_target_alive() -> None:
    monitor, listener, scheduler = make()
    scheduler.advance(TIMEOUT - 0.001)
    monitor.report_heartbeat()
    scheduler.advance(TIMEOUT - 0.002)
    assert listener.timeouts == []
    assert monitor.state is MonitorState.RUNNING
    assert monitor.last_heartbeat == pytest.approx(TIMEOUT - 0.001)
    scheduler.advance(0.002)
    assert listener.timeouts == ["t1"]


def test_rpc_failures_reach_unreachable_only_at_the_threshold() -> None:
    monitor, listener, scheduler = make(threshold=3)
    monitor.report_rpc_failure()
    monitor.report_rpc_failure()
    assert listener.unreachable == []
    monitor.report_rpc_failure()
    assert listener.unreachable == ["t1"]
    assert monitor.state is MonitorState.UNREACHABLE
    monitor.report_rpc_failure()
    scheduler.advance(2 * TIMEOUT)
    assert listener.unreachable == ["t1"]
    assert listener.timeouts == [], "one-way: an unreachable target does not also time out"


def test_success_or_heartbeat_resets_the_consecutive_failure_count() -> None:
    monitor, listener, _ = make(threshold=2)
    monitor.report_rpc_failure()
    monitor.report_rpc_success()
    monitor.report_rpc_failure()
    monitor.report_heartbeat()
    monitor.report_rpc_failure()
    assert listener.unreachable == []
    monitor.report_rpc_failure()
    assert listener.unreachable == ["t1"]


def test_disabled_threshold_never_reports_unreachable() -> None:
    monitor, listener, _ = make(threshold=-1)
    for _ in range(100):
        monitor.report_rpc_failure()
    assert listener.unreachable == []
    assert monitor.is_running()


def test_cancel_is_idempotent_and_silences_a_pending_timeout() -> None:
    monitor, listener, scheduler = make()
    scheduler.advance(TIMEOUT / 2)
    monitor.cancel()
    monitor.cancel()
    scheduler.advance(TIMEOUT)
    assert listener.timeouts == []
    assert monitor.state is MonitorState.CANCELED
    assert scheduler.pending() == 0


def test_cancel_after_timeout_keeps_the_timeout_state() -> None:
    monitor, _listener, scheduler = make()
    scheduler.advance(TIMEOUT)
    monitor.cancel()
    assert monitor.state is MonitorState.TIMEOUT
    monitor.report_heartbeat()
    assert monitor.last_heartbeat is None, "a heartbeat after the timeout is not applied"


def test_a_vetoed_silence_judges_nothing_and_counts_again_from_the_check() -> None:
    """The owner's vetting sees the window ``(since, now)``; a veto re-arms a whole timeout."""
    monitor, listener, scheduler = make()
    asked: list[tuple[float, float]] = []

    def veto_first(since: float, now: float) -> bool:
        asked.append((since, now))
        return len(asked) > 1

    monitor.set_vetting(veto_first)
    scheduler.advance(TIMEOUT)
    assert listener.timeouts == [] and monitor.state is MonitorState.RUNNING
    assert asked == [(0.0, TIMEOUT)] and monitor.checks_skipped == 1
    scheduler.advance(TIMEOUT - 1.0)
    assert listener.timeouts == []
    scheduler.advance(1.0)
    assert asked[1] == (TIMEOUT, 2 * TIMEOUT) and listener.timeouts == ["t1"]


def test_a_heartbeat_that_comes_while_the_silence_is_vetted_keeps_the_target_alive() -> None:
    monitor, listener, scheduler = make()

    def heartbeat_arrives(since: float, now: float) -> bool:
        monitor.report_heartbeat()  # as from another thread, between the check and the verdict
        return True

    monitor.set_vetting(heartbeat_arrives)
    scheduler.advance(TIMEOUT)
    assert listener.timeouts == [] and monitor.state is MonitorState.RUNNING
    monitor.set_vetting(lambda since, now: True)
    scheduler.advance(TIMEOUT)  # still watched: the next silence of a timeout ends it
    assert listener.timeouts == ["t1"]


def test_a_vetting_that_raises_judges_nothing() -> None:
    monitor, listener, scheduler = make()

    def broken(since: float, now: float) -> bool:
        raise RuntimeError("no view of the window")

    monitor.set_vetting(broken)
    scheduler.advance(3 * TIMEOUT)
    assert listener.timeouts == [] and monitor.checks_skipped == 3
