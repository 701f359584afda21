"""The phi monitor's vetting window (the owner's check before a suspicion becomes a timeout): a
heartbeat that comes while a suspicion is vetted wins, and a vetting that fails vetoes once and
never stops the checks (both found by review: the first killed a live executor, the second
turned the detector off for that executor)."""

from __future__ import annotations

from heartbeat.monitor import MonitorState
from heartbeat.phi_accrual import PhiSettings
from heartbeat.phi_monitor import PhiMonitor
from heartbeat.scheduler import ManualScheduler

from .fakes import RecordingListener, RecordingTarget

INTERVAL = 0.1
TIMEOUT = 5.0


def _steady() -> tuple[PhiMonitor[object], RecordingListener, ManualScheduler]:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    monitor: PhiMonitor[object] = PhiMonitor(
        "t1",
        RecordingTarget(),
        listener,
        scheduler.clock,
        scheduler,
        TIMEOUT,
        phi=PhiSettings.for_interval(INTERVAL),
    )
    for _ in range(100):
        scheduler.advance(INTERVAL)
        monitor.report_heartbeat()
    return monitor, listener, scheduler


def _silence(scheduler: ManualScheduler, listener: RecordingListener, limit_s: float) -> float:
    waited = 0.0
    while not listener.timeouts and waited < limit_s:
        scheduler.advance(0.001)
        waited += 0.001
    return waited


def test_a_heartbeat_that_comes_while_the_suspicion_is_vetted_keeps_the_target_alive() -> None:
    monitor, listener, scheduler = _steady()
    vetted: list[float] = []

    def answer_meanwhile(since: float, now: float) -> bool:
        vetted.append(now - since)
        if len(vetted) == 1:
            monitor.report_heartbeat()  # the agent's answer lands while the RM checks its window
        return True

    monitor.set_vetting(answer_meanwhile)
    waited = 0.0
    while not vetted and waited < 1.0:  # up to the first suspicion, no further
        scheduler.advance(0.001)
        waited += 0.001
    assert vetted, "the suspicion was vetted"
    assert listener.timeouts == [] and monitor.state is MonitorState.RUNNING
    silent = _silence(scheduler, listener, 2.0)  # the target stops for real: still detected
    assert listener.timeouts == ["t1"] and len(vetted) == 2 and silent < 1.0


def test_a_vetting_that_raises_vetoes_once_and_the_checks_go_on() -> None:
    monitor, listener, scheduler = _steady()
    calls: list[float] = []

    def broken_once(since: float, now: float) -> bool:
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return True

    monitor.set_vetting(broken_once)
    silent = _silence(scheduler, listener, 2.0)
    assert len(calls) >= 2, "checked again after the failure"
    assert listener.timeouts == ["t1"] and silent < 2.0 < TIMEOUT
    assert monitor.checks_skipped >= 1
