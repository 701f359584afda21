"""Phi accrual (``heartbeat.phi_accrual``) and the monitor that uses it, on a manual clock."""

from __future__ import annotations

import random

import pytest

from heartbeat.errors import HeartbeatConfigError
from heartbeat.monitor import MonitorState
from heartbeat.phi_accrual import PhiAccrual, PhiSettings, deviations_for, phi_of
from heartbeat.phi_monitor import PhiMonitor
from heartbeat.scheduler import ManualScheduler

from .fakes import RecordingListener, RecordingTarget

INTERVAL = 0.1
TIMEOUT = 5.0
SETTINGS = PhiSettings.for_interval(INTERVAL)  # threshold 8, pause 200 ms, sd floor 25 ms


def make(
    settings: PhiSettings = SETTINGS,
) -> tuple[PhiMonitor[object], RecordingListener, ManualScheduler]:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    monitor: PhiMonitor[object] = PhiMonitor(
        "t1", RecordingTarget(), listener, scheduler.clock, scheduler, TIMEOUT, phi=settings
    )
    return monitor, listener, scheduler


def beat(monitor: PhiMonitor[object], scheduler: ManualScheduler, intervals: list[float]) -> None:
    for interval in intervals:
        scheduler.advance(interval)
        monitor.report_heartbeat()


def suspected_after(listener: RecordingListener, scheduler: ManualScheduler, limit_s: float) -> float:
    """Advances 1 ms at a time until the timeout is notified; the silence it took."""
    waited = 0.0
    while not listener.timeouts and waited < limit_s:
        scheduler.advance(0.001)
        waited += 0.001
    return waited


def test_phi_rises_with_the_silence_and_reaches_the_threshold_where_predicted() -> None:
    values = [phi_of(y / 2) for y in range(-8, 20)]
    assert values == sorted(values)
    assert phi_of(deviations_for(8.0)) == pytest.approx(8.0, abs=1e-6)
    assert phi_of(1000.0) > 1e6  # no underflow to an error for a very long silence
    history = PhiAccrual(SETTINGS)
    for _ in range(50):
        history.add_interval(INTERVAL)
    assert history.phi(history.suspect_after_s()) == pytest.approx(8.0, abs=1e-6)
    assert history.phi(INTERVAL) < 0.5


def test_a_steady_target_that_stops_is_suspected_a_few_deviations_after_its_interval() -> None:
    monitor, listener, scheduler = make()
    beat(monitor, scheduler, [INTERVAL] * 100)
    silent = suspected_after(listener, scheduler, TIMEOUT)
    assert listener.timeouts == ["t1"]
    assert monitor.state is MonitorState.TIMEOUT
    # mean + pause + y * floor: 0.1 + 0.2 + 5.2 * 0.025, far below the 5 s timeout
    expected = INTERVAL + SETTINGS.acceptable_pause_s + deviations_for(8.0) * SETTINGS.min_std_s
    assert silent == pytest.approx(expected, abs=0.003)
    assert monitor.suspicion is not None and monitor.suspicion.phi == pytest.approx(8.0, abs=0.01)
    assert "phi 8" in monitor.suspicion.describe()
    scheduler.advance(2 * TIMEOUT)
    assert listener.timeouts == ["t1"], "one-way: the timeout does not fire again"


def test_a_jittery_target_is_never_suspected_and_its_stop_waits_for_a_longer_silence() -> None:
    rng = random.Random(37)
    monitor, listener, scheduler = make()
    # 5 minutes of answers from a loaded host: 50-200 ms apart, now and then 350-450 ms late.
    intervals = [
        rng.uniform(0.35, 0.45) if rng.random() < 0.03 else rng.uniform(0.05, 0.2) for _ in range(2500)
    ]
    beat(monitor, scheduler, intervals)
    assert listener.timeouts == []
    assert monitor.checks_skipped == 0
    steady, steady_listener, steady_scheduler = make()
    beat(steady, steady_scheduler, [INTERVAL] * 100)
    steady_s = suspected_after(steady_listener, steady_scheduler, TIMEOUT)
    assert max(intervals) > steady_s, "these intervals would have timed out the steady target"
    jittery_s = suspected_after(listener, scheduler, TIMEOUT)
    assert listener.timeouts == ["t1"]
    assert max(intervals) < jittery_s < TIMEOUT


def test_a_check_that_runs_late_judges_nothing() -> None:
    """The observer was paused (its clock moved, its timers did not run): the overdue check
    judges nothing and the target gets a whole margin of awake time from then on."""
    monitor, listener, scheduler = make()
    beat(monitor, scheduler, [INTERVAL] * 100)
    scheduler.clock.jump(1.0)  # the observer's pause: no timer ran
    scheduler.advance(0.0)  # it resumes: the check is late
    assert listener.timeouts == []
    assert monitor.checks_skipped == 1
    monitor.report_heartbeat()  # the answer that waited behind the pause
    beat(monitor, scheduler, [INTERVAL] * 10)
    assert monitor.state is MonitorState.RUNNING
    # And without an answer after the pause, the suspicion waits a whole margin after the resume.
    other, other_listener, other_scheduler = make()
    beat(other, other_scheduler, [INTERVAL] * 100)
    other_scheduler.clock.jump(1.0)
    other_scheduler.advance(0.0)
    silent = suspected_after(other_listener, other_scheduler, TIMEOUT)
    assert other_listener.timeouts == ["t1"]
    assert silent == pytest.approx(other.history.suspect_after_s(), abs=0.003)


def test_a_vetoed_suspicion_judges_nothing_until_the_owner_trusts_its_view() -> None:
    monitor, listener, scheduler = make()
    windows: list[tuple[float, float]] = []
    trusted = False

    def vetting(since: float, now: float) -> bool:
        windows.append((since, now))
        return trusted

    monitor.set_vetting(vetting)
    beat(monitor, scheduler, [INTERVAL] * 50)
    last = scheduler.clock.monotonic()
    scheduler.advance(1.0)
    assert listener.timeouts == []
    assert monitor.checks_skipped >= 1
    assert windows[0][0] == pytest.approx(last)  # the window starts at the last heartbeat
    trusted = True
    scheduler.advance(1.0)
    assert listener.timeouts == ["t1"]


def test_the_timeout_still_rules_before_the_first_heartbeat_and_beyond_a_long_margin() -> None:
    monitor, listener, scheduler = make()
    scheduler.advance(TIMEOUT - 0.01)
    assert listener.timeouts == [], "no phi judgement without a heartbeat to judge against"
    scheduler.advance(0.01)
    assert listener.timeouts == ["t1"]
    assert monitor.suspicion is None  # a plain timeout, not a suspicion
    patient = PhiSettings.for_interval(INTERVAL, acceptable_pause_s=TIMEOUT * 2)
    monitor, listener, scheduler = make(patient)
    beat(monitor, scheduler, [INTERVAL] * 20)
    scheduler.advance(TIMEOUT)
    assert listener.timeouts == ["t1"] and monitor.suspicion is None


def test_cancel_ends_the_check_too() -> None:
    monitor, listener, scheduler = make()
    beat(monitor, scheduler, [INTERVAL] * 20)
    monitor.cancel()
    scheduler.advance(2 * TIMEOUT)
    assert listener.timeouts == []
    assert scheduler.pending() == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("threshold", 0.0), ("acceptable_pause_s", -0.1), ("min_std_s", float("nan")), ("window", 1)],
)
def test_settings_are_validated_and_name_the_parameter(field: str, value: float) -> None:
    with pytest.raises(HeartbeatConfigError, match=field):
        PhiSettings(**{field: value})  # type: ignore[arg-type]
