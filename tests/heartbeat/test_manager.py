"""HeartbeatManager (receiver) and HeartbeatManagerSender with a manual clock."""

from __future__ import annotations

import pytest

from heartbeat import ClosedError, HeartbeatServices, ManualScheduler

from .fakes import RecordingListener, RecordingTarget

SERVICES = HeartbeatServices(interval_s=1.0, timeout_s=5.0, rpc_failure_threshold=2)


def test_request_resets_the_monitor_reports_payload_and_answers() -> None:
    scheduler = ManualScheduler()
    listener = RecordingListener(payload="my-slots")
    manager = SERVICES.create_heartbeat_manager("tm", listener, scheduler, scheduler.clock)
    rm = RecordingTarget()
    manager.monitor_target("rm", rm)
    scheduler.advance(4.0)
    assert manager.request_heartbeat("rm", "req-payload")
    assert rm.answers == [("tm", "my-slots")]
    assert listener.reported == [("rm", "req-payload")]
    assert manager.last_heartbeat_from("rm") == pytest.approx(4.0)
    scheduler.advance(4.9)
    assert listener.timeouts == []
    scheduler.advance(0.1)
    assert listener.timeouts == ["rm"]


def test_unmonitor_during_a_pending_timeout_prevents_it() -> None:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    manager = SERVICES.create_heartbeat_manager("tm", listener, scheduler, scheduler.clock)
    manager.monitor_target("rm", RecordingTarget())
    scheduler.advance(4.99)
    manager.unmonitor_target("rm")
    manager.unmonitor_target("rm")
    scheduler.advance(10.0)
    assert listener.timeouts == []
    assert manager.last_heartbeat_from("rm") is None
    assert not manager.receive_heartbeat("rm", "late")


def test_monitoring_again_replaces_the_old_monitor() -> None:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    manager = SERVICES.create_heartbeat_manager("tm", listener, scheduler, scheduler.clock)
    first = manager.monitor_target("x", RecordingTarget())
    scheduler.advance(3.0)
    manager.monitor_target("x", RecordingTarget())
    scheduler.advance(2.5)
    assert listener.timeouts == [], "the replaced monitor's timer must not fire"
    assert not first.is_running()
    scheduler.advance(2.5)
    assert listener.timeouts == ["x"]


def test_stop_cancels_everything_and_refuses_new_targets() -> None:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    manager = SERVICES.create_heartbeat_manager("tm", listener, scheduler, scheduler.clock)
    manager.monitor_target("a", RecordingTarget())
    manager.stop()
    manager.stop()
    scheduler.advance(100.0)
    assert listener.timeouts == []
    with pytest.raises(ClosedError):
        manager.monitor_target("b", RecordingTarget())


def test_sender_requests_each_target_once_per_interval() -> None:
    scheduler = ManualScheduler()
    listener = RecordingListener(payload=None)
    sender = SERVICES.create_heartbeat_manager_sender("rm", listener, scheduler, scheduler.clock, spread=4)
    targets = {f"e{i}": RecordingTarget() for i in range(10)}
    for name, target in targets.items():
        sender.monitor_target(name, target)
    sender.start()
    scheduler.advance(0.999)
    assert all(len(t.requests) == 1 for t in targets.values())
    scheduler.advance(2.0)
    assert all(len(t.requests) == 3 for t in targets.values())
    assert all(t.requests[0] == ("rm", None) for t in targets.values())


def test_sender_spreads_requests_over_the_interval() -> None:
    scheduler = ManualScheduler()
    sender = SERVICES.create_heartbeat_manager_sender(
        "rm", RecordingListener(), scheduler, scheduler.clock, spread=4
    )
    targets = [RecordingTarget() for _ in range(8)]
    for i, target in enumerate(targets):
        sender.monitor_target(f"e{i}", target)
    sender.start()
    scheduler.advance(0.0)
    assert sum(len(t.requests) for t in targets) == 2, "one slice of 8/4 targets per quarter interval"


def test_sender_failures_make_a_target_unreachable_without_a_timeout() -> None:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    sender = SERVICES.create_heartbeat_manager_sender("rm", listener, scheduler, scheduler.clock, spread=1)
    dead, alive = RecordingTarget(fail=True), RecordingTarget()
    sender.monitor_target("dead", dead)
    sender.monitor_target("alive", alive)
    sender.start()
    scheduler.advance(0.5)
    assert listener.unreachable == []
    scheduler.advance(1.0)
    assert listener.unreachable == ["dead"]
    assert listener.timeouts == []
    sender.receive_heartbeat("alive", "p")
    scheduler.advance(1.0)
    assert len(alive.requests) == 3
    assert listener.reported == [("alive", "p")]


def test_stopped_sender_requests_nothing() -> None:
    scheduler = ManualScheduler()
    sender = SERVICES.create_heartbeat_manager_sender("rm", RecordingListener(), scheduler, scheduler.clock)
    target = RecordingTarget()
    sender.monitor_target("e", target)
    sender.start()
    scheduler.advance(1.0)
    count = len(target.requests)
    sender.stop()
    scheduler.advance(5.0)
    assert len(target.requests) == count
    assert scheduler.pending() == 0
